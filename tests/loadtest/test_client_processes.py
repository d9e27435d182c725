"""Client processes against a real `bertserve serve` (a tiny ranker): an overload that its small batch queue
refuses UNAVAILABLE, then a low rate it answers in full (recovery), counted on both sides; and the REST load."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bertserve import custom_ops
from bertserve.client.protocol import ModelSpec
from bertserve.export.graph import build_ranker_module
from bertserve.export.saved import write_version
from bertserve.export.weights import BertConfig, BertWeights
from bertserve.loadtest import server_metrics
from bertserve.loadtest.clients import ClientProcesses, InProcessLoad, LoadSpec
from bertserve.loadtest.loadgen import Phase, RequestShape
from bertserve.loadtest.server_process import ServerProcess
from bertserve.loadtest.tuner import BatchingCandidate
from bertserve.model_dir import TokenizerSettings

MODEL = "tiny"
REPLIES = 8
# vocab over the load generator's first word piece (1000); small enough to export and serve in seconds.
CONFIG = BertConfig(vocab_size=1100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=40)
# One request per batch, one batch queued behind the running one: a burst is refused at once.
BATCHING = BatchingCandidate(max_batch_size=REPLIES, batch_timeout_micros=0, num_batch_threads=1,
                             max_enqueued_batches=1)
OVERLOAD, LOW = Phase(1500, 1.0), Phase(20, 2.5)
MONITORING = os.path.join(os.path.dirname(__file__), "..", "..", "serving_config", "monitoring.config")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("client_processes")
    vocab = work / "vocab.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(CONFIG.vocab_size)))
    variant = "fused" if custom_ops.library_loads() else "stock"
    write_version(build_ranker_module(BertWeights.random(CONFIG, seed=3), variant), CONFIG, str(work / "models"),
                  MODEL, 1, TokenizerSettings(str(vocab), True, 16))
    batching = work / "batching_parameters.txt"
    batching.write_text(BATCHING.to_text())
    process = ServerProcess([f"--model_name={MODEL}", f"--model_base_path={work / 'models' / MODEL}",
                             "--enable_batching", f"--batching_parameters_file={batching}",
                             f"--monitoring_config_file={os.path.abspath(MONITORING)}"], str(work / "serve.log"))
    yield process
    process.terminate()


def test_client_processes_count_refusals_and_show_recovery(server):
    spec = LoadSpec((server.target,), (ModelSpec(MODEL),), RequestShape(REPLIES, 16, (8, 12, 16), CONFIG.vocab_size),
                    timeout_s=5.0)
    with ClientProcesses(spec, processes=2) as load:  # the clients start while the server loads
        server.wait_until_available([MODEL], timeout_s=120)
        load.warm_up()
        before = server.metrics()
        run = load.open([OVERLOAD, LOW], seed=1)
        after = server.metrics()

    assert len(run.client_cpu_s) == 2 and all(cpu > 0 for cpu in run.client_cpu_s)
    assert run.sent == run.ok + sum(run.errors.values())
    assert run.errors.get("UNAVAILABLE", 0) > 0, run.row()
    assert set(run.errors) == {"UNAVAILABLE"}, run.errors
    # Every refusal came while the overload's requests were still queued or running; the last second of the low
    # phase is answered in full.
    last_second = OVERLOAD.seconds + LOW.seconds - 1.0
    assert not np.any(run.error_at_s >= last_second), run.timeline(0.5)
    assert np.sum(run.latency_at_s >= last_second) >= 5
    timeline = run.timeline(0.5)
    assert sum(b["ok"] for b in timeline) == run.ok and sum(b["errors"] for b in timeline) == sum(run.errors.values())
    row = run.row()
    assert row["client_processes"] == 2 and len(row["client_cpu_cores"]) == 2
    assert [p["qps"] for p in row["phases"]] == [OVERLOAD.qps, LOW.qps]
    assert row["send_lag_p50_ms"] >= 0 and row["p50_from_send_ms"] <= row["p50_ms"]

    # The server saw the same answers and refusals, in batches of one request padded to nothing.
    batching = server_metrics.batching_between(before, after, REPLIES)[MODEL]
    assert batching["answers_by_status"].get("OK") == run.ok
    assert batching["answers_by_status"].get("UNAVAILABLE") == run.errors["UNAVAILABLE"]
    assert batching["batches"] == run.ok and batching["mean_queries_per_batch"] == 1.0
    assert batching["batches_by_padded_size"] == {REPLIES: run.ok}


def test_rest_load_answers_every_request(server):
    spec = LoadSpec((server.rest_target,), (ModelSpec(MODEL),), RequestShape(REPLIES, 16, (10,), CONFIG.vocab_size),
                    api="rest")
    server.wait_until_available([MODEL], timeout_s=120)
    with InProcessLoad(spec, progress=False) as load:
        load.warm_up()
        before = server.metrics()
        run = load.closed(1, 1.5)  # one request at a time: the one-request queue never refuses it
        after = server.metrics()
    assert run.errors == {} and run.ok == run.sent >= 5
    assert server_metrics.batching_between(before, after, REPLIES)[MODEL]["answers_by_status"] == {"OK": run.ok}
