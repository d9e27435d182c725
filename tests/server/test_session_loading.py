"""SavedModels load as TF Serving loads them, a tf.compat.v1 Session over the MetaGraph, and serve through it:
a TF1 graph that tf.saved_model.load refuses (reference-typed outputs, ParseExample), a TF2 model, versions in
zero-padded directories, and warmup records of every kind TF Serving replays."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2, predict_pb2

from tf_serving_models import half_plus_two
from tiny_models import tensor


def _predict(model: str, signature: str = "", version: int | None = None, **inputs) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = model, signature
    if version is not None:
        request.model_spec.version.value = version
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return request


def test_tf1_model_that_function_loading_refuses_serves_every_version(tf_serving_models,
                                                                     tf_serving_server_unbatched):
    server = tf_serving_server_unbatched
    path = os.path.join(tf_serving_models, "half_plus_two", "00000123")
    with pytest.raises(tf.errors.InvalidArgumentError, match="reference type"):
        tf.saved_model.load(path)  # the kind of model this test is about: it loads only into a Session
    x = np.array([[1.0], [2.0], [5.0]], np.float32)
    for version, b in ((123, 2.0), (124, 3.0)):
        reply = server.predict.Predict(_predict("half_plus_two", version=version, x=x), timeout=60)
        assert reply.model_spec.version.value == version and reply.model_spec.signature_name == "serving_default"
        np.testing.assert_allclose(tensor(reply.outputs["y"]), half_plus_two(x, b=b))
    latest = server.predict.Predict(_predict("half_plus_two", x=x), timeout=60)
    assert latest.model_spec.version.value == 124
    # Outputs that are the reference-typed variables themselves (scalars: no batching on this server).
    reply = server.predict.Predict(_predict("half_plus_two", "variables", 123, x=x), timeout=60)
    assert (float(tensor(reply.outputs["a"])), float(tensor(reply.outputs["b"]))) == (0.5, 2.0)


def test_batched_output_without_batch_dimension_is_failed_precondition(tf_serving_server):
    """As TF Serving's batching session: every output of a batched signature needs the batch dimension; the
    reference-typed scalars of "variables" lack it, and the request says so instead of failing as INTERNAL."""
    x = np.array([[1.0], [2.0]], np.float32)
    with pytest.raises(grpc.RpcError) as info:
        tf_serving_server.predict.Predict(_predict("half_plus_two", "variables", 123, x=x), timeout=60)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value.details()
    assert "Batched output tensor has 0 dimensions" in info.value.details()


def test_tf2_model_serves_through_the_session(tf_serving_server_unbatched):
    server = tf_serving_server_unbatched
    x = np.array([0.0, 4.0, -2.0], np.float32)
    reply = server.predict.Predict(_predict("half_plus_two_tf2", x=x), timeout=60)
    assert reply.model_spec.version.value == 123
    np.testing.assert_allclose(tensor(reply.outputs["y"]), half_plus_two(x))


def test_warmup_replays_each_log_kind_before_the_version_serves(tf_serving_server_unbatched):
    """Predict on reference-typed outputs, Classify, Regress and MultiInference records all ran at load."""
    server = tf_serving_server_unbatched
    assert "model half_plus_two version 123: warmed up with 4 requests" in server.log()
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "half_plus_two"
    states = {s.version: s.state for s in server.models.GetModelStatus(request, timeout=30)
              .model_version_status}
    assert states == {123: get_model_status_pb2.ModelVersionStatus.AVAILABLE,
                      124: get_model_status_pb2.ModelVersionStatus.AVAILABLE}
