"""`bertserve export --warmup_batching_parameters`: the warmup file holds one request per (allowed batch size, token
bucket) that batches of the clients' pair lengths can reach, padded as TF Serving pads (copies of the first row),
so that the GPU op captures every CUDA graph at load time; and its flags' errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bertserve.export import cli
from bertserve.export.bucket_warmup import bucket_shapes, token_bucket
from bertserve.export.saved import BucketWarmup, read_warmup_requests, warmup_batches, write_warmup_requests
from bertserve.loadtest.loadgen import RequestShape, synthetic_batch
from bertserve.model_dir import warmup_path

from export_testing import TINY_CONFIG

ALLOWED = (32, 64)
SHAPE = RequestShape(replies_per_query=16, max_len=32, lengths=tuple(range(10, 33)))


def _warmed(path: str, max_len: int) -> list[tuple[int, int]]:
    """(rows, token bucket) of each warmup request."""
    warmed = []
    for request in read_warmup_requests(path):
        mask = np.frombuffer(request.inputs["input_mask"].tensor_content, np.int32).reshape(-1, max_len)
        warmed.append((mask.shape[0], token_bucket(int(mask.sum()))))
    return warmed


def test_token_bucket_follows_the_cores_rule():
    """Multiples of 16 up to 256, then 16 steps per power of two (encoder.cu TokenBucket; the GPU replay checks the
    mirror against the library itself)."""
    assert [token_bucket(t) for t in (1, 16, 17, 256, 257, 272, 273, 511, 512, 513, 1000, 8192)] == \
           [16, 16, 32, 256, 272, 272, 288, 512, 512, 544, 1024, 8192]


def test_warmup_covers_every_padded_batch_of_the_load(tmp_path):
    path = str(tmp_path / "tf_serving_warmup_requests")
    count = write_warmup_requests(path, "ranker", warmup_batches(TINY_CONFIG, SHAPE.max_len,
                                                                 BucketWarmup(ALLOWED, 10, 32)))
    warmed = _warmed(path, SHAPE.max_len)
    assert count == len(set(warmed)) == len(warmed) == len(bucket_shapes(ALLOWED, 10, 32))
    assert warmed == sorted(warmed)  # small to large: the shared arena grows a few times only

    rng = np.random.default_rng(0)
    for _ in range(300):  # batches of 1..4 queries, padded to the next allowed size with copies of row 0
        queries = [synthetic_batch(SHAPE, rng) for _ in range(rng.integers(1, 5))]
        lengths = np.concatenate([q.input_mask.sum(1) for q in queries])
        size = next(a for a in ALLOWED if a >= len(lengths))
        tokens = int(lengths.sum() + (size - len(lengths)) * lengths[0])
        assert (size, token_bucket(tokens)) in warmed



def _export(capsys, google_dir: str, out: str, *flags: str) -> tuple[int, str]:
    code = cli.main([google_dir, out, "--model", "ranker", "--version", "1", "--variant", "stock",
                     "--max_seq_length", "16", *flags])
    return code, capsys.readouterr().err


def test_export_warms_the_served_batch_sizes(capsys, tmp_path, google_dir):
    batching = tmp_path / "batching_parameters.txt"
    batching.write_text("max_batch_size { value: 8 } allowed_batch_sizes: 4 allowed_batch_sizes: 8")
    code, err = _export(capsys, google_dir, str(tmp_path / "models"),
                        f"--warmup_batching_parameters={batching}", "--warmup_lengths=3,12")
    assert code == 0, err
    warmed = _warmed(warmup_path(str(tmp_path / "models" / "ranker" / "1")), 16)
    assert sorted(set(warmed)) == sorted({(size, token_bucket(tokens)) for size in (4, 8)
                                          for tokens in range(size * 3, size * 12 + 1)})

    code, err = _export(capsys, google_dir, str(tmp_path / "default"))  # without the flag: a few batch sizes
    assert code == 0, err
    assert [rows for rows, _ in _warmed(warmup_path(str(tmp_path / "default" / "ranker" / "1")), 16)] == \
           [1, 8, 16, 32, 64]


@pytest.mark.parametrize("batching, flags, message", [
    ("max_batch_size { value: 8 }", [], "sets no allowed_batch_sizes"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 4", [], "must equal max_batch_size"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 8", ["--warmup_lengths=3,17"], "exceed max_seq_length 16"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 8", ["--warmup_lengths=0,5"], "1 <= lo <= hi"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 8", ["--warmup_lengths=five"], "two integers"),
    ("max_batch_siz { value: 8 }", [], "Invalid protobuf file"),
])
def test_warmup_flags_errors_name_the_problem(capsys, tmp_path, google_dir, batching, flags, message):
    path = tmp_path / "batching_parameters.txt"
    path.write_text(batching)
    code, err = _export(capsys, google_dir, str(tmp_path / "models"), f"--warmup_batching_parameters={path}", *flags)
    assert code == 2 and message in err, err
    assert not os.path.exists(tmp_path / "models" / "ranker" / "1")


def test_warmup_lengths_need_the_batching_file(capsys, tmp_path, google_dir):
    code, err = _export(capsys, google_dir, str(tmp_path / "models"), "--warmup_lengths=3,12")
    assert code == 2 and "--warmup_lengths needs --warmup_batching_parameters" in err
