"""What the TensorFlow GPU tests (tests/gpu/test_tf_gpu_*.py) compare with: written here on the CPU machine, carried
to the GPU machine, read there by the same module.

The folder holds:
- the real MiniLM-L6 ranker as fp16 safetensors and its config (bench/gpu/prepare_carry.py's files: its fp32 file is
  over what a device call carries), served as fused fp32 and fp16 alike from the fp16-rounded weights;
- for the random chit-chat model (6 x 768, ~260 MB in fp32) its seed alone, and a SHA-256 of every array so that
  the GPU machine can tell whether its NumPy regenerated the same weights;
- a pool of input rows (seq 32: every real length 0..32 once, then random lengths U[0,32]), from which the tests
  draw their batches by index: the ops are padding-free and rows independent, so a row's expected score is its pool
  row's at any batch size;
- for each model and precision, the float64 reference scores of the pool (bertserve.export.reference, on the weights
  the variant runs: fp16-rounded for fp16 and for MiniLM) and the CPU fused op's scores (the fused SavedModel
  exported here and run through tf.saved_model.load on CPU).

Usage, from the repository root: .venv/bin/python gpu_rig/reference.py [OUT_DIR (default .device_carry/reference)]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time

import numpy as np

from bertserve.export.samples import FIRST_ORDINARY_TOKEN
from bertserve.export.weights import CHITCHAT_CONFIG, BertConfig, BertWeights
from bertserve.model_dir import INPUT_NAMES, TokenizerSettings

DEFAULT_DIR = os.path.join(".device_carry", "reference")
SEQ = 32
POOL_RANDOM_ROWS = 223  # after the 33 rows of every length: 256 rows, whose float64 references take minutes here
POOL_SEED = 1
CHITCHAT_SEED = 0
MODELS = ("minilm", "chitchat")
PRECISIONS = ("fp32", "fp16")
POOL_FILE = "pool.npz"
SCORES_FILE = "scores.npz"
CHITCHAT_FILE = "chitchat.json"
MINILM_WEIGHTS_FILE = "minilm_l6_fp16.safetensors"
MINILM_CONFIG_FILE = "minilm_l6_config.json"
MODEL_NAME = "ranker"


def pool_inputs(vocab_size: int, seed: int = POOL_SEED) -> dict[str, np.ndarray]:
    """input_ids, input_mask, segment_ids [rows, SEQ]: every length 0..SEQ once, then U[0, SEQ] lengths; padded with
    zeros as clients pad, the second half of each row's real tokens segment 1 (a query, reply pair)."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([np.arange(SEQ + 1), rng.integers(0, SEQ + 1, POOL_RANDOM_ROWS)])
    positions = np.arange(SEQ)[None, :]
    mask = (positions < lengths[:, None]).astype(np.int32)
    ids = rng.integers(FIRST_ORDINARY_TOKEN, vocab_size, (len(lengths), SEQ)).astype(np.int32) * mask
    segments = (positions >= (lengths[:, None] + 1) // 2).astype(np.int32) * mask
    return dict(zip(INPUT_NAMES, (ids, mask, segments)))


def take(pool: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The batch of the given pool rows."""
    return {name: value[rows] for name, value in pool.items()}


def batch_rows(pool_size: int, batch: int, seed: int = 0) -> np.ndarray:
    """Pool row indices of a test batch: the rows of every length 0..SEQ first (up to batch), then random rows."""
    first = np.arange(min(batch, SEQ + 1))
    rest = np.random.default_rng([seed, batch]).integers(0, pool_size, batch - len(first))
    return np.concatenate([first, rest])


def checksums(weights: BertWeights) -> dict[str, str]:
    return {name: hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest() for name, value in weights.items()}


def chitchat_weights(folder: str | None = None) -> BertWeights:
    """The random chit-chat weights from their seed; with folder, checked against the checksums written there."""
    weights = BertWeights.random(CHITCHAT_CONFIG, seed=CHITCHAT_SEED)
    if folder is not None:
        with open(os.path.join(folder, CHITCHAT_FILE)) as f:
            expected = json.load(f)["sha256"]
        differ = [name for name, digest in checksums(weights).items() if expected[name] != digest]
        if differ:
            raise RuntimeError(f"BertWeights.random(seed={CHITCHAT_SEED}) gave other chit-chat weights here than where "
                               f"{folder} was written ({', '.join(differ)}): this NumPy's generator differs")
    return weights


def minilm_weights(folder: str) -> BertWeights:
    """The carried MiniLM ranker's fp16-rounded weights (float32 arrays)."""
    from safetensors.numpy import load_file

    with open(os.path.join(folder, MINILM_CONFIG_FILE)) as f:
        config = BertConfig(**json.load(f))
    return BertWeights(config, load_file(os.path.join(folder, MINILM_WEIGHTS_FILE)))


def rounded_to_fp16(weights: BertWeights) -> BertWeights:
    return BertWeights(weights.config, {k: v.astype(np.float16).astype(np.float32) for k, v in weights.items()})


def variant_weights(folder: str, model: str, precision: str) -> BertWeights:
    """What the fused variant of that model and precision runs (MiniLM is carried fp16-rounded)."""
    if model == "minilm":
        return minilm_weights(folder)
    weights = chitchat_weights(folder)
    return rounded_to_fp16(weights) if precision == "fp16" else weights


def export_fused(weights: BertWeights, precision: str, base: str) -> str:
    """The fused SavedModel of that precision as TF Serving loads it (export.saved.write_version, warmup requests at
    SEQ included), under base; returns its version folder."""
    from bertserve.export.graph import build_ranker_module
    from bertserve.export.saved import write_version

    vocab = os.path.join(base, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.writelines(f"[unused{i}]\n" for i in range(weights.config.vocab_size))
    module = build_ranker_module(weights, "fused", precision)
    return write_version(module, weights.config, base, MODEL_NAME, 1, TokenizerSettings(vocab, max_seq_length=SEQ),
                         overwrite=True)


def load_pool(folder: str) -> dict[str, np.ndarray]:
    with np.load(os.path.join(folder, POOL_FILE)) as f:
        return {name: f[name] for name in INPUT_NAMES}


def load_scores(folder: str) -> dict[str, np.ndarray]:
    """reference_{model}_{precision} (float64) and cpu_{model}_{precision} (the CPU op's float32) of every pool row."""
    with np.load(os.path.join(folder, SCORES_FILE)) as f:
        return {name: f[name] for name in f.files}


def cpu_op_scores(weights: BertWeights, precision: str, pool: dict[str, np.ndarray]) -> np.ndarray:
    """The pool's scores from the fused SavedModel exported here and loaded on CPU."""
    import tensorflow as tf

    from bertserve.model_dir import OUTPUT_NAME, SIGNATURE_NAME

    with tempfile.TemporaryDirectory() as base:
        path = export_fused(weights, precision, base)
        with tf.device("/CPU:0"):
            serve = tf.saved_model.load(path).signatures[SIGNATURE_NAME]
            return serve(**{name: tf.constant(value) for name, value in pool.items()})[OUTPUT_NAME].numpy()


def write(out: str) -> None:
    from bertserve.bench.gpu.prepare_carry import save_minilm_fp16
    from bertserve.export import reference

    os.makedirs(out, exist_ok=True)
    minilm = save_minilm_fp16(out)
    chitchat = chitchat_weights()
    with open(os.path.join(out, CHITCHAT_FILE), "w") as f:
        json.dump({"config": dataclasses.asdict(CHITCHAT_CONFIG), "seed": CHITCHAT_SEED,
                   "sha256": checksums(chitchat)}, f, indent=1)
    pool = pool_inputs(min(minilm.config.vocab_size, chitchat.config.vocab_size))
    np.savez(os.path.join(out, POOL_FILE), **pool)
    scores = {}
    for model in MODELS:
        for precision in PRECISIONS:
            weights = minilm if model == "minilm" else (rounded_to_fp16(chitchat) if precision == "fp16" else chitchat)
            t0 = time.time()
            if model == "minilm" and precision == "fp16":  # the same weights as fp32's
                scores[f"reference_{model}_{precision}"] = scores[f"reference_{model}_fp32"]
            else:
                scores[f"reference_{model}_{precision}"] = reference.scores(
                    weights, pool["input_ids"], pool["input_mask"], pool["segment_ids"])
            t1 = time.time()
            scores[f"cpu_{model}_{precision}"] = cpu_op_scores(weights, precision, pool)
            error = np.abs(scores[f"cpu_{model}_{precision}"] - scores[f"reference_{model}_{precision}"]).max()
            print(f"{model} {precision}: float64 reference {t1 - t0:.0f} s, CPU op {time.time() - t1:.0f} s, "
                  f"CPU op vs float64 max abs {error:.2e}", flush=True)
    np.savez(os.path.join(out, SCORES_FILE), **scores)
    sizes = {name: os.path.getsize(os.path.join(out, name)) for name in sorted(os.listdir(out))}
    print(f"wrote {out}: {len(pool['input_ids'])} pool rows; " +
          ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in sizes.items()))


def main(argv: list[str]) -> int:
    write(argv[0] if argv else DEFAULT_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
