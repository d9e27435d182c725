"""A warmup file (TF Serving's assets.extra/tf_serving_warmup_requests) that runs every batch shape the GPU op can
meet while serving once at load time, so that no CUDA graph is captured under load.

The TF GPU encoder replays one CUDA graph per (rows, token bucket): rows is the padded batch size (the batcher pads
to an allowed_batch_sizes entry with copies of the first row), the bucket is the batch's real token count rounded
up by the core's TokenBucket. A batch of B rows whose pairs have lengths in [lo, hi] holds between B*lo and B*hi
real tokens, so warming every allowed size with one request per bucket in that range covers all of them. The
default warmup (export/saved.py: a few batch sizes at mixed lengths) covers neither. Records go from small to large,
so that the arena the graphs share grows a few times and early graphs keep theirs (graph_cache.h).

`bertserve export --warmup_batching_parameters FILE [--warmup_lengths LO,HI]` writes it; the GPU serving benchmark
and the harness replay use the same shapes.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from bertserve.server.warmup import MAX_WARMUP_RECORDS


def token_bucket(tokens: int) -> int:
    """custom_ops/kernels/cuda/encoder.cu TokenBucket: multiples of 16 up to 256, then 16 steps per power of two."""
    if tokens <= 256:
        return max(16, (tokens + 15) // 16 * 16)
    step = 1
    while (step << 5) <= tokens:
        step <<= 1
    return (tokens + step - 1) // step * step


def bucket_shapes(batch_sizes: Sequence[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """(batch size, a token count) for every (size, bucket) pair reachable with pair lengths in [lo, hi]; the
    token count is the largest of its bucket in range, so that one request stands for the whole bucket."""
    if not batch_sizes:
        raise ValueError("warming every token bucket needs allowed_batch_sizes: without them any size can run")
    if not 1 <= lo <= hi:
        raise ValueError(f"pair lengths must satisfy 1 <= lo <= hi, got {lo}..{hi}")
    shapes = []
    for size in sorted(batch_sizes):
        representative: dict[int, int] = {}
        for tokens in range(size * lo, size * hi + 1):
            representative[token_bucket(tokens)] = tokens
        shapes += [(size, tokens) for _, tokens in sorted(representative.items())]
    if len(shapes) > MAX_WARMUP_RECORDS:
        raise ValueError(f"{len(shapes)} (batch size, token bucket) pairs for sizes {list(batch_sizes)} and lengths "
                         f"{lo}..{hi}: over TF Serving's {MAX_WARMUP_RECORDS} warmup records")
    return shapes


def lengths_summing_to(size: int, tokens: int) -> np.ndarray:
    """size pair lengths, as even as possible, adding up to tokens."""
    base, extra = divmod(tokens, size)
    return np.array([base + 1] * extra + [base] * (size - extra), dtype=np.int32)


def bucket_lengths(batch_sizes: Sequence[int], lo: int, hi: int) -> Iterator[np.ndarray]:
    """The real lengths of each warmup request's rows, one request per bucket_shapes entry."""
    for size, tokens in bucket_shapes(batch_sizes, lo, hi):
        yield lengths_summing_to(size, tokens)
