"""Predict / metadata / status over gRPC (official tensorflow_serving.apis stubs) and REST, errors, batching."""

from __future__ import annotations

import http.client
import json
import os
import socket

import grpc
import numpy as np
import pytest
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                     model_pb2)

from bertserve.server.metrics import UNKNOWN_MODEL_LABEL
from serving_harness import METRICS_PATH, ServerProcess, metric_total
from tiny_models import VOCAB, direct_scores, predict_request, tensor, token_inputs


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    config_dir = tmp_path_factory.mktemp("config")
    (config_dir / "models.config").write_text(f"""
model_config_list {{
  config {{
    name: "tiny" base_path: "{models_dir}/tiny" model_platform: "tensorflow"
    model_version_policy {{ all {{}} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 2 }}
  }}
  config {{ name: "other" base_path: "{models_dir}/tiny" model_version_policy {{ specific {{ versions: 1 }} }} }}
}}""")
    (config_dir / "batching.txt").write_text(
        "max_batch_size { value: 32 } batch_timeout_micros { value: 20000 } max_enqueued_batches { value: 100 } "
        "num_batch_threads { value: 1 }")
    (config_dir / "monitoring.config").write_text(f'prometheus_config {{ enable: true path: "{METRICS_PATH}" }}')
    process = ServerProcess(f"--model_config_file={config_dir}/models.config", "--enable_batching=true",
                            f"--batching_parameters_file={config_dir}/batching.txt",
                            f"--monitoring_config_file={config_dir}/monitoring.config",
                            log_dir=str(config_dir)).wait_ready()
    yield process
    assert process.terminate() == 0


def _code(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value.code()


def test_grpc_predict_equals_direct_savedmodel_call(server, models_dir):
    inputs = token_inputs(5, 12, seed=3)
    for version in (1, 2):
        reply = server.predict.Predict(predict_request("tiny", inputs, version=version), timeout=30)
        assert reply.model_spec.name == "tiny" and reply.model_spec.version.value == version
        assert reply.model_spec.signature_name == "serving_default"
        expected = direct_scores(os.path.join(models_dir, "tiny", str(version)), inputs)
        np.testing.assert_allclose(tensor(reply.outputs["scores"]), expected, rtol=0, atol=1e-5)


def test_latest_and_labels_pick_the_right_version(server):
    inputs = token_inputs(2, 8)
    assert server.predict.Predict(predict_request("tiny", inputs), timeout=30).model_spec.version.value == 2
    assert server.predict.Predict(predict_request("tiny", inputs, label="stable"), timeout=30).model_spec.version.value == 1
    assert server.predict.Predict(predict_request("other", inputs), timeout=30).model_spec.version.value == 1
    assert _code(server.predict.Predict, predict_request("tiny", inputs, label="nope"), timeout=30) == \
        grpc.StatusCode.INVALID_ARGUMENT


def test_rest_equals_grpc_in_row_and_columnar_form(server):
    inputs = token_inputs(4, 10, seed=7)
    grpc_scores = tensor(server.predict.Predict(predict_request("tiny", inputs), timeout=30).outputs["scores"])
    rows = [{name: value[i].tolist() for name, value in inputs.items()} for i in range(4)]
    row_reply = requests.post(f"{server.rest}/v1/models/tiny:predict", json={"instances": rows}, timeout=30)
    assert row_reply.status_code == 200
    np.testing.assert_allclose(row_reply.json()["predictions"], grpc_scores, rtol=0, atol=1e-6)
    columnar = {"inputs": {name: value.tolist() for name, value in inputs.items()}}
    for url in ("/v1/models/tiny/versions/2:predict", "/v1/models/tiny/labels/canary:predict"):
        reply = requests.post(server.rest + url, json=columnar, timeout=30)
        assert reply.status_code == 200, reply.text
        np.testing.assert_allclose(reply.json()["outputs"], grpc_scores, rtol=0, atol=1e-6)


def _exchange_until_closed(server, request: bytes) -> tuple[bytes, bytes]:
    """Sends a raw HTTP request on a new connection and reads until the server closes it: (head, body)."""
    with socket.create_connection(server.rest_address, timeout=30) as raw:
        raw.sendall(request)
        received = b""
        while chunk := raw.recv(65536):
            received += chunk
    head, _, payload = received.partition(b"\r\n\r\n")
    return head, payload


def test_rest_keeps_connections_alive_and_closes_one_after_a_refused_length(server):
    """HTTP/1.1 persistent connections, as TF Serving's HTTP server: several requests over one TCP connection."""
    connection = http.client.HTTPConnection(*server.rest_address, timeout=30)
    body = json.dumps({"inputs": {name: value.tolist() for name, value in token_inputs(2, 8).items()}})
    sockets = []
    for _ in range(3):
        connection.request("POST", "/v1/models/tiny:predict", body=body,
                           headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        assert (reply.status, reply.version, reply.getheader("Connection")) == (200, 11, None)
        assert len(json.loads(reply.read())["outputs"]) == 2
        sockets.append(connection.sock)
    assert sockets[0] is not None and all(sock is sockets[0] for sock in sockets)
    connection.close()

    # A refused Content-Length leaves the body unread, so the server answers and closes rather than parse it.
    head, payload = _exchange_until_closed(
        server, b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: test\r\nContent-Length: -5\r\n\r\n{}")
    assert head.split(b" ", 2)[1] == b"400"
    assert "Content-Length" in json.loads(payload)["error"]

    # An HTTP/1.0 client (no keep-alive asked for) gets its answer and the connection closed after it.
    head, payload = _exchange_until_closed(server, b"GET /v1/models/tiny HTTP/1.0\r\n\r\n")
    assert head.split(b" ", 2)[1] == b"200"
    assert {status["version"] for status in json.loads(payload)["model_version_status"]} == {"1", "2"}


def test_multi_output_signature_and_output_filter(server):
    inputs = token_inputs(3, 6, seed=1)
    both = server.predict.Predict(predict_request("tiny", inputs, signature="scores_and_logits"), timeout=30)
    assert set(both.outputs) == {"scores", "logits"}
    request = predict_request("tiny", inputs, signature="scores_and_logits")
    request.output_filter.append("logits")
    only = server.predict.Predict(request, timeout=30)
    assert set(only.outputs) == {"logits"}
    np.testing.assert_allclose(1 / (1 + np.exp(-tensor(only.outputs["logits"]))), tensor(both.outputs["scores"]),
                               atol=1e-6)
    rows = [{name: value[i].tolist() for name, value in inputs.items()} for i in range(3)]
    reply = requests.post(f"{server.rest}/v1/models/tiny:predict",
                          json={"signature_name": "scores_and_logits", "instances": rows}, timeout=30).json()
    assert [sorted(row) for row in reply["predictions"]] == [["logits", "scores"]] * 3
    request.output_filter[:] = ["nope"]
    assert _code(server.predict.Predict, request, timeout=30) == grpc.StatusCode.INVALID_ARGUMENT


def test_metadata_over_grpc_and_rest(server):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "tiny"
    reply = server.predict.GetModelMetadata(request, timeout=30)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    reply.metadata["signature_def"].Unpack(signature_map)
    serving = signature_map.signature_def["serving_default"]
    assert sorted(serving.inputs) == ["input_ids", "input_mask", "segment_ids"]
    assert list(serving.outputs) == ["scores"] and reply.model_spec.version.value == 2
    rest = requests.get(f"{server.rest}/v1/models/tiny/versions/1/metadata", timeout=30).json()
    assert rest["model_spec"]["version"] == "1"
    assert set(rest["metadata"]["signature_def"]["signature_def"]) == {"serving_default", "scores_and_logits"}


def test_model_status_over_grpc_and_rest(server):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "tiny"
    reply = server.models.GetModelStatus(request, timeout=30)
    assert [(s.version, s.state) for s in reply.model_version_status] == [
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE), (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]
    rest = requests.get(f"{server.rest}/v1/models/tiny/labels/stable", timeout=30).json()
    assert rest == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    request.model_spec.name = "missing"
    assert _code(server.models.GetModelStatus, request, timeout=30) == grpc.StatusCode.NOT_FOUND
    assert requests.get(f"{server.rest}/v1/models/missing", timeout=30).status_code == 404


def _with(inputs: dict, **changes) -> dict:
    out = dict(inputs)
    for key, value in changes.items():
        if value is None:
            out.pop(key)
        else:
            out[key] = value
    return out


BAD_REQUESTS = {
    "unknown model": (lambda i: predict_request("missing", i), grpc.StatusCode.NOT_FOUND, 404),
    "unknown version": (lambda i: predict_request("tiny", i, version=9), grpc.StatusCode.NOT_FOUND, 404),
    "unknown signature": (lambda i: predict_request("tiny", i, signature="nope"),
                          grpc.StatusCode.FAILED_PRECONDITION, 400),
    "missing input": (lambda i: predict_request("tiny", _with(i, segment_ids=None)),
                      grpc.StatusCode.INVALID_ARGUMENT, 400),
    "extra input": (lambda i: predict_request("tiny", _with(i, extra=i["input_ids"])),
                    grpc.StatusCode.INVALID_ARGUMENT, 400),
    "wrong dtype": (lambda i: predict_request("tiny", _with(i, input_ids=i["input_ids"].astype(np.int64))),
                    grpc.StatusCode.INVALID_ARGUMENT, 400),
    "wrong rank": (lambda i: predict_request("tiny", _with(i, input_mask=i["input_mask"][0])),
                   grpc.StatusCode.INVALID_ARGUMENT, 400),
    "mismatched shapes": (lambda i: predict_request("tiny", _with(i, input_mask=i["input_mask"][:, :4])),
                          grpc.StatusCode.INVALID_ARGUMENT, 400),
    "id beyond vocab": (lambda i: predict_request("tiny", _with(i, input_ids=i["input_ids"] + VOCAB)),
                        grpc.StatusCode.INVALID_ARGUMENT, 400),
    "negative id": (lambda i: predict_request("tiny", _with(i, input_ids=i["input_ids"] - VOCAB)),
                    grpc.StatusCode.INVALID_ARGUMENT, 400),
    "segment beyond type vocab": (lambda i: predict_request("tiny", _with(i, segment_ids=i["segment_ids"] + 2)),
                                  grpc.StatusCode.INVALID_ARGUMENT, 400),
    "longer than positions": (lambda i: predict_request("tiny", token_inputs(2, 40)),
                              grpc.StatusCode.INVALID_ARGUMENT, 400),
    "larger than max_batch_size": (lambda i: predict_request("tiny", token_inputs(33, 4)),
                                   grpc.StatusCode.INVALID_ARGUMENT, 400),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_get_tf_serving_codes_over_grpc_and_rest(server, case):
    make, code, http_status = BAD_REQUESTS[case]
    request = make(token_inputs(2, 8))
    assert _code(server.predict.Predict, request, timeout=30) == code
    from tiny_models import tensor as decode
    spec = request.model_spec
    url = f"{server.rest}/v1/models/{spec.name}" + (f"/versions/{spec.version.value}" if spec.HasField("version") else "")
    body = {"inputs": {name: decode(proto).tolist() for name, proto in request.inputs.items()}}
    if spec.signature_name:
        body["signature_name"] = spec.signature_name
    reply = requests.post(url + ":predict", json=body, timeout=30)
    # Over REST the JSON carries no dtype: an int64 array of small ids is valid int32 there.
    if case != "wrong dtype":
        assert reply.status_code == http_status, reply.text
        assert reply.json()["error"]


def test_classify_on_a_token_signature_and_health(server):
    """Classify is served (test_classify_regress.py); the ranker's signature is no classification signature."""
    request = classification_pb2.ClassificationRequest(model_spec=model_pb2.ModelSpec(name="tiny"))
    request.input.example_list.examples.add()
    with pytest.raises(grpc.RpcError) as info:
        server.predict.Classify(request, timeout=30)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Expected one input Tensor.")
    reply = requests.post(f"{server.rest}/v1/models/tiny:classify", json={"examples": [{"x": 1.0}]}, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"] == "Expected one input Tensor."
    health = health_pb2_grpc.HealthStub(server.channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="tensorflow.serving.PredictionService"),
                        timeout=10).status == health_pb2.HealthCheckResponse.SERVING


def test_concurrent_single_row_requests_merge_into_batches(server):
    """64 single-row requests at once with max_batch_size 32: every row is batched once, batches are large."""
    def batch_stats() -> tuple[float, float]:
        text = server.metrics_text()
        labels = {"model_name": "tiny", "signature": "serving_default"}
        return (metric_total(text, "bertserve_batch_size_sum", **labels),
                metric_total(text, "bertserve_batch_size_count", **labels))

    rows_before, batches_before = batch_stats()
    inputs = token_inputs(64, 8, seed=11)
    futures = [server.predict.Predict.future(
        predict_request("tiny", {n: v[i:i + 1] for n, v in inputs.items()}, version=2), timeout=60)
        for i in range(64)]
    scores = np.concatenate([tensor(f.result().outputs["scores"]) for f in futures])
    rows_after, batches_after = batch_stats()
    rows, batches = rows_after - rows_before, batches_after - batches_before
    assert rows == 64
    assert rows / batches >= 8, f"{batches} batches for 64 rows"
    whole = tensor(server.predict.Predict(predict_request("tiny", {n: v[:32] for n, v in inputs.items()},
                                                          version=2), timeout=30).outputs["scores"])
    np.testing.assert_allclose(scores[:32], whole, atol=1e-5)


def test_metrics_keep_tf_serving_names(server):
    """One OK and one NOT_FOUND Predict made here each add exactly 1 to TF Serving's request_count."""
    before = server.metrics_text()
    server.predict.Predict(predict_request("tiny", token_inputs(1, 8)), timeout=30)
    assert _code(server.predict.Predict, predict_request("missing", token_inputs(1, 8)),
                 timeout=30) == grpc.StatusCode.NOT_FOUND
    text = server.metrics_text()
    assert "# TYPE :tensorflow:serving:request_count counter" in text
    for labels in ({"model_name": "tiny", "status": "OK"}, {"model_name": UNKNOWN_MODEL_LABEL, "status": "NOT_FOUND"}):
        added = (metric_total(text, ":tensorflow:serving:request_count", **labels)
                 - metric_total(before, ":tensorflow:serving:request_count", **labels))
        assert added == 1, labels
    for name in (":tensorflow:serving:request_latency_bucket", ":tensorflow:serving:batching:batch_size_bucket",
                 ":tensorflow:serving:batching:processed_batch_size_v2",
                 ":tensorflow:serving:batching_session:queuing_latency_count", "bertserve_queue_delay_seconds_bucket"):
        assert name in text, name
