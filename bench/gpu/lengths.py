"""The row lengths the GPU benchmarks time, in a module without torch, so that the TensorFlow-side scripts draw the
same lengths as the harness (torch and TensorFlow each bring their own CUDA libraries into a process)."""

from __future__ import annotations

import numpy as np

SEQ = 32


def lengths_for(dist: str, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Row lengths: "all32" (every row SEQ tokens) or U[8, SEQ]."""
    if dist == "all32":
        return np.full(batch, SEQ, dtype=np.int32)
    return rng.integers(8, SEQ + 1, batch).astype(np.int32)
