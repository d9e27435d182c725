"""SavedModels of the kinds TF Serving users serve, generated at test time (no downloads, no committed binaries).

- half_plus_two_tf1: a tf.compat.v1 graph saved with SavedModelBuilder, laid out like TF Serving's testdata
  saved_model_half_plus_two: y = a * x + b over x parsed from serialized tf.Examples by ParseExample (features
  "x" and "x2", both FixedLenFeature([1], float)), reference (non-resource) variables, and the signatures
  serving_default (predict x -> y, x of shape [-1, 1]), classify_x_to_y, regress_x_to_y, regress_x_to_y2 and
  regress_x2_to_y3. It also has `variables` (predict, outputs the reference-typed variable tensors a and b).
- half_plus_two_tf2: the same arithmetic as a native TF2 tf.Module (tf.saved_model.save): predict over a float
  vector, regress and classify over serialized tf.Examples.
- iris_like_classifier: a TF2 multi-class model over tf.Examples (four float features): `serving_default`
  classifies (classes [N, 3] strings and scores [N, 3]), `regress_petal` regresses one value per example.

write_warmup_logs adds assets.extra/tf_serving_warmup_requests; half_plus_two_warmup_logs has one record of each
kind TF Serving replays. Every writer takes the version directory's name, so callers can lay versions out as TF
Serving's docs and testdata do (zero-padded: 00000123).
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (classification_pb2, inference_pb2, input_pb2, predict_pb2, prediction_log_pb2,
                                     regression_pb2)

CLASSIFY = tf.saved_model.CLASSIFY_METHOD_NAME
REGRESS = tf.saved_model.REGRESS_METHOD_NAME
PREDICT = tf.saved_model.PREDICT_METHOD_NAME
IRIS_FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")
IRIS_CLASSES = (b"setosa", b"versicolor", b"virginica")


def half_plus_two(x: np.ndarray | float, a: float = 0.5, b: float = 2.0) -> np.ndarray:
    """What every half-plus-two model answers for x (the test's expectation, computed independently)."""
    return np.float32(a) * np.asarray(x, np.float32) + np.float32(b)


def _v1_signature(inputs: dict, outputs: dict, method: str):
    build = tf.compat.v1.saved_model.build_tensor_info
    return tf.compat.v1.saved_model.build_signature_def(
        {k: build(v) for k, v in inputs.items()}, {k: build(v) for k, v in outputs.items()}, method)


def write_half_plus_two_tf1(base_path: str, version_dir: str = "00000123", a: float = 0.5, b: float = 2.0,
                            c: float = 3.0) -> str:
    """The TF1 graph (ParseExample, reference variables, classify/regress/predict signatures); returns its path."""
    path = os.path.join(base_path, version_dir)
    builder = tf.compat.v1.saved_model.Builder(path)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        var_a = tf.compat.v1.Variable(a, name="a", use_resource=False)
        var_b = tf.compat.v1.Variable(b, name="b", use_resource=False)
        var_c = tf.compat.v1.Variable(c, name="c", use_resource=False)
        serialized = tf.compat.v1.placeholder(tf.string, shape=[None], name="tf_example")
        features = tf.compat.v1.io.parse_example(serialized, {
            "x": tf.io.FixedLenFeature([1], tf.float32),
            "x2": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0])})
        x = tf.identity(features["x"], name="x")
        x2 = tf.identity(features["x2"], name="x2")
        y = tf.identity(var_a * x + var_b, name="y")
        y2 = tf.identity(var_a * x + var_c, name="y2")
        y3 = tf.identity(var_a * x2 + var_c, name="y3")
        session.run(tf.compat.v1.global_variables_initializer())
        builder.add_meta_graph_and_variables(session, [tf.saved_model.SERVING], signature_def_map={
            "serving_default": _v1_signature({"x": x}, {"y": y}, PREDICT),
            "classify_x_to_y": _v1_signature({"inputs": serialized}, {"scores": y}, CLASSIFY),
            "regress_x_to_y": _v1_signature({"inputs": serialized}, {"outputs": y}, REGRESS),
            "regress_x_to_y2": _v1_signature({"inputs": serialized}, {"outputs": y2}, REGRESS),
            "regress_x2_to_y3": _v1_signature({"inputs": x2}, {"outputs": y3}, REGRESS),
            "variables": _v1_signature({"x": x}, {"a": var_a, "b": var_b}, PREDICT),
        })
    builder.save()
    return path


class HalfPlusTwo(tf.Module):
    """The TF2 half-plus-two: resource variables, tf.function signatures."""

    def __init__(self, a: float, b: float, c: float):
        super().__init__()
        self.a, self.b, self.c = tf.Variable(a, name="a"), tf.Variable(b, name="b"), tf.Variable(c, name="c")

    def _x(self, serialized):
        return tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def predict(self, x):
        return {"y": self.a * x + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress_x_to_y(self, inputs):
        return {"outputs": self.a * self._x(inputs) + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress_x_to_y2(self, inputs):
        return {"outputs": self.a * self._x(inputs) + self.c}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def classify_x_to_y(self, inputs):
        return {"scores": self.a * self._x(inputs) + self.b}


def write_half_plus_two_tf2(base_path: str, version_dir: str = "00000123", a: float = 0.5, b: float = 2.0,
                            c: float = 3.0) -> str:
    path = os.path.join(base_path, version_dir)
    module = HalfPlusTwo(a, b, c)
    tf.saved_model.save(module, path, signatures={
        "serving_default": module.predict, "regress_x_to_y": module.regress_x_to_y,
        "regress_x_to_y2": module.regress_x_to_y2, "classify_x_to_y": module.classify_x_to_y})
    return path


class IrisLikeClassifier(tf.Module):
    """A linear 3-class softmax over four float features, with a linear regression head on the same features."""

    def __init__(self, seed: int):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.kernel = tf.Variable(rng.standard_normal((4, 3)).astype(np.float32), name="kernel")
        self.bias = tf.Variable(rng.standard_normal(3).astype(np.float32), name="bias")
        self.regression_kernel = tf.Variable(rng.standard_normal((4, 1)).astype(np.float32), name="regression")

    def _features(self, serialized):
        parsed = tf.io.parse_example(serialized, {n: tf.io.FixedLenFeature([], tf.float32) for n in IRIS_FEATURES})
        return tf.stack([parsed[n] for n in IRIS_FEATURES], axis=1)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def classify(self, inputs):
        scores = tf.nn.softmax(self._features(inputs) @ self.kernel + self.bias)
        classes = tf.tile(tf.constant([IRIS_CLASSES]), [tf.shape(scores)[0], 1])
        return {"classes": classes, "scores": scores}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress_petal(self, inputs):
        return {"outputs": self._features(inputs) @ self.regression_kernel}

    def expected(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(scores [N, 3], regression [N]) for feature rows [N, 4], computed in NumPy."""
        logits = rows @ self.kernel.numpy() + self.bias.numpy()
        scores = np.exp(logits - logits.max(axis=1, keepdims=True))
        return scores / scores.sum(axis=1, keepdims=True), (rows @ self.regression_kernel.numpy())[:, 0]


def write_iris_like_classifier(base_path: str, version_dir: str = "00000001", seed: int = 0) -> IrisLikeClassifier:
    module = IrisLikeClassifier(seed)
    tf.saved_model.save(module, os.path.join(base_path, version_dir),
                        signatures={"serving_default": module.classify, "regress_petal": module.regress_petal})
    return module


def example(**features: float | list[float] | bytes | list[bytes] | int | list[int]) -> tf.train.Example:
    """A tf.train.Example from keyword features (floats, ints or bytes, one value or a list)."""
    proto = tf.train.Example()
    for name, value in features.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        feature = proto.features.feature[name]
        if all(isinstance(v, bytes) for v in values):
            feature.bytes_list.value.extend(values)
        elif all(isinstance(v, int) for v in values):
            feature.int64_list.value.extend(values)
        else:
            feature.float_list.value.extend(float(v) for v in values)
    return proto


def example_input(examples: list[tf.train.Example], context: tf.train.Example | None = None) -> input_pb2.Input:
    """TF Serving's Input: an ExampleList, or an ExampleListWithContext when a context is given."""
    message = input_pb2.Input()
    if context is None:
        message.example_list.examples.extend(examples)
    else:
        message.example_list_with_context.examples.extend(examples)
        message.example_list_with_context.context.CopyFrom(context)
    return message


def _examples_request(message_type, model: str, examples: list[tf.train.Example], signature: str,
                      context: tf.train.Example | None):
    request = message_type(input=example_input(examples, context))
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    return request


def classification_request(model: str, examples: list[tf.train.Example], signature: str = "",
                           context: tf.train.Example | None = None) -> classification_pb2.ClassificationRequest:
    return _examples_request(classification_pb2.ClassificationRequest, model, examples, signature, context)


def regression_request(model: str, examples: list[tf.train.Example], signature: str = "",
                       context: tf.train.Example | None = None) -> regression_pb2.RegressionRequest:
    return _examples_request(regression_pb2.RegressionRequest, model, examples, signature, context)


def write_warmup_logs(version_path: str, logs: list[prediction_log_pb2.PredictionLog]) -> None:
    """assets.extra/tf_serving_warmup_requests as TF Serving reads it (a TFRecord of PredictionLog)."""
    os.makedirs(os.path.join(version_path, "assets.extra"), exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(version_path, "assets.extra", "tf_serving_warmup_requests")) as writer:
        for entry in logs:
            writer.write(entry.SerializeToString())


def half_plus_two_warmup_logs(model: str) -> list[prediction_log_pb2.PredictionLog]:
    """One record of each kind TF Serving replays: Predict (the reference-typed `variables` signature), Classify,
    Regress and MultiInference."""
    examples = [example(x=1.0), example(x=3.0)]
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name, predict.model_spec.signature_name = model, "variables"
    predict.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0]], np.float32)))
    multi = inference_pb2.MultiInferenceRequest(input=example_input(examples))
    for signature, method in (("regress_x_to_y", REGRESS), ("classify_x_to_y", CLASSIFY)):
        task = multi.tasks.add(method_name=method)
        task.model_spec.name, task.model_spec.signature_name = model, signature
    logs = [prediction_log_pb2.PredictionLog(), prediction_log_pb2.PredictionLog(),
            prediction_log_pb2.PredictionLog(), prediction_log_pb2.PredictionLog()]
    logs[0].predict_log.request.CopyFrom(predict)
    logs[1].classify_log.request.CopyFrom(classification_request(model, examples, "classify_x_to_y"))
    logs[2].regress_log.request.CopyFrom(regression_request(model, examples, "regress_x_to_y2"))
    logs[3].multi_inference_log.request.CopyFrom(multi)
    return logs
