"""TF Serving's answers to a request naming no model, a malformed /v1 URL and an unparsable version: client
errors (INVALID_ARGUMENT, HTTP 400), not NOT_FOUND or a dropped connection."""

from __future__ import annotations

import grpc
import pytest
import requests
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

from tiny_models import predict_request, token_inputs


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def _code(call, request) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    return info.value.code()


def test_empty_model_spec_is_invalid_argument(server):
    assert _code(server.predict.Predict, predict_request("", token_inputs(1, 8))) == grpc.StatusCode.INVALID_ARGUMENT
    no_spec = predict_request("tiny", token_inputs(1, 8))
    no_spec.ClearField("model_spec")
    assert _code(server.predict.Predict, no_spec) == grpc.StatusCode.INVALID_ARGUMENT
    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    assert _code(server.predict.GetModelMetadata, metadata) == grpc.StatusCode.INVALID_ARGUMENT
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = ""
    assert _code(server.models.GetModelStatus, status) == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/models/"), ("GET", "/v1/models/tiny/versions/"), ("GET", "/v1/models/tiny/versions/x"),
    ("GET", "/v1/models/tiny/labels/"), ("POST", "/v1/models/tiny:nosuchverb"), ("GET", "/v1/models/tiny:predict"),
    ("GET", "/v1/models/tiny/metadata/extra"), ("GET", "/v2/models/tiny")])
def test_malformed_urls_get_400(server, method, path):
    reply = requests.request(method, server.rest + path, data=b"{}", timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"].startswith("Malformed request")


def test_an_unparsable_version_gets_400_not_a_dropped_connection(server):
    for version in ("9" * 5000, "9223372036854775808", "-9223372036854775809"):
        reply = requests.get(f"{server.rest}/v1/models/tiny/versions/{version}", timeout=30)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"].startswith("Failed to convert version")
    largest = requests.get(f"{server.rest}/v1/models/tiny/versions/9223372036854775807", timeout=30)
    assert largest.status_code == 404  # a valid int64 that names no version


def test_rest_metadata_prints_default_valued_fields(server):
    """TF Serving's json_util prints every field: a known shape's unknown_rank false, an empty method's ''."""
    reply = requests.get(f"{server.rest}/v1/models/tiny/metadata", timeout=30).json()
    assert reply["model_spec"] == {"name": "tiny", "signature_name": "", "version": "2"}
    signature = reply["metadata"]["signature_def"]["signature_def"]["serving_default"]
    shape = signature["inputs"]["input_ids"]["tensor_shape"]
    assert shape["unknown_rank"] is False
    assert [dim["size"] for dim in shape["dim"]] == ["-1", "-1"]
    assert all(dim["name"] == "" for dim in shape["dim"])
