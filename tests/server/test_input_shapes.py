"""Inputs reach the graph in any shape the graph accepts, as TF Serving passes them through (a vector where the
SignatureDef says [-1, 1], scalars); only signatures of the bertserve token contract keep the fused op's strict
checks."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from tf_serving_models import example, half_plus_two
from tiny_models import predict_request, tensor, token_inputs


def _predict(model: str, x, version: int | None = None) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(x, dtype=tf.float32))
    return request


def test_rest_instances_vector_against_a_column_signature(tf_serving_server):
    """TF Serving's own REST example: half_plus_two's x is [-1, 1] in its SignatureDef."""
    reply = requests.post(f"{tf_serving_server.rest}/v1/models/half_plus_two/versions/123:predict",
                          json={"instances": [1.0, 2.0, 5.0]}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"predictions": [2.5, 3.0, 4.5]}
    grpc_reply = tf_serving_server.predict.Predict(_predict("half_plus_two", [1.0, 2.0, 5.0], 123), timeout=60)
    assert list(grpc_reply.outputs["y"].tensor_shape.dim) and tensor(grpc_reply.outputs["y"]).tolist() == [
        2.5, 3.0, 4.5]


def test_scalars_pass_through_without_batching(tf_serving_server_unbatched):
    server = tf_serving_server_unbatched
    for model, b in (("half_plus_two", 3.0), ("half_plus_two_tf2", 2.0)):
        reply = server.predict.Predict(_predict(model, 4.0), timeout=60)
        assert not reply.outputs["y"].tensor_shape.dim and tensor(reply.outputs["y"]) == half_plus_two(4.0, b=b)
    reply = requests.post(f"{server.rest}/v1/models/half_plus_two_tf2:predict", json={"inputs": 4.0}, timeout=60)
    assert reply.json() == {"outputs": 4.0}


def test_a_shape_the_graph_refuses_fails_in_the_graph(tf_serving_server):
    """Nothing checks shapes against the SignatureDef: ParseExample's own error comes back (INVALID_ARGUMENT)."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "iris"
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto([[example(sepal_length=1.0).SerializeToString()]]))
    with pytest.raises(grpc.RpcError) as info:
        tf_serving_server.predict.Predict(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "serialized" in info.value.details()


@pytest.mark.parametrize("change", ["rank 1", "rank 3", "shapes differ"])
def test_token_contract_signatures_keep_the_op_checks(tf_serving_server, change):
    inputs = token_inputs(2, 8)
    if change == "rank 1":
        inputs = {name: value[0] for name, value in inputs.items()}
    elif change == "rank 3":
        inputs = {name: value[..., np.newaxis] for name, value in inputs.items()}
    else:
        inputs["input_mask"] = inputs["input_mask"][:, :4]
    with pytest.raises(grpc.RpcError) as info:
        tf_serving_server.predict.Predict(predict_request("tiny", inputs), timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input_ids, input_mask and segment_ids must share one [batch, seq] shape" in info.value.details()
