"""Open-loop replay of ranker traffic onto the CUDA core through TF Serving's batching policy.

Queries arrive as a Poisson process; each carries K (query, reply) pairs padded to one sequence length, as the
client sends them. The batcher follows BasicBatchScheduler with one batch thread (the GPU): a task (one query,
K rows) joins the open batch unless that would exceed max_batch_size; a batch closes when full or when
batch_timeout_micros have passed since its first task arrived; a closed batch is padded up to the next
allowed_batch_sizes entry (padding rows have no real token, or copy the first row as TF Serving's do) and run as
one forward: a replay of the ranker's CUDA graph (autotuned plans), or eager launches over the token count rounded
up to the core's TokenBucket, planned without autotuning, as the TF GPU kernel ran until it replayed graphs of its
own (BucketedEncoder, with untuned plans: encoder_graphs.py times that path).
Latency is completion minus arrival, so it includes queueing, batching delay and the GPU time, as a client would
see it.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np
import torch

from bertserve.bench.gpu.core import CudaRanker


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """The fields of TF Serving's batching_parameters.txt that shape a batch."""
    max_batch_size: int = 256
    batch_timeout_micros: int = 1000
    allowed_batch_sizes: tuple[int, ...] = (32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class Traffic:
    qps: float
    replies_per_query: int = 32
    seconds: float = 3.0
    min_len: int = 8
    max_len: int = 32
    lengths: tuple[int, ...] = ()  # pair lengths to draw from (the load generator's distribution); empty: U[min, max]
    pad_with_first_row: bool = False  # pad as TF Serving's batcher does (copies of row 0); off: rows of no token


def _padded_size(rows: int, allowed: tuple[int, ...]) -> int:
    return next(a for a in allowed if a >= rows)


def replay(ranker: CudaRanker, params: BatchingParameters, traffic: Traffic, seed: int, graphs: bool = True) -> dict:
    """Runs the traffic in real time on the GPU, each batch as a graph replay or (graphs off) eager launches over
    the token bucket; returns latency percentiles (ms) and achieved rates."""
    forward = ranker.forward_graph if graphs else functools.partial(ranker.forward, bucketed=True)
    rng = np.random.default_rng(seed)
    n = max(1, int(traffic.qps * traffic.seconds))
    arrivals = np.cumsum(rng.exponential(1.0 / traffic.qps, n))
    k, seq = traffic.replies_per_query, ranker.seq
    lengths = (rng.choice(np.asarray(traffic.lengths), (n, k)) if traffic.lengths
               else rng.integers(traffic.min_len, traffic.max_len + 1, (n, k))).astype(np.int32)
    vocab = ranker.weights["word_embeddings"].shape[0]
    pool = torch.randint(1000, vocab, (params.max_batch_size, seq), dtype=torch.int32, device="cuda")
    segments = torch.zeros_like(pool)
    done = np.zeros(n)
    batches, padded_rows = 0, 0
    start = time.perf_counter()
    i = 0  # next query not yet in a batch
    while i < n:
        now = time.perf_counter() - start
        if arrivals[i] > now:
            time.sleep(arrivals[i] - now)
            now = arrivals[i]
        # The batch that starts at query i closes when full or at arrivals[i] + timeout, whichever is first.
        deadline = arrivals[i] + params.batch_timeout_micros * 1e-6
        j = i + 1
        while True:
            # Tasks that arrived before the batch closed join it while they fit.
            while j < n and (j - i + 1) * k <= params.max_batch_size and arrivals[j] <= min(now, deadline):
                j += 1
            cannot_grow = (j - i + 1) * k > params.max_batch_size
            full = cannot_grow and ((j - i) * k == params.max_batch_size or (j < n and arrivals[j] <= now))
            if full or now >= deadline or j == n:
                break
            wake = min(deadline, arrivals[j]) if j < n else deadline
            time.sleep(max(0.0, wake - now))
            now = max(wake, time.perf_counter() - start)
        rows = (j - i) * k
        size = _padded_size(rows, params.allowed_batch_sizes)
        lens = np.zeros(size, dtype=np.int32)
        lens[:rows] = lengths[i:j].reshape(-1)
        if traffic.pad_with_first_row:
            lens[rows:] = lens[0]
        forward(pool[:size], segments[:size], lens)
        torch.cuda.synchronize()
        done[i:j] = time.perf_counter() - start
        batches += 1
        padded_rows += size
        i = j
    latency_ms = (done - arrivals) * 1e3
    wall = done[-1] - arrivals[0]
    return {
        "launch": "graph" if graphs else "eager", "offered_qps": traffic.qps,
        "achieved_qps": round(float(n / wall), 1), "queries": n,
        "sequences_per_s": int(round(n * k / wall)), "batches": batches,
        "mean_rows_per_batch": round(n * k / batches, 1),
        "padded_rows_per_batch": round(padded_rows / batches, 1),
        "p50_ms": round(float(np.percentile(latency_ms, 50)), 3),
        "p90_ms": round(float(np.percentile(latency_ms, 90)), 3),
        "p99_ms": round(float(np.percentile(latency_ms, 99)), 3),
        "max_ms": round(float(latency_ms.max()), 3),
    }
