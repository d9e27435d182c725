"""BatchingParameters semantics of the batcher, run in-process on a real SavedModel signature."""

from __future__ import annotations

import os
import threading
import time

import grpc
import numpy as np
import pytest

from bertserve.server.batcher import BatchScheduler, wait_for
from bertserve.server.config_files import BatchingOptions
from bertserve.server.errors import ServingError
from bertserve.server.metrics import ServerMetrics
from bertserve.server.servable import LoadedVersion
from tiny_models import token_inputs


@pytest.fixture(scope="module")
def signature(models_dir):
    return LoadedVersion("tiny", 1, os.path.join(models_dir, "tiny", "1"), {"serve"}).signature("serving_default")


class RecordingRun:
    """Calls the real signature; remembers each merged batch and can hold batches at a gate."""

    def __init__(self, signature, gated: bool = False):
        self.signature, self.batches = signature, []
        self.gate, self.entered = threading.Event(), threading.Event()
        if not gated:
            self.gate.set()

    def __call__(self, inputs):
        self.batches.append({name: value.copy() for name, value in inputs.items()})
        self.entered.set()
        self.gate.wait(30)
        return self.signature.run(inputs)


@pytest.fixture
def make_queue():
    schedulers = []

    def make(run, **fields):
        options = BatchingOptions(**{"num_batch_threads": 1, **fields})
        scheduler = BatchScheduler(options.num_batch_threads, "test_batch_threads")
        schedulers.append(scheduler)
        return scheduler.add_queue(options, run, "tiny", "serving_default", ServerMetrics())

    yield make
    for scheduler in schedulers:
        scheduler.stop()


def _rows(inputs, start, stop):
    return {name: value[start:stop] for name, value in inputs.items()}


def _submit_all(queue, parts):
    return [queue.submit(part, len(part["input_ids"]), None) for part in parts]


def test_batch_is_padded_up_to_an_allowed_size_and_padding_dropped(signature, make_queue):
    run = RecordingRun(signature)
    queue = make_queue(run, max_batch_size=8, allowed_batch_sizes=(4, 8), batch_timeout_micros=200_000)
    inputs = token_inputs(3, 8, seed=5)
    pending = _submit_all(queue, [_rows(inputs, i, i + 1) for i in range(3)])
    scores = np.concatenate([wait_for(tasks, None)["scores"] for tasks in pending])
    assert [len(b["input_ids"]) for b in run.batches] == [4]
    np.testing.assert_array_equal(run.batches[0]["input_ids"][3], inputs["input_ids"][0])  # pad = first row
    np.testing.assert_allclose(scores, signature.run(inputs)["scores"], atol=1e-5)


def test_large_request_is_split_into_execution_batches(signature, make_queue):
    run = RecordingRun(signature)
    queue = make_queue(run, max_batch_size=16, enable_large_batch_splitting=True, max_execution_batch_size=4)
    inputs = token_inputs(10, 8, seed=6)
    outputs = wait_for(queue.submit(inputs, 10, None), None)
    assert sorted(len(b["input_ids"]) for b in run.batches) == [2, 4, 4]
    np.testing.assert_allclose(outputs["scores"], signature.run(inputs)["scores"], atol=1e-5)


def test_request_larger_than_max_batch_size_is_refused_without_splitting(signature, make_queue):
    queue = make_queue(RecordingRun(signature), max_batch_size=4)
    with pytest.raises(ServingError) as info:
        queue.submit(token_inputs(5, 8), 5, None)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "larger than maximum" in info.value.message


def test_pad_variable_length_inputs_pads_with_the_first_element(signature, make_queue):
    run = RecordingRun(signature)
    queue = make_queue(run, max_batch_size=8, batch_timeout_micros=200_000, pad_variable_length_inputs=True)
    short, long = token_inputs(1, 6, seed=1), token_inputs(1, 8, seed=2)
    pending = _submit_all(queue, [short, long])
    long_scores = wait_for(pending[1], None)["scores"]
    wait_for(pending[0], None)
    assert [b["input_ids"].shape for b in run.batches] == [(2, 8)]
    merged = run.batches[0]
    for name in ("input_ids", "input_mask"):
        np.testing.assert_array_equal(merged[name][0, 6:], short[name].flat[0])
    np.testing.assert_allclose(long_scores, signature.run(long)["scores"], atol=1e-5)


def test_different_lengths_without_padding_run_apart_and_both_succeed(signature, make_queue):
    run = RecordingRun(signature)
    queue = make_queue(run, max_batch_size=8, batch_timeout_micros=100_000)
    short, long = token_inputs(2, 6, seed=1), token_inputs(2, 8, seed=2)
    pending = _submit_all(queue, [short, long])
    np.testing.assert_allclose(wait_for(pending[0], None)["scores"], signature.run(short)["scores"], atol=1e-5)
    np.testing.assert_allclose(wait_for(pending[1], None)["scores"], signature.run(long)["scores"], atol=1e-5)
    assert sorted(b["input_ids"].shape[1] for b in run.batches) == [6, 8]


def test_full_queue_refuses_with_unavailable_and_queued_requests_still_run(signature, make_queue):
    run = RecordingRun(signature, gated=True)
    queue = make_queue(run, max_batch_size=1, max_enqueued_batches=2)
    rows = token_inputs(4, 8, seed=3)
    first = queue.submit(_rows(rows, 0, 1), 1, None)
    assert run.entered.wait(10)  # the only batch thread is busy with the first request
    queued = [queue.submit(_rows(rows, i, i + 1), 1, None) for i in (1, 2)]
    with pytest.raises(ServingError) as info:
        queue.submit(_rows(rows, 3, 4), 1, None)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    run.gate.set()
    for tasks in [first, *queued]:
        assert wait_for(tasks, None)["scores"].shape == (1,)


def test_request_whose_deadline_passed_in_the_queue_is_dropped(signature, make_queue):
    run = RecordingRun(signature, gated=True)
    queue = make_queue(run, max_batch_size=1, max_enqueued_batches=4)
    rows = token_inputs(2, 8, seed=4)
    blocker = queue.submit(_rows(rows, 0, 1), 1, None)
    assert run.entered.wait(10)
    late = queue.submit(_rows(rows, 1, 2), 1, time.monotonic() + 0.05)
    time.sleep(0.1)
    run.gate.set()
    wait_for(blocker, None)
    assert late[0].done.wait(10)
    assert late[0].error is not None and late[0].error.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(run.batches) == 1  # the expired request never reached the model
