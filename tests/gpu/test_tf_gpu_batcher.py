"""The shapes TF Serving's batcher makes (serving_config/batching_parameters.txt's allowed_batch_sizes, seq 32, real
lengths U[0,32]) on GPU:0: correct scores, and no CUDA graph captured after a warmup of every (batch size, token
bucket) pair. The encoder keys its graphs by (batch, token bucket, attention size class, weights); a bucket boundary
is a multiple of 16 tokens, so a batch of 16k tokens for each k reaches every bucket.

The test also counts what the model's own warmup file (assets.extra, one request per batch size, which TF Serving
replays at load) leaves to capture: the graphs those shapes capture when requests come."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from tf_gpu_testing import TOLERANCE, carried, gpu_only, graphs_captured, load_saved_model, max_abs, needs_device

import bertserve
from bertserve.export.saved import read_warmup_requests
from bertserve.export.samples import FIRST_ORDINARY_TOKEN
from bertserve.model_dir import OUTPUT_NAME, SIGNATURE_NAME, warmup_path
from bertserve.server.config_files import read_batching_options

pytestmark = [needs_device, gpu_only]

BATCHING_FILE = os.path.join(os.path.dirname(bertserve.__file__), "serving_config", "batching_parameters.txt")
CALLS_PER_SIZE = 100


def call(signature, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return signature(**{name: tf.constant(value) for name, value in inputs.items()})[OUTPUT_NAME].numpy()


def batch_of_tokens(batch: int, tokens: int, vocab_size: int) -> dict[str, np.ndarray]:
    """batch rows of seq 32 holding tokens real tokens in all, spread evenly."""
    lengths = np.full(batch, tokens // batch) + (np.arange(batch) < tokens % batch)
    mask = (np.arange(carried.SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    ids = np.random.default_rng(tokens).integers(FIRST_ORDINARY_TOKEN, vocab_size, mask.shape).astype(np.int32)
    return {"input_ids": ids * mask, "input_mask": mask, "segment_ids": np.zeros_like(mask)}


def batcher_calls(signature, pool, reference, sizes, seed: int) -> tuple[int, float]:
    """CALLS_PER_SIZE batches of each allowed size from random pool rows -> (graphs captured, worst score error)."""
    rng, before, worst = np.random.default_rng(seed), graphs_captured(), 0.0
    for size in sizes:
        for _ in range(CALLS_PER_SIZE):
            rows = rng.integers(0, len(pool["input_ids"]), size)
            worst = max(worst, max_abs(call(signature, carried.take(pool, rows)), reference[rows]))
    return graphs_captured() - before, worst


def test_batcher_shapes_capture_no_graph_after_warmup(tf_served, tf_pool):
    served = tf_served("chitchat", "fp16")
    sizes = read_batching_options(BATCHING_FILE).allowed_batch_sizes
    assert sizes, f"{BATCHING_FILE} lists no allowed_batch_sizes"
    loaded = load_saved_model(served.path)  # a fresh load: new weight buffers, so no graph of it exists yet
    signature = loaded.signatures[SIGNATURE_NAME]
    before = graphs_captured()
    requests = read_warmup_requests(warmup_path(served.path))
    for request in requests:
        signature(**{name: tf.constant(tf.make_ndarray(proto)) for name, proto in request.inputs.items()})
    by_file = graphs_captured() - before
    left_by_file, _ = batcher_calls(signature, tf_pool, served.reference, sizes, seed=1)
    before = graphs_captured()
    for size in sizes:
        for tokens in range(16, carried.SEQ * size + 1, 16):
            call(signature, batch_of_tokens(size, tokens, served.config.vocab_size))
    by_buckets = graphs_captured() - before
    captured, worst = batcher_calls(signature, tf_pool, served.reference, sizes, seed=2)
    print(f"allowed_batch_sizes {sizes}: the warmup file's {len(requests)} requests captured {by_file} graphs; "
          f"{CALLS_PER_SIZE} batches a size after it captured {left_by_file} more; the warmup of every token bucket "
          f"captured {by_buckets} more; {CALLS_PER_SIZE} batches a size after that captured {captured}; worst score "
          f"error vs float64 {worst:.3e}")
    assert captured == 0
    assert worst <= TOLERANCE["fp16"]
