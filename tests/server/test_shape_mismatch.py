"""Requests of different sequence lengths that meet in one batching queue, through a real `bertserve serve`.

TF Serving (pad_variable_length_inputs off) fails a merged batch whose trailing shapes differ with
FAILED_PRECONDITION; bertserve fails only the request that would merge, and the batch it met runs.
"""

from __future__ import annotations

import os
import time

import grpc
import numpy as np
import pytest
import requests

from serving_harness import METRICS_PATH, metric_total
from tiny_models import direct_scores, predict_request, tensor, token_inputs

BATCH_TIMEOUT_S = 2.0  # the first request's batch stays open this long, so a request sent after it surely meets it
MEET_DELAY_S = 0.5  # sent this long after the first request: it has reached the queue, its batch is still open
TF_SERVING_MESSAGE = ("Tensors with name 'serving_default_input_ids:0' from different tasks have different shapes and "
                      "padding is turned off. Set pad_variable_length_inputs to true, or ensure that all tensors with "
                      "the same name have equal dimensions starting with the first dim.")


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    from serving_harness import ServerProcess
    config_dir = tmp_path_factory.mktemp("shape_mismatch")
    (config_dir / "batching.txt").write_text(
        f"max_batch_size {{ value: 8 }} batch_timeout_micros {{ value: {int(BATCH_TIMEOUT_S * 1e6)} }} "
        "num_batch_threads { value: 1 } pad_variable_length_inputs: false")
    (config_dir / "monitoring.config").write_text(f'prometheus_config {{ enable: true path: "{METRICS_PATH}" }}')
    process = ServerProcess("--model_name=tiny", f"--model_base_path={models_dir}/tiny", "--enable_batching=true",
                            f"--batching_parameters_file={config_dir}/batching.txt",
                            f"--monitoring_config_file={config_dir}/monitoring.config",
                            log_dir=str(config_dir)).wait_ready()
    yield process
    assert process.terminate() == 0


def _failed_preconditions(server) -> float:
    return metric_total(server.metrics_text(), ":tensorflow:serving:request_count", model_name="tiny",
                        status="FAILED_PRECONDITION")


def _expected(models_dir: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return direct_scores(os.path.join(models_dir, "tiny", "2"), inputs)  # latest version serves


def test_grpc_request_of_another_length_fails_alone(server, models_dir):
    seq8, seq16, seq8_again = token_inputs(2, 8, seed=1), token_inputs(1, 16, seed=2), token_inputs(3, 8, seed=3)
    failed_before = _failed_preconditions(server)
    first = server.predict.Predict.future(predict_request("tiny", seq8), timeout=30)
    time.sleep(MEET_DELAY_S)
    with pytest.raises(grpc.RpcError) as info:
        server.predict.Predict(predict_request("tiny", seq16), timeout=30)
    assert not first.done(), "the seq-8 batch should still have been open when the seq-16 request arrived"
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details().startswith(TF_SERVING_MESSAGE)
    assert "Input 'input_ids' of this request has shape [1, 16]; the batch it would join has shape [2, 8]" in (
        info.value.details())
    follow_up = server.predict.Predict.future(predict_request("tiny", seq8_again), timeout=30)
    np.testing.assert_allclose(tensor(first.result().outputs["scores"]), _expected(models_dir, seq8), atol=1e-5)
    np.testing.assert_allclose(tensor(follow_up.result().outputs["scores"]), _expected(models_dir, seq8_again),
                               atol=1e-5)
    # Alone in the queue, the seq-16 request meets no batch of another shape and is served.
    reply = server.predict.Predict(predict_request("tiny", seq16), timeout=30)
    np.testing.assert_allclose(tensor(reply.outputs["scores"]), _expected(models_dir, seq16), atol=1e-5)
    assert _failed_preconditions(server) == failed_before + 1


def test_rest_request_of_another_length_gets_400_with_the_message(server, models_dir):
    seq8, seq16 = token_inputs(1, 8, seed=4), token_inputs(2, 16, seed=5)
    failed_before = _failed_preconditions(server)
    first = server.predict.Predict.future(predict_request("tiny", seq8), timeout=30)
    time.sleep(MEET_DELAY_S)
    reply = requests.post(f"{server.rest}/v1/models/tiny:predict",
                          json={"inputs": {name: value.tolist() for name, value in seq16.items()}}, timeout=30)
    assert not first.done(), "the seq-8 batch should still have been open when the seq-16 request arrived"
    assert reply.status_code == 400
    assert reply.json()["error"].startswith(TF_SERVING_MESSAGE)
    assert "[2, 16]" in reply.json()["error"] and "[1, 8]" in reply.json()["error"]
    np.testing.assert_allclose(tensor(first.result().outputs["scores"]), _expected(models_dir, seq8), atol=1e-5)
    assert _failed_preconditions(server) == failed_before + 1
    assert server.proc.poll() is None


def test_without_batching_any_lengths_are_served_at_once(models_dir, start_server):
    server = start_server("--model_name=tiny", f"--model_base_path={models_dir}/tiny")
    inputs = [token_inputs(2, seq, seed=seq) for seq in (6, 8, 16)]
    futures = [server.predict.Predict.future(predict_request("tiny", each), timeout=30) for each in inputs]
    for future, each in zip(futures, inputs):
        np.testing.assert_allclose(tensor(future.result().outputs["scores"]), _expected(models_dir, each), atol=1e-5)
