"""The GPU warmup file (bench/gpu/token_buckets.py) holds one request per (allowed batch size, token bucket) that
batches of the load's pair lengths can reach, padded as TF Serving pads (copies of the first row)."""

from __future__ import annotations

import numpy as np

from bertserve.bench.gpu.token_buckets import bucket_shapes, token_bucket, write_bucket_warmup
from bertserve.export.saved import read_warmup_requests
from bertserve.loadtest.loadgen import RequestShape, synthetic_batch

ALLOWED = (32, 64)
SHAPE = RequestShape(replies_per_query=16, max_len=32, lengths=tuple(range(10, 33)))


def test_token_bucket_follows_the_cores_rule():
    """Multiples of 16 up to 256, then 16 steps per power of two (encoder.cu TokenBucket; the GPU replay checks the
    mirror against the library itself)."""
    assert [token_bucket(t) for t in (1, 16, 17, 256, 257, 272, 273, 511, 512, 513, 1000, 8192)] == \
           [16, 16, 32, 256, 272, 272, 288, 512, 512, 544, 1024, 8192]


def test_warmup_covers_every_padded_batch_of_the_load(tmp_path):
    path = str(tmp_path / "tf_serving_warmup_requests")
    count = write_bucket_warmup(path, "ranker", SHAPE, ALLOWED, 10, 32)
    warmed = set()
    for request in read_warmup_requests(path):
        mask = np.frombuffer(request.inputs["input_mask"].tensor_content, np.int32).reshape(-1, SHAPE.max_len)
        warmed.add((mask.shape[0], token_bucket(int(mask.sum()))))
    assert count == len(warmed) == len(bucket_shapes(ALLOWED, 10, 32))

    rng = np.random.default_rng(0)
    for _ in range(300):  # batches of 1..4 queries, padded to the next allowed size with copies of row 0
        queries = [synthetic_batch(SHAPE, rng) for _ in range(rng.integers(1, 5))]
        lengths = np.concatenate([q.input_mask.sum(1) for q in queries])
        size = next(a for a in ALLOWED if a >= len(lengths))
        tokens = int(lengths.sum() + (size - len(lengths)) * lengths[0])
        assert (size, token_bucket(tokens)) in warmed
