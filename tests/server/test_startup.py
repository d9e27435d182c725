"""Start-up as tensorflow_model_server: exit when a configured model cannot load or the config or flags are
invalid; an empty --model_config_file starts a server with no models, configured later by HandleReloadConfig."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import grpc
import pytest
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.config import model_server_config_pb2

from serving_harness import REPO_ROOT
from tiny_models import predict_request, token_inputs


def _serve(*flags: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`bertserve serve` expected to exit by itself, before it listens; its exit code and log."""
    return subprocess.run([sys.executable, "-m", "bertserve.cli", "serve", *flags], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "models.config"
    path.write_text(f"model_config_list {{ {text} }}")
    return f"--model_config_file={path}"


def test_a_model_that_fails_to_load_stops_the_server(models_dir, tmp_path):
    broken = tmp_path / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
    result = _serve(_config(tmp_path, f'config {{ name: "good" base_path: "{models_dir}/tiny" }} '
                                      f'config {{ name: "broken" base_path: "{tmp_path / "broken"}" }}'),
                    "--max_num_load_retries=1", "--load_retry_interval_micros=0")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Loading servable {name: broken version: 1} failed" in result.stderr
    assert "(attempt 2)" in result.stderr  # the one retry happened before giving up
    assert "Running gRPC ModelServer" not in result.stderr


@pytest.mark.parametrize("entry, message", [
    ('config { name: "m" base_path: "relative/models/m" }',
     "Expected model m to have an absolute path or URI; found: 'relative/models/m'"),
    ('config { name: "m" base_path: "/models/m" model_type: TENSORFLOW model_platform: "tensorflow" }',
     "Illegal setting both ModelServerConfig::model_type (deprecated) and ModelServerConfig::model_platform"),
    ('config { name: "m" base_path: "/models/m" model_type: OTHER }', "model_type choice OTHER not supported"),
    ('config { name: "m" base_path: "/a" } config { name: "m" base_path: "/b" }',
     "Illegal to list model m multiple times"),
])
def test_invalid_config_stops_the_server(tmp_path, entry, message):
    result = _serve(_config(tmp_path, entry))
    assert result.returncode == 1 and message in result.stderr, result.stderr[-3000:]


def test_batching_parameters_out_of_range_stop_the_server(tmp_path):
    """A timeout the batch threads cannot wait used to kill them while health still said SERVING."""
    (tmp_path / "batching.txt").write_text("batch_timeout_micros { value: 10000000000000000 }")
    result = _serve("--model_base_path=/models/m", "--enable_batching",
                    f"--batching_parameters_file={tmp_path / 'batching.txt'}")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "batch_timeout_micros must be non-negative and at most 3600000000 (an hour); was 10000000000000000" \
        in result.stderr


@pytest.mark.parametrize("flags, code, message", [
    (["--prefer_tflite_model=true"], 2, "--prefer_tflite_model=true is not supported"),
    (["--prefer_tflite_model"], 2, "--prefer_tflite_model=true is not supported"),
])
def test_refused_flags(tmp_path, flags, code, message):
    result = _serve("--model_base_path=/models/m", *flags)
    assert result.returncode == code and message in result.stderr, result.stderr[-3000:]


def test_empty_config_file_starts_without_models_then_reload_adds_one(models_dir, tmp_path, start_server):
    (tmp_path / "empty.config").write_text("")
    server = start_server(f"--model_config_file={tmp_path / 'empty.config'}", "--prefer_tflite_model=false")
    with pytest.raises(grpc.RpcError) as info:
        server.predict.Predict(predict_request("tiny", token_inputs(1, 8)), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name="tiny", base_path=os.path.join(models_dir, "tiny"))
    server.models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=120)
    reply = server.predict.Predict(predict_request("tiny", token_inputs(1, 8)), timeout=30)
    assert reply.model_spec.version.value == 2


def test_grpc_also_on_a_unix_socket(models_dir, tmp_path, start_server):
    socket_path = tmp_path / "grpc.sock"
    server = start_server(f"--model_base_path={models_dir}/tiny", "--model_name=tiny",
                          f"--grpc_socket_path={socket_path}")
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        over_socket = stub.Predict(predict_request("tiny", token_inputs(2, 8)), timeout=30)
    over_tcp = server.predict.Predict(predict_request("tiny", token_inputs(2, 8)), timeout=30)
    assert over_socket == over_tcp


def test_a_model_without_versions_yet_delays_start_until_one_appears(models_dir, tmp_path, start_server):
    """TF Serving waits for every configured model; the server is not SERVING before."""
    base = tmp_path / "later"
    base.mkdir()
    server = start_server(f"--model_base_path={base}", "--model_name=later", ready=False)
    deadline = time.monotonic() + 120
    while "waiting for model later: No versions of servable later found" not in server.log():
        assert time.monotonic() < deadline and server.proc.poll() is None, server.log()[-3000:]
        time.sleep(0.2)
    with pytest.raises(TimeoutError):
        server.wait_ready(timeout=2)
    shutil.copytree(os.path.join(models_dir, "tiny", "1"), tmp_path / "staging")
    os.rename(tmp_path / "staging", base / "1")
    server.wait_ready(timeout=60)
    assert server.predict.Predict(predict_request("later", token_inputs(1, 8)), timeout=30).model_spec.version.value \
        == 1
