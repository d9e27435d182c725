"""The batch shapes the GPU op can meet while serving, and a warmup file (TF Serving's
assets.extra/tf_serving_warmup_requests) that runs each of them once, so that no CUDA graph is captured under load.

The TF GPU encoder replays one CUDA graph per (rows, token bucket): rows is the padded batch size (the batcher pads
to an allowed_batch_sizes entry with copies of the first row), the bucket is the batch's real token count rounded
up by the core's TokenBucket. A batch of B rows whose pairs have lengths in [lo, hi] holds between B*lo and B*hi
real tokens, so warming every allowed size with one request per bucket in that range covers all of them. The
export's own warmup file (a few batch sizes at one mixed length each) covers neither. Records go from small to
large, so that the arena the graphs share grows a few times and early graphs keep theirs (graph_cache.h).
The harness replay (replay_ceiling.py) captures its graphs for the same shapes; it runs without TensorFlow, so
TensorFlow is imported by the warmup writer alone.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


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
    shapes = []
    for size in sorted(batch_sizes):
        representative: dict[int, int] = {}
        for tokens in range(size * lo, size * hi + 1):
            representative[token_bucket(tokens)] = tokens
        shapes += [(size, tokens) for _, tokens in sorted(representative.items())]
    return shapes


def lengths_summing_to(size: int, tokens: int) -> np.ndarray:
    """size pair lengths, as even as possible, adding up to tokens."""
    base, extra = divmod(tokens, size)
    return np.array([base + 1] * extra + [base] * (size - extra), dtype=np.int32)


def write_bucket_warmup(path: str, model: str, shape, batch_sizes: Sequence[int], lo: int, hi: int,
                        seed: int = 0) -> int:
    """Writes the warmup file to path (replacing one there) for requests of `shape` (a loadgen.RequestShape: the
    vocabulary and special ids); returns its number of records."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    from bertserve.client.protocol import ModelSpec, grpc_request
    from bertserve.loadtest.loadgen import batch_of_lengths
    from bertserve.server.warmup import MAX_WARMUP_RECORDS

    if not batch_sizes:
        raise ValueError("warming every token bucket needs allowed_batch_sizes: without them any size can run")
    shapes = bucket_shapes(batch_sizes, lo, hi)
    if len(shapes) > MAX_WARMUP_RECORDS:
        raise ValueError(f"{len(shapes)} (batch size, token bucket) pairs for sizes {list(batch_sizes)} and lengths "
                         f"{lo}..{hi}: over TF Serving's {MAX_WARMUP_RECORDS} warmup records")
    rng = np.random.default_rng(seed)
    spec = ModelSpec(model)
    with tf.io.TFRecordWriter(path) as writer:
        for size, tokens in shapes:
            request = grpc_request(batch_of_lengths(shape, lengths_summing_to(size, tokens), rng), spec)
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return len(shapes)
