"""Model lifecycle through a real server process: version swap under load, failed loads, config reload, warmup,
queue overflow, deadlines, SIGTERM drain, refused flags."""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import sys
import threading
import time

import grpc
import pytest
from tensorflow_serving.apis import get_model_status_pb2, model_management_pb2
from tensorflow_serving.config import model_server_config_pb2

from bertserve.server.rest import KEEP_ALIVE_IDLE_SECONDS
from serving_harness import REPO_ROOT
from tiny_models import predict_request, token_inputs

State = get_model_status_pb2.ModelVersionStatus.State


def _statuses(server, name):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    return {s.version: s for s in server.models.GetModelStatus(request, timeout=10).model_version_status}


def _wait_until(condition, timeout=30.0, every=0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(every)
    return False


def test_version_swap_under_steady_load_loses_no_request(models_dir, tmp_path, start_server):
    base = tmp_path / "swap"
    shutil.copytree(os.path.join(models_dir, "tiny", "1"), base / "1")
    server = start_server("--model_name=swap", f"--model_base_path={base}", "--file_system_poll_wait_seconds=1",
                          "--enable_batching")
    seen, errors, stop = [], [], threading.Event()
    request = predict_request("swap", token_inputs(2, 8))

    def load():
        while not stop.is_set():
            try:
                seen.append(server.predict.Predict(request, timeout=30).model_spec.version.value)
            except grpc.RpcError as exc:
                errors.append(f"{exc.code()}: {exc.details()}")

    clients = [threading.Thread(target=load) for _ in range(4)]
    for client in clients:
        client.start()
    try:
        assert _wait_until(lambda: len(seen) > 20)
        shutil.copytree(os.path.join(models_dir, "tiny", "2"), tmp_path / "staging")
        os.rename(tmp_path / "staging", base / "2")  # appears atomically, as bertserve export writes versions
        assert _wait_until(lambda: seen[-20:] == [2] * 20 and len(seen) > 40, timeout=60)
    finally:
        stop.set()
        for client in clients:
            client.join()
    assert errors == []
    assert seen[0] == 1 and seen[-1] == 2
    assert _wait_until(lambda: _statuses(server, "swap")[1].state == State.END)
    assert _statuses(server, "swap")[2].state == State.AVAILABLE
    assert "Unloaded servable version {name: swap version: 1}" in server.log()


def test_failed_load_is_reported_others_serve_and_reload_applies(models_dir, tmp_path, start_server):
    broken = tmp_path / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
    shutil.copytree(os.path.join(models_dir, "tiny", "1"), tmp_path / "flaky" / "1")
    config = model_server_config_pb2.ModelServerConfig()
    good = config.model_config_list.config.add(name="good", base_path=os.path.join(models_dir, "tiny"))
    good.model_version_policy.specific.versions.append(1)
    flaky = config.model_config_list.config.add(name="flaky", base_path=str(tmp_path / "flaky"))
    flaky.model_version_policy.latest.num_versions = 1
    (tmp_path / "models.config").write_text(str(config))
    server = start_server(f"--model_config_file={tmp_path / 'models.config'}", "--enable_model_warmup=true",
                          "--max_num_load_retries=1", "--load_retry_interval_micros=0",
                          "--model_config_file_poll_wait_seconds=1")
    # A model that fails to load at start stops the server (test_startup); added later, it is reported.
    config.model_config_list.config.add(name="broken", base_path=str(tmp_path / "broken"))
    server.models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=120)

    status = _statuses(server, "broken")[1]
    assert status.state == State.END and status.status.error_code != 0 and status.status.error_message
    # Availability preserving: a new version of "flaky" that fails to load leaves the serving one in place.
    shutil.copytree(broken, tmp_path / "flaky-staging")
    os.rename(tmp_path / "flaky-staging", tmp_path / "flaky" / "2")
    assert _wait_until(lambda: 2 in _statuses(server, "flaky") and _statuses(server, "flaky")[2].state == State.END)
    flaky_status = _statuses(server, "flaky")
    assert flaky_status[2].state == State.END and flaky_status[2].status.error_message
    assert flaky_status[1].state == State.AVAILABLE
    assert server.predict.Predict(predict_request("flaky", token_inputs(1, 8)), timeout=30).model_spec.version.value == 1
    # One retry on a later poll (--max_num_load_retries=1), then no more.
    assert _wait_until(lambda: "{name: broken version: 1} failed (attempt 2)" in server.log())
    time.sleep(2.5)
    assert "{name: broken version: 1} failed (attempt 3)" not in server.log()
    assert server.predict.Predict(predict_request("good", token_inputs(2, 8)), timeout=30).model_spec.version.value == 1
    with pytest.raises(grpc.RpcError) as info:
        server.predict.Predict(predict_request("broken", token_inputs(2, 8)), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    log = server.log()
    assert "model good version 1: warmed up with 2 requests" in log
    assert "Loading servable {name: broken version: 1} failed" in log

    del config.model_config_list.config[1:]
    config.model_config_list.config.add(name="third", base_path=os.path.join(models_dir, "tiny"))
    server.models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=120)
    assert server.predict.Predict(predict_request("third", token_inputs(1, 8)), timeout=30).model_spec.version.value == 2
    assert _statuses(server, "broken")[1].state == State.END  # removed from the config: END, as TF Serving
    with pytest.raises(grpc.RpcError) as info:
        server.predict.Predict(predict_request("broken", token_inputs(1, 8)), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND

    # --model_config_file_poll_wait_seconds: an edited file replaces the model list without a restart.
    config.model_config_list.config[-1].name = "fourth"
    (tmp_path / "models.config").write_text(str(config))
    assert _wait_until(lambda: "fourth" in server.log() and "model config file" in server.log())
    assert server.predict.Predict(predict_request("fourth", token_inputs(1, 8)), timeout=30).model_spec.name == "fourth"
    with pytest.raises(grpc.RpcError) as info:
        server.predict.Predict(predict_request("third", token_inputs(1, 8)), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_queue_overflow_deadline_and_sigterm_drain(models_dir, tmp_path, start_server):
    (tmp_path / "batching.txt").write_text(
        "max_batch_size { value: 1 } max_enqueued_batches { value: 2 } num_batch_threads { value: 1 }")
    server = start_server("--model_name=slow", f"--model_base_path={models_dir}/slow", "--enable_batching",
                          f"--batching_parameters_file={tmp_path / 'batching.txt'}")
    request = predict_request("slow", token_inputs(1, 8))
    futures = [server.predict.Predict.future(request, timeout=60) for _ in range(20)]
    codes = []
    for future in futures:
        try:
            future.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
    assert server.predict.Predict(request, timeout=60).outputs["scores"].tensor_shape.dim[0].size == 1

    busy = server.predict.Predict.future(request, timeout=60)
    with pytest.raises(grpc.RpcError) as info:
        server.predict.Predict(request, timeout=0.005)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    busy.result()
    server.predict.Predict(request, timeout=60)  # queued after the abandoned one: the queue is empty again

    # A kept-alive REST connection left idle must not hold the shutdown until its idle timeout. It is opened
    # before the work below, so that the time between that work and SIGTERM stays well under its ~0.5 s.
    idle = http.client.HTTPConnection(*server.rest_address, timeout=30)
    idle.request("GET", "/v1/models/slow")
    assert idle.getresponse().read()
    in_flight = [server.predict.Predict.future(request, timeout=60) for _ in range(2)]  # fits the queue
    finished_at = []
    for future in in_flight:
        future.add_done_callback(lambda _: finished_at.append(time.monotonic()))
    time.sleep(0.1)
    terminated_at = time.monotonic()
    assert server.terminate(timeout=KEEP_ALIVE_IDLE_SECONDS / 2) == 0
    assert [f.result().model_spec.name for f in in_flight] == ["slow"] * 2
    assert max(finished_at) > terminated_at  # at least one was still running or queued at SIGTERM
    assert idle.sock.recv(1) == b""  # the server closed the idle connection
    idle.close()
    assert "stopped" in server.log()


def test_refused_flags_and_config_exit_nonzero(tmp_path):
    def run(*flags):
        return subprocess.run([sys.executable, "-m", "bertserve.cli", "serve", *flags], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)

    result = run("--model_base_path=/nowhere", f"--batching_parameters_file={tmp_path / 'b.txt'}")
    assert result.returncode == 2 and "requires --enable_batching" in result.stderr
    (tmp_path / "b.txt").write_text("max_batch_size { value: 8 } allowed_batch_sizes: 4")
    result = run("--model_base_path=/nowhere", "--enable_batching", f"--batching_parameters_file={tmp_path / 'b.txt'}")
    assert result.returncode == 1 and "allowed_batch_sizes" in result.stderr
