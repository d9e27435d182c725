"""Concurrency on the test device, as TF Serving's batch threads call a model: 8 threads on one signature give the
single-threaded scores bit for bit; 10,000 calls of random shapes level off in GPU memory with the graph cache within
its bound; 20 load/unload cycles return GPU memory to its baseline."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tensorflow as tf
from tf_gpu_testing import (TOLERANCE, VARIANTS, carried, device_bytes_in_use, gpu_only, graphs_captured, graphs_held,
                            load_saved_model, max_abs, max_graphs_per_stream, most_graphs_held_per_stream,
                            needs_device, on_gpu, pinned_staging_bytes, run_threads, tf_bytes_in_use)

from bertserve.model_dir import OUTPUT_NAME, SIGNATURE_NAME

pytestmark = needs_device

THREAD_BATCHES = (1, 2, 7, 8, 16, 32, 33, 64)  # one batch size a thread
RANDOM_CALLS, SAMPLE_EVERY, MAX_RANDOM_BATCH = 10_000, 500, 1024
MIB = 1 << 20


@pytest.mark.parametrize("variant", VARIANTS)
def test_eight_threads_equal_single_threaded_bit_for_bit(tf_served, tf_pool, variant):
    served = tf_served(*variant)
    pool_size = len(tf_pool["input_ids"])
    batches = [carried.take(tf_pool, carried.batch_rows(pool_size, b, seed=7)) for b in THREAD_BATCHES]
    alone = [served.scores(inputs) for inputs in batches]
    repeats = 50 if on_gpu() else 2
    differing = [0] * len(batches)

    def work(index: int) -> None:
        for _ in range(repeats):
            differing[index] += not np.array_equal(served.scores(batches[index]), alone[index])

    run_threads(work, len(batches))
    errors = max(max_abs(s, served.reference[carried.batch_rows(pool_size, b, seed=7)])
                 for s, b in zip(alone, THREAD_BATCHES))
    print(f"{served.model} {served.precision}: {len(batches)} threads x {repeats} calls (batches {THREAD_BATCHES}): "
          f"{sum(differing)} calls differ from single-threaded; single-threaded max abs vs float64 {errors:.3e}")
    assert sum(differing) == 0


def memory_sample(calls: int) -> dict[str, int]:
    return {"calls": calls, "tf_bytes": tf_bytes_in_use(), "device_bytes": device_bytes_in_use(),
            "graphs_held": graphs_held(), "graphs_captured": graphs_captured(), "pinned_bytes": pinned_staging_bytes()}


@gpu_only
def test_random_shapes_level_off_in_memory_and_graphs(tf_served, tf_pool):
    """Batches of 1..MAX_RANDOM_BATCH pool rows (lengths U[0,32]) make a few thousand (batch, token bucket) keys, more than the
    graph cache keeps, so it starts over several times. The first call is the largest shape, so the arena is as
    large as it gets from the start: TensorFlow's bytes in use must then stay where they were, the device's (graphs
    included, which the cache drops when it starts over) must not grow past what the first half reached, and no
    stream may ever hold more graphs than the bound."""
    served = tf_served("chitchat", "fp16")
    pool_size = len(tf_pool["input_ids"])
    rng = np.random.default_rng(11)
    full = np.flatnonzero(tf_pool["input_mask"].sum(axis=1) == carried.SEQ)
    served.scores(carried.take(tf_pool, np.resize(full, MAX_RANDOM_BATCH)))
    gc.collect()  # models other tests dropped go now, not during the samples
    captured_before = graphs_captured()
    samples, worst = [memory_sample(0)], 0.0
    for call in range(1, RANDOM_CALLS + 1):
        rows = rng.integers(0, pool_size, rng.integers(1, MAX_RANDOM_BATCH + 1))
        worst = max(worst, max_abs(served.scores(carried.take(tf_pool, rows)), served.reference[rows]))
        if call % SAMPLE_EVERY == 0:
            samples.append(memory_sample(call))
    captured = graphs_captured() - captured_before
    bound = max_graphs_per_stream()
    for s in samples:
        print(f"after {s['calls']:>6} calls: TF {s['tf_bytes'] / MIB:9.1f} MiB, device {s['device_bytes'] / MIB:9.1f}"
              f" MiB, graphs held {s['graphs_held']}, captured {s['graphs_captured'] - captured_before}, pinned staging"
              f" {s['pinned_bytes'] / MIB:.2f} MiB")
    first, second = samples[: len(samples) // 2 + 1], samples[len(samples) // 2 + 1:]
    device_growth = max(s["device_bytes"] for s in second) - max(s["device_bytes"] for s in first)
    tf_growth = max(s["tf_bytes"] for s in samples) - samples[0]["tf_bytes"]
    print(f"{RANDOM_CALLS} calls: {captured} graphs captured, most held by a stream {most_graphs_held_per_stream()} "
          f"(bound {bound}); TF bytes at most {tf_growth / MIB:.2f} MiB over the first sample; device bytes of the "
          f"second half over the first half's {device_growth / MIB:.1f} MiB; worst score error vs float64 {worst:.3e}")
    assert captured > bound, "the shapes did not make the cache start over: the bound went unexercised"
    assert most_graphs_held_per_stream() <= bound
    assert tf_growth <= MIB and device_growth <= 64 * MIB
    # Sequential calls reuse one staging buffer: it is as large as the first (largest) call needs from the start.
    assert max(s["pinned_bytes"] for s in samples) == samples[0]["pinned_bytes"]
    assert worst <= TOLERANCE["fp16"]


@gpu_only
def test_load_unload_cycles_return_memory_to_baseline(tf_served, tf_pool):
    path = tf_served("minilm", "fp16").path  # the smaller model: 20 loads fit a device call
    pool_size = len(tf_pool["input_ids"])
    batches = [carried.take(tf_pool, carried.batch_rows(pool_size, b)) for b in (1, 33, 512)]
    gc.collect()
    baseline = memory_sample(0)
    after = []
    for cycle in range(1, 21):
        loaded = load_saved_model(path)
        for inputs in batches:
            loaded.signatures[SIGNATURE_NAME](**{k: tf.constant(v) for k, v in inputs.items()})[OUTPUT_NAME].numpy()
        del loaded
        gc.collect()
        after.append(memory_sample(cycle))
    for s in [baseline] + after:
        print(f"after cycle {s['calls']:>2}: TF {s['tf_bytes'] / MIB:9.1f} MiB, device {s['device_bytes'] / MIB:9.1f} "
              f"MiB, graphs held {s['graphs_held']}, pinned staging {s['pinned_bytes'] / MIB:.2f} MiB")
    tf_left = after[-1]["tf_bytes"] - baseline["tf_bytes"]
    device_left = after[-1]["device_bytes"] - baseline["device_bytes"]
    print(f"20 cycles: TF bytes {tf_left / MIB:+.2f} MiB from baseline, device {device_left / MIB:+.1f} MiB, graphs "
          f"held {after[-1]['graphs_held'] - baseline['graphs_held']:+d}")
    assert after[-1]["graphs_held"] == baseline["graphs_held"]
    assert after[-1]["pinned_bytes"] == baseline["pinned_bytes"]  # each unload frees its kernels' staging pools
    assert tf_left <= MIB and device_left <= 64 * MIB
