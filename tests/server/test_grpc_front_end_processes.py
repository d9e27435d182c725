"""--grpc_front_end_processes=N: N processes terminate gRPC on the shared port and forward each call's bytes to the
main process. Real processes, the real gRPC server and the official stubs: calls spread over the front ends and
answer as in one process, bad bytes are INVALID_ARGUMENT, a full queue UNAVAILABLE at once, a killed front end is
replaced, and SIGTERM drains the calls in flight."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import grpc
import numpy as np
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)

from bertserve.server.front_end_processes import LINK_BACKLOG_LIMIT_SECONDS
from serving_harness import REPO_ROOT, ServerProcess, metric_total
from tiny_models import direct_scores, predict_request, tensor, token_inputs

PREDICT = "/tensorflow.serving.PredictionService/Predict"
SERVING = health_pb2.HealthCheckResponse.SERVING


def _channels(target: str, count: int) -> list[grpc.Channel]:
    """`count` channels with a connection each (gRPC shares one connection among identical channels otherwise):
    the kernel hands each new connection to one of the front-end processes."""
    return [grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(count)]


def _front_ends(server: ServerProcess) -> list[psutil.Process]:
    return psutil.Process(server.proc.pid).children()


def _healthy(channel: grpc.Channel) -> bool:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    return reply.status == SERVING


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("front_end_processes")
    (folder / "batching.txt").write_text("max_batch_size { value: 16 } batch_timeout_micros { value: 1000 }")
    process = ServerProcess("--model_name=tiny", f"--model_base_path={models_dir}/tiny", "--enable_batching",
                            f"--batching_parameters_file={folder / 'batching.txt'}", "--grpc_front_end_processes=3",
                            f"--grpc_socket_path={folder / 'grpc.sock'}", log_dir=str(folder)).wait_ready()
    process.socket_path = str(folder / "grpc.sock")
    yield process
    assert process.terminate() == 0


def test_calls_spread_over_front_ends_and_answer_as_one_process(server, models_dir):
    inputs = token_inputs(3, 8, seed=5)
    expected = direct_scores(os.path.join(models_dir, "tiny", "2"), inputs)
    channels = _channels(server.target, 12) + [grpc.insecure_channel(f"unix:{server.socket_path}")]
    try:
        futures = [prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict.future(
            predict_request("tiny", inputs), timeout=60) for channel in channels]
        for future in futures:
            reply = future.result()
            assert reply.model_spec.version.value == 2
            np.testing.assert_allclose(tensor(reply.outputs["scores"]), expected, rtol=1e-5)
        front_ends = _front_ends(server)
        assert len(front_ends) == 3
        holding = [p.pid for p in front_ends if any(c.status == psutil.CONN_ESTABLISHED and c.laddr.port ==
                                                    server.grpc_port for c in p.net_connections("tcp"))]
        assert len(holding) >= 2, f"12 connections all went to front end {holding}"
        assert not any(c.status == psutil.CONN_LISTEN and c.laddr.port == server.grpc_port
                       for c in psutil.Process(server.proc.pid).net_connections("tcp"))
    finally:
        for channel in channels:
            channel.close()
    # Every other API goes the same way: metadata, status, health.
    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    metadata.model_spec.name = "tiny"
    assert server.predict.GetModelMetadata(metadata, timeout=30).model_spec.version.value == 2
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "tiny"
    assert {s.version for s in server.models.GetModelStatus(status, timeout=30).model_version_status} == {2}
    assert _healthy(server.channel)


def test_frames_larger_than_the_link_buffer_cross_whole_beside_small_calls(server, models_dir):
    """A request far larger than the link's socket buffer leaves its front end in pieces (a non-blocking send, the
    rest through the writer thread) while small calls keep coming on the same link (one connection: one front
    end): every call reaches the main process whole and in order, so the big ones get the error that names their
    extra input (their bytes parsed to the end) and the small ones their scores."""
    small = token_inputs(2, 8, seed=7)
    expected = direct_scores(os.path.join(models_dir, "tiny", "2"), small)
    big = predict_request("tiny", {**small, "padding": np.zeros(1 << 20, np.int32)})  # 4 MiB more
    channel = grpc.insecure_channel(server.target, options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        calls = [(i % 10 == 0, stub.Predict.future(big if i % 10 == 0 else predict_request("tiny", small),
                                                   timeout=60)) for i in range(60)]
        for is_big, future in calls:
            if is_big:
                with pytest.raises(grpc.RpcError) as caught:
                    future.result()
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "Sent extra: {padding}" in caught.value.details()
            else:
                np.testing.assert_allclose(tensor(future.result().outputs["scores"]), expected, rtol=1e-5)
    finally:
        channel.close()


def test_unparsable_bytes_are_invalid_argument_and_fail_no_other_call(server):
    good = predict_request("tiny", token_inputs(2, 8))
    predict = server.channel.unary_unary(PREDICT)
    status = server.channel.unary_unary("/tensorflow.serving.ModelService/GetModelStatus")
    bad = [predict.future(b"\x0a\xff\x01", timeout=60) for _ in range(20)]
    goods = [server.predict.Predict.future(good, timeout=60) for _ in range(20)]
    for future in bad:
        with pytest.raises(grpc.RpcError) as info:
            future.result()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid tensorflow.serving.PredictRequest" in info.value.details()
    assert all(future.result().outputs["scores"].tensor_shape.dim[0].size == 2 for future in goods)
    with pytest.raises(grpc.RpcError) as info:
        status(b"\xff", timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tensorflow.serving.GetModelStatusRequest" in info.value.details()


def test_health_watch_unknown_services_and_methods_as_grpc_answers_them(server):
    """Health is gRPC's own service (Check, and Watch's stream of states); a service it does not know is NOT_FOUND
    to Check and SERVICE_UNKNOWN to Watch; a method nobody serves is UNIMPLEMENTED, all from the front end."""
    channel = server.channel
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == SERVING
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert next(watch).status == SERVING
    watch.cancel()
    unknown = health.Watch(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert next(unknown).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    unknown.cancel()
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary("/tensorflow.serving.PredictionService/Nope")(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_front_ends_exit_when_the_main_process_dies(models_dir, start_server):
    """A front end without its main process could only fail calls: it closes its port and exits at once."""
    server = start_server("--model_name=tiny", f"--model_base_path={models_dir}/tiny", "--grpc_front_end_processes=2")
    front_ends = _front_ends(server)
    assert len(front_ends) == 2
    server.proc.kill()
    server.proc.wait(30)
    _, alive = psutil.wait_procs(front_ends, timeout=10)  # not this process's children: no exit codes here
    assert not alive, f"front ends {alive} outlived their main process"
    assert server.log().count("the main process is gone; exiting") == 2


def test_killed_front_end_is_replaced(server):
    victim = _front_ends(server)[1]
    victim.kill()
    deadline = time.monotonic() + 30
    while True:
        front_ends = _front_ends(server)
        if len(front_ends) == 3 and victim.pid not in {p.pid for p in front_ends}:
            break
        assert time.monotonic() < deadline, f"front ends {front_ends} after killing {victim.pid}"
        time.sleep(0.2)
    assert "was killed by signal 9; starting it again" in server.log()
    assert server.proc.poll() is None
    channels = _channels(server.target, 6)
    try:
        for channel in channels:
            time_left = time.monotonic() + 10  # the replacement starts listening shortly after it appears
            while True:
                try:
                    assert _healthy(channel)
                    break
                except grpc.RpcError:
                    assert time.monotonic() < time_left
                    time.sleep(0.2)
            reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                predict_request("tiny", token_inputs(1, 8)), timeout=60)
            assert reply.outputs["scores"].tensor_shape.dim[0].size == 1
    finally:
        for channel in channels:
            channel.close()


def test_calls_left_unread_by_a_stalled_main_process_are_refused_not_queued(server):
    """A main process that falls behind reading its links (stopped here past the limit) must not queue calls without
    bound: inference calls it reads more than LINK_BACKLOG_LIMIT_SECONDS late are UNAVAILABLE at once, calls
    that run no model still answer, and the next calls are served as before."""
    channels = _channels(server.target, 4)
    stubs = [prediction_service_pb2_grpc.PredictionServiceStub(channel) for channel in channels]
    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "tiny"
    try:
        for stub in stubs:  # connected, and the front ends' links idle
            stub.Predict(predict_request("tiny", token_inputs(1, 8)), timeout=60)
        main = psutil.Process(server.proc.pid)
        main.suspend()
        try:
            late = [stub.Predict.future(predict_request("tiny", token_inputs(2, 8, seed=i)), timeout=60)
                    for i, stub in enumerate(stubs * 5)]
            status = model_service_pb2_grpc.ModelServiceStub(channels[0]).GetModelStatus.future(status_request,
                                                                                               timeout=60)
            time.sleep(LINK_BACKLOG_LIMIT_SECONDS + 0.5)
        finally:
            main.resume()
        for future in late:
            error = future.exception(timeout=60)
            assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert "The server is overloaded: this request waited" in error.details()
        assert status.result(timeout=60).model_version_status[0].version == 2
        for stub in stubs:
            reply = stub.Predict(predict_request("tiny", token_inputs(3, 8)), timeout=60)
            assert reply.outputs["scores"].tensor_shape.dim[0].size == 3
    finally:
        for channel in channels:
            channel.close()


def test_full_queue_refuses_deadlines_hold_and_sigterm_drains(models_dir, tmp_path, start_server):
    (tmp_path / "batching.txt").write_text(
        "max_batch_size { value: 8 } max_enqueued_batches { value: 2 } num_batch_threads { value: 1 } "
        "batch_timeout_micros { value: 0 }")
    server = start_server("--model_name=slow", f"--model_base_path={models_dir}/slow", "--enable_batching",
                          f"--batching_parameters_file={tmp_path / 'batching.txt'}", "--grpc_front_end_processes=2",
                          f"--monitoring_config_file={os.path.join(REPO_ROOT, 'serving_config', 'monitoring.config')}")
    request = predict_request("slow", token_inputs(1, 8))
    channels = _channels(server.target, 4)
    stubs = [prediction_service_pb2_grpc.PredictionServiceStub(channel) for channel in channels]

    # Backpressure: 300 at once against a queue of 16 rows: most refused UNAVAILABLE, and refused at once.
    answered: list[tuple[grpc.StatusCode, float]] = []
    lock = threading.Lock()

    def record(future, sent: float) -> None:
        with lock:
            answered.append((future.code(), time.monotonic() - sent))

    futures = []
    for i in range(300):
        sent = time.monotonic()
        future = stubs[i % len(stubs)].Predict.future(request, timeout=30)
        future.add_done_callback(lambda f, sent=sent: record(f, sent))
        futures.append(future)
    assert _healthy(channels[0])
    for future in futures:
        future.exception()  # waits
    codes = {code for code, _ in answered}
    assert codes == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
    refused = sorted(seconds for code, seconds in answered if code == grpc.StatusCode.UNAVAILABLE)
    assert len(refused) > 150 and refused[len(refused) // 2] < 2.0, refused[len(refused) // 2]

    # The client's deadline reaches the main process: behind a busy batch, the call ends DEADLINE_EXCEEDED there
    # (or CANCELLED, when the front end's cancel arrives first) instead of running after the client gave up.
    def given_up() -> float:
        text = server.metrics_text()
        return sum(metric_total(text, ":tensorflow:serving:request_count", model_name="slow", status=status)
                   for status in ("DEADLINE_EXCEEDED", "CANCELLED"))

    before = given_up()
    busy = [stubs[i % len(stubs)].Predict.future(request, timeout=30) for i in range(8)]
    with pytest.raises(grpc.RpcError) as info:
        stubs[0].Predict(request, timeout=0.1)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert all(future.result().model_spec.name == "slow" for future in busy)
    assert given_up() == before + 1

    # SIGTERM: the calls in flight still get their answers, then every process exits.
    front_ends = _front_ends(server)
    in_flight = [stubs[i % len(stubs)].Predict.future(request, timeout=60) for i in range(6)]
    time.sleep(0.3)
    server.proc.send_signal(signal.SIGTERM)
    for future in in_flight:
        assert future.result().model_spec.name == "slow"
    assert server.proc.wait(60) == 0
    assert not [p for p in front_ends if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for channel in channels:
        channel.close()


def test_front_ends_that_cannot_listen_stop_the_server(models_dir, start_server):
    """A port held by a listener that does not share it: the front ends cannot bind, and the server exits non-zero
    with the reason instead of running without gRPC."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = start_server("--model_name=tiny", f"--model_base_path={models_dir}/tiny", f"--port={port}",
                              "--grpc_front_end_processes=2", ready=False)
        assert server.proc.wait(120) == 1
    assert f"cannot listen for gRPC on 0.0.0.0:{port}" in server.log()
    assert "before it listened" in server.log()


def _typed(inputs: dict[str, np.ndarray]) -> dict[str, tensor_pb2.TensorProto]:
    """The same inputs in int_val, not tensor_content."""
    protos = {}
    for name, value in inputs.items():
        proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32)
        proto.tensor_shape.dim.extend(tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in value.shape)
        proto.int_val.extend(value.ravel().tolist())
        protos[name] = proto
    return protos


def _request_cases() -> dict[str, predict_pb2.PredictRequest]:
    good = token_inputs(2, 8, seed=9)
    cases = {"tensor_content": predict_request("tiny", good), "version": predict_request("tiny", good, version=1),
             "output_filter": predict_request("tiny", good), "typed_fields": predict_request("tiny", {})}
    cases["output_filter"].output_filter.append("scores")
    for name, proto in _typed(good).items():
        cases["typed_fields"].inputs[name].CopyFrom(proto)
    cases["typed_last_value_repeats"] = predict_request("tiny", {})
    for name, value in good.items():
        cases["typed_last_value_repeats"].inputs[name].CopyFrom(_typed({name: value})[name])
        del cases["typed_last_value_repeats"].inputs[name].int_val[1:]
    cases["wrong_dtype"] = predict_request("tiny", {**good, "input_ids": good["input_ids"].astype(np.float32)})
    cases["int64_ids"] = predict_request("tiny", {**good, "input_ids": good["input_ids"].astype(np.int64)})
    cases["string_ids"] = predict_request("tiny", {**good, "input_ids": np.array([[b"a"] * 8] * 2)})
    cases["short_content"] = predict_request("tiny", good)
    cases["short_content"].inputs["input_mask"].tensor_content = good["input_mask"].tobytes()[:-4]
    cases["negative_dim"] = predict_request("tiny", good)
    cases["negative_dim"].inputs["segment_ids"].tensor_shape.dim[0].size = -2
    cases["missing_input"] = predict_request("tiny", {k: v for k, v in good.items() if k != "segment_ids"})
    cases["extra_input"] = predict_request("tiny", {**good, "extra": good["input_ids"]})
    cases["gap_in_mask"] = predict_request("tiny", {**good, "input_mask": np.array(
        [[1, 0, 1, 1, 0, 0, 0, 0]] * 2, np.int32)})
    cases["unknown_model"] = predict_request("nope", good)
    cases["unknown_version"] = predict_request("tiny", good, version=99)
    cases["unknown_signature"] = predict_request("tiny", good, signature="nope")
    cases["bad_output_filter"] = predict_request("tiny", good)
    cases["bad_output_filter"].output_filter.append("nope")
    cases["version_and_label"] = predict_request("tiny", good, version=1, label="stable")
    return cases


@pytest.mark.parametrize("case", sorted(_request_cases()))
def test_predict_through_front_ends_answers_as_in_one_process(server, tiny_server, case):
    """Answers, and an error's code and text, are the single-process server's (tiny_server), for good requests
    and for each kind of bad one: those the front ends take apart (tests/server/test_predict_codec.py) and those
    they forward as bytes (strings)."""
    request = _request_cases()[case]

    def outcome(target):
        try:
            return "OK", target.predict.Predict(request, timeout=60)
        except grpc.RpcError as error:
            return error.code(), error.details()

    (code, answer), (expected_code, expected) = outcome(server), outcome(tiny_server)
    assert code == expected_code, (answer, expected)
    if code == "OK":
        assert answer.model_spec == expected.model_spec
        assert answer.outputs.keys() == expected.outputs.keys()
        for name in answer.outputs:  # typed fields, as TF Serving answers without tensor_content
            assert answer.outputs[name].float_val and not answer.outputs[name].tensor_content
            np.testing.assert_allclose(tensor(answer.outputs[name]), tensor(expected.outputs[name]), rtol=1e-6)
    else:
        assert answer == expected


def test_missing_front_end_program_stops_the_server_naming_it(models_dir, monkeypatch, caplog):
    """Without the C++ program (`make setup` not run), the server exits 1 with a message that says how to build
    it, rather than serving without its gRPC port. In this process: the program cannot vanish under the others."""
    from bertserve.server import front_end_processes
    from bertserve.server.flags import parse_flags
    from bertserve.server.main import run

    missing = os.path.join(models_dir, "no_such_front_end")
    monkeypatch.setattr(front_end_processes, "FRONT_END_PROGRAM", missing)
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    options, _ = parse_flags(["--model_name=tiny", f"--model_base_path={models_dir}/tiny", f"--port={port}",
                              "--grpc_front_end_processes=2", "--file_system_poll_wait_seconds=0"])
    assert run(options, threading.Event()) == 1
    assert f"--grpc_front_end_processes needs the front-end program {missing}: `make setup` builds it" in caplog.text
