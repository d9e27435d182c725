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
def make_queue(signature):
    schedulers = []

    def make(run, **fields):
        options = BatchingOptions(**{"num_batch_threads": 1, **fields})
        scheduler = BatchScheduler(options.num_batch_threads, "test_batch_threads")
        schedulers.append(scheduler)
        return scheduler.add_queue(options, run, signature.tensor_names, "tiny", "serving_default", ServerMetrics())

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


@pytest.mark.parametrize("splitting", [False, True])
def test_request_of_another_length_fails_alone_and_the_batch_it_met_runs(signature, make_queue, splitting):
    """TF Serving fails a merge of different trailing shapes; here only the request that would merge fails."""
    run = RecordingRun(signature)
    queue = make_queue(run, max_batch_size=8, batch_timeout_micros=200_000,
                       enable_large_batch_splitting=splitting, max_execution_batch_size=4)
    short, long = token_inputs(2, 6, seed=1), token_inputs(3, 8, seed=2)
    pending = queue.submit(short, 2, None)
    with pytest.raises(ServingError) as info:
        queue.submit(long, 3, None)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.message.startswith(
        "Tensors with name 'serving_default_input_ids:0' from different tasks have different shapes and padding is "
        "turned off. Set pad_variable_length_inputs to true, or ensure that all tensors with the same name have "
        "equal dimensions starting with the first dim.")
    assert "Input 'input_ids' of this request has shape [3, 8]; the batch it would join has shape [2, 6]" in (
        info.value.message)
    np.testing.assert_allclose(wait_for(pending, None)["scores"], signature.run(short)["scores"], atol=1e-5)
    assert [b["input_ids"].shape for b in run.batches] == [(2, 6)]


def test_request_of_another_length_that_meets_no_open_batch_runs(signature, make_queue):
    """A full open batch or an empty queue: the request starts its own batch, as in TF Serving, and succeeds."""
    run = RecordingRun(signature, gated=True)
    queue = make_queue(run, max_batch_size=2, max_enqueued_batches=4)
    running, full, newcomer, mismatched = (token_inputs(2, 8, seed=1), token_inputs(2, 6, seed=2),
                                           token_inputs(1, 8, seed=3), token_inputs(1, 6, seed=4))
    pending = [queue.submit(running, 2, None)]
    assert run.entered.wait(10)  # the only batch thread is busy: what follows stays queued
    pending += [queue.submit(full, 2, None), queue.submit(newcomer, 1, None)]
    with pytest.raises(ServingError) as info:  # the open batch (seq 8) has room for it
        queue.submit(mismatched, 1, None)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and "[1, 6]" in info.value.message
    run.gate.set()
    for tasks, inputs in zip(pending, (running, full, newcomer)):
        np.testing.assert_allclose(wait_for(tasks, None)["scores"], signature.run(inputs)["scores"], atol=1e-5)
    assert [b["input_ids"].shape for b in run.batches] == [(2, 8), (2, 6), (1, 8)]
    np.testing.assert_allclose(wait_for(queue.submit(mismatched, 1, None), None)["scores"],  # queue empty now
                               signature.run(mismatched)["scores"], atol=1e-5)


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
    assert late.answered.wait(10)
    with pytest.raises(ServingError) as info:
        late.result()
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(run.batches) == 1  # the expired request never reached the model


@pytest.mark.parametrize("timeout_micros", [0, 50_000])
def test_an_idle_batch_thread_takes_a_new_batch_while_another_runs(signature, make_queue, timeout_micros):
    """Submits wake one batch thread, not all: a batch that opens while one thread runs (here held at a gate) is
    run by the other, at once when it is ready or at its timeout, never after the busy one returns."""
    run = RecordingRun(signature, gated=True)
    queue = make_queue(run, max_batch_size=2, num_batch_threads=2, batch_timeout_micros=timeout_micros)
    rows = token_inputs(3, 8, seed=5)
    first = queue.submit(_rows(rows, 0, 2), 2, None)  # a full batch: ready at once
    assert run.entered.wait(10)
    run.entered.clear()
    second = queue.submit(_rows(rows, 2, 3), 1, None)  # opens the next batch; the other thread's timer starts
    assert run.entered.wait(10), "the idle batch thread did not take the new batch"
    assert [b["input_ids"].shape[0] for b in run.batches] == [2, 1]
    run.gate.set()
    for tasks, part in ((first, _rows(rows, 0, 2)), (second, _rows(rows, 2, 3))):
        np.testing.assert_allclose(wait_for(tasks, None)["scores"], signature.run(part)["scores"], atol=1e-5)


@pytest.mark.parametrize("case", ["int32 rows", "padding", "first part empty", "strided part", "strings", "floats 3d"])
def test_batch_inputs_stack_as_numpy_concatenates_them(case):
    """The merged batch input (bytes joined, so the GIL is kept) is np.concatenate's, padding rows included."""
    from bertserve.server.batcher import _stacked

    rng = np.random.default_rng(3)
    parts, extra = {
        "int32 rows": ([rng.integers(0, 99, (n, 32), dtype=np.int32) for n in (1, 32, 7)], 0),
        "padding": ([rng.integers(0, 99, (n, 4), dtype=np.int32) for n in (3, 2)], 11),
        "first part empty": ([np.zeros((0, 4), np.int64), np.ones((2, 4), np.int64)], 3),
        "strided part": ([np.arange(40, dtype=np.int32).reshape(5, 8)[:, ::2], np.ones((1, 4), np.int32)], 2),
        "strings": ([np.array([b"a", b"bc"], dtype=object), np.array([b"d"], dtype=object)], 1),
        "floats 3d": ([rng.standard_normal((n, 2, 3)).astype(np.float32) for n in (2, 1)], 5),
    }[case]
    expected = np.concatenate(parts + ([np.repeat(parts[0][:1], extra, axis=0)] if extra else []), axis=0)
    stacked = _stacked(parts, extra)
    assert stacked.dtype == expected.dtype and stacked.shape == expected.shape
    np.testing.assert_array_equal(stacked, expected)


def test_one_failing_answer_does_not_lose_the_others_of_its_wake_up(caplog):
    """A batch's answers reach the event loop in one wake-up; a callback that raises is logged, the rest run."""
    import asyncio

    from bertserve.server.batcher import _LoopInbox

    async def deliver() -> list[str]:
        ran: list[str] = []
        done = asyncio.get_running_loop().create_future()

        def failing() -> None:
            raise RuntimeError("this answer cannot be encoded")

        inbox = _LoopInbox(asyncio.get_running_loop())
        threading.Thread(target=inbox.post_all, args=([lambda: ran.append("first"), failing,
                                                       lambda: ran.append("third"),
                                                       lambda: done.set_result(None)],)).start()
        await asyncio.wait_for(done, 10)
        return ran

    assert asyncio.run(deliver()) == ["first", "third"]
    assert "answering a request failed" in caplog.text and "this answer cannot be encoded" in caplog.text
