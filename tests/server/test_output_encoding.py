"""Predict outputs fill TF Serving's typed fields (float_val, int_val, string_val, ...: Tensor::AsProtoField), so
clients that read them get the values; --enable_serialization_as_tensor_content switches to tensor_content."""

from __future__ import annotations

import base64

import numpy as np
import requests
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import predict_pb2

from conftest import IRIS_SEED, tf_serving_config
from tf_serving_models import IRIS_CLASSES, IRIS_FEATURES, IrisLikeClassifier, example, half_plus_two
from tiny_models import tensor

X = np.array([[1.0], [2.0], [5.0]], np.float32)


def _half_plus_two_request() -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "half_plus_two"
    request.model_spec.version.value = 123
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(X))
    return request


def test_outputs_fill_the_typed_fields(tf_serving_server):
    y = tf_serving_server.predict.Predict(_half_plus_two_request(), timeout=60).outputs["y"]
    assert y.dtype == types_pb2.DT_FLOAT and not y.tensor_content
    assert [d.size for d in y.tensor_shape.dim] == [3, 1] and list(y.float_val) == [2.5, 3.0, 4.5]
    # A string and a float output of one signature: classes in string_val, scores in float_val.
    rows = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], np.float32)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "iris"
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto(
        [example(**dict(zip(IRIS_FEATURES, map(float, row)))).SerializeToString() for row in rows]))
    outputs = tf_serving_server.predict.Predict(request, timeout=60).outputs
    assert list(outputs["classes"].string_val) == list(IRIS_CLASSES) * 2
    np.testing.assert_allclose(np.array(outputs["scores"].float_val).reshape(2, 3),
                               IrisLikeClassifier(IRIS_SEED).expected(rows)[0], rtol=1e-5)


def test_tensor_content_when_the_flag_asks(tf_serving_models, models_dir, tmp_path, start_server):
    config = tf_serving_config(tf_serving_models, str(tmp_path / "models.config"), models_dir)
    server = start_server(f"--model_config_file={config}", "--enable_serialization_as_tensor_content=true")
    y = server.predict.Predict(_half_plus_two_request(), timeout=60).outputs["y"]
    assert not y.float_val and len(y.tensor_content) == 3 * 4
    np.testing.assert_array_equal(tensor(y), half_plus_two(X))


def test_rest_string_inputs_and_outputs(tf_serving_server):
    """DT_STRING over REST as TF Serving encodes it: {"b64": ...} in, UTF-8 text out."""
    rows = np.array([[5.1, 3.5, 1.4, 0.2]], np.float32)
    serialized = example(**dict(zip(IRIS_FEATURES, map(float, rows[0])))).SerializeToString()
    reply = requests.post(f"{tf_serving_server.rest}/v1/models/iris:predict",
                          json={"instances": [{"b64": base64.b64encode(serialized).decode()}]}, timeout=60)
    assert reply.status_code == 200, reply.text
    (prediction,) = reply.json()["predictions"]
    assert prediction["classes"] == [c.decode() for c in IRIS_CLASSES]
    np.testing.assert_allclose(prediction["scores"], IrisLikeClassifier(IRIS_SEED).expected(rows)[0][0], rtol=1e-5)
