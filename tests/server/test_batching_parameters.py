"""The batching parameters file is checked at start as TF Serving checks it, and a batch scheduler whose thread
died never looks alive: its requests fail at once with UNAVAILABLE and health stops saying SERVING."""

from __future__ import annotations

import os
import time

import grpc
import pytest
from google.protobuf import text_format

from bertserve.server import batching_parameters_pb2
from bertserve.server.batcher import BatchScheduler, wait_for
from bertserve.server.config_files import BatchingOptions, ConfigError, batching_options_from_proto
from bertserve.server.errors import ServingError
from bertserve.server.health import ServingHealth
from bertserve.server.metrics import ServerMetrics
from bertserve.server.servable import LoadedVersion
from tiny_models import token_inputs


@pytest.mark.parametrize("text, message", [
    ("batch_timeout_micros { value: 10000000000000000 }", "batch_timeout_micros must be non-negative and at most"),
    ("batch_timeout_micros { value: -1 }", "batch_timeout_micros must be non-negative and at most"),
    ("max_batch_size { value: 0 }", "max_batch_size must be positive; was 0"),
    ("max_enqueued_batches { value: 0 }", "max_enqueued_batches must be positive; was 0"),
    ("num_batch_threads { value: -2 }", "num_batch_threads must be positive; was -2"),
    ("num_batch_threads { value: 1000000 }", "num_batch_threads must be at most 1024"),
    ("max_batch_size { value: 8 } enable_large_batch_splitting { value: true } max_execution_batch_size "
     "{ value: 16 }", "max_batch_size (8) must be greater than or equal to max_execution_batch_size (16)"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 2 allowed_batch_sizes: 2 allowed_batch_sizes: 8",
     "monotonically increasing"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 2 allowed_batch_sizes: 4", "must equal max_batch_size (8)"),
])
def test_out_of_range_parameters_are_refused(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        batching_options_from_proto(text_format.Parse(text, batching_parameters_pb2.BatchingParameters()))


class RecordingHealth:
    """What the front ends' health service was last told (the HealthReporter protocol)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def serving(self) -> None:
        self.calls.append("SERVING")

    def not_serving(self) -> None:
        self.calls.append("NOT_SERVING")


def test_a_dead_batch_thread_fails_requests_at_once_and_turns_health_off(models_dir):
    """Options that bypassed the file check (a timeout the thread cannot wait) kill the batch thread, as any
    unexpected error in it would: the queued request is answered UNAVAILABLE at once instead of hanging until its
    deadline, later requests are refused at once, and health reports NOT_SERVING."""
    signature = LoadedVersion("tiny", 1, os.path.join(models_dir, "tiny", "1"), {"serve"}).signature("")
    health, reporter = ServingHealth(), RecordingHealth()
    health.start_serving(reporter)
    options = BatchingOptions(batch_timeout_micros=10 ** 16, num_batch_threads=1, max_batch_size=8)
    scheduler = BatchScheduler(options.num_batch_threads, "dying", health.batch_scheduler_failed)
    queue = scheduler.add_queue(options, signature.run, signature.tensor_names, "tiny", "serving_default",
                                ServerMetrics())
    started = time.monotonic()
    with pytest.raises(ServingError) as info:
        deadline = time.monotonic() + 60
        wait_for(queue.submit(token_inputs(1, 8), 1, deadline), deadline)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and "OverflowError" in info.value.message
    assert time.monotonic() - started < 30  # answered, not left to its deadline
    assert reporter.calls == ["SERVING", "NOT_SERVING"]
    assert "OverflowError" in health.failure
    started = time.monotonic()
    with pytest.raises(ServingError) as info:
        deadline = time.monotonic() + 60
        wait_for(queue.submit(token_inputs(1, 8), 1, deadline), deadline)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and time.monotonic() - started < 1
    # Start-up finishing after the failure must not turn health back on.
    late = RecordingHealth()
    health.start_serving(late)
    assert late.calls == ["NOT_SERVING"]
    scheduler.stop()
