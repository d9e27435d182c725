"""Classify, Regress and MultiInference over tf.Example inputs, through the official PredictionService stubs and
REST (:classify, :regress), with TF Serving's request and response formats and error texts, on the generated
half_plus_two (TF1, ParseExample signatures) and iris-like (TF2, classes and scores) models, batching on."""

from __future__ import annotations

import concurrent.futures

import grpc
import numpy as np
import pytest
import requests
from tensorflow_serving.apis import inference_pb2

from conftest import IRIS_SEED
from tf_serving_models import (CLASSIFY, IRIS_CLASSES, IRIS_FEATURES, REGRESS, IrisLikeClassifier,
                               classification_request, example, half_plus_two, regression_request)


def _error(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=60)
    return info.value.code(), info.value.details()


def _iris_rows(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 7.0, size=(count, 4)).astype(np.float32)


def _iris_examples(rows: np.ndarray) -> list:
    return [example(**dict(zip(IRIS_FEATURES, map(float, row)))) for row in rows]


def test_grpc_classify_returns_labels_and_scores(tf_serving_server):
    rows = _iris_rows(5, seed=1)
    reply = tf_serving_server.predict.Classify(classification_request("iris", _iris_examples(rows)), timeout=60)
    assert (reply.model_spec.name, reply.model_spec.version.value, reply.model_spec.signature_name) == (
        "iris", 1, "serving_default")
    expected_scores, _ = IrisLikeClassifier(IRIS_SEED).expected(rows)
    assert len(reply.result.classifications) == 5
    for entry, scores in zip(reply.result.classifications, expected_scores):
        assert [c.label.encode() for c in entry.classes] == list(IRIS_CLASSES)
        np.testing.assert_allclose([c.score for c in entry.classes], scores, rtol=1e-5)


def test_grpc_classify_and_regress_on_tf1_parse_example_signatures(tf_serving_server):
    examples = [example(x=1.0), example(x=4.0, x2=9.0), example(x=-2.0)]
    x = np.array([1.0, 4.0, -2.0], np.float32)
    reply = tf_serving_server.predict.Classify(
        classification_request("half_plus_two", examples, "classify_x_to_y"), timeout=60)
    assert reply.model_spec.version.value == 124  # the latest; its b is 3
    assert [[(c.label, c.score) for c in e.classes] for e in reply.result.classifications] == \
        [[("", pytest.approx(v))] for v in half_plus_two(x, b=3.0)]
    for signature, b in (("regress_x_to_y", 3.0), ("regress_x_to_y2", 3.0)):
        reply = tf_serving_server.predict.Regress(regression_request("half_plus_two", examples, signature), timeout=60)
        np.testing.assert_allclose([r.value for r in reply.result.regressions], half_plus_two(x, b=b))


def test_context_features_merge_into_every_example(tf_serving_server):
    """ExampleListWithContext: the context's features apply to each example; an example's own value wins."""
    request = regression_request("half_plus_two", [example(x=1.0), example(x2=5.0)], "regress_x_to_y",
                                 context=example(x=10.0))
    request.model_spec.version.value = 123
    reply = tf_serving_server.predict.Regress(request, timeout=60)
    np.testing.assert_allclose([r.value for r in reply.result.regressions], half_plus_two([1.0, 10.0]))


def test_concurrent_classify_requests_batch_and_stay_apart(tf_serving_server):
    """Through the batching queue: string tensors of different requests merge and each gets its own rows."""
    row_sets = [_iris_rows(1 + i % 3, seed=10 + i) for i in range(24)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda rows: tf_serving_server.predict.Classify(
            classification_request("iris", _iris_examples(rows)), timeout=60), row_sets))
    model = IrisLikeClassifier(IRIS_SEED)
    for rows, reply in zip(row_sets, replies):
        got = [[c.score for c in e.classes] for e in reply.result.classifications]
        np.testing.assert_allclose(got, model.expected(rows)[0], rtol=1e-5)


def test_multi_inference_runs_tasks_together(tf_serving_server):
    rows = _iris_rows(3, seed=4)
    request = inference_pb2.MultiInferenceRequest()
    request.input.example_list.examples.extend(_iris_examples(rows))
    for signature, method in (("serving_default", CLASSIFY), ("regress_petal", REGRESS)):
        task = request.tasks.add(method_name=method)
        task.model_spec.name, task.model_spec.signature_name = "iris", signature
    reply = tf_serving_server.predict.MultiInference(request, timeout=60)
    scores, regression = IrisLikeClassifier(IRIS_SEED).expected(rows)
    classified, regressed = reply.results
    assert (classified.model_spec.signature_name, regressed.model_spec.signature_name) == (
        "serving_default", "regress_petal")
    np.testing.assert_allclose([[c.score for c in e.classes] for e in classified.classification_result
                                .classifications], scores, rtol=1e-5)
    np.testing.assert_allclose([r.value for r in regressed.regression_result.regressions], regression, rtol=1e-5)

    duplicate = inference_pb2.MultiInferenceRequest()
    duplicate.CopyFrom(request)
    duplicate.tasks[1].model_spec.signature_name = "serving_default"
    duplicate.tasks[1].method_name = CLASSIFY
    assert _error(tf_serving_server.predict.MultiInference, duplicate) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Duplicate evaluation of signature: serving_default")
    other_model = inference_pb2.MultiInferenceRequest()
    other_model.CopyFrom(request)
    other_model.tasks[1].model_spec.name = "half_plus_two"
    assert _error(tf_serving_server.predict.MultiInference, other_model) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "All ModelSpecs in a MultiInferenceRequest must access the same model name.")
    predict_method = inference_pb2.MultiInferenceRequest()
    predict_method.CopyFrom(request)
    predict_method.tasks[1].method_name = "tensorflow/serving/predict"
    assert _error(tf_serving_server.predict.MultiInference, predict_method) == (
        grpc.StatusCode.UNIMPLEMENTED, "Unsupported signature method_name: tensorflow/serving/predict")


def test_grpc_errors_keep_tf_serving_codes_and_texts(tf_serving_server):
    classify, regress = tf_serving_server.predict.Classify, tf_serving_server.predict.Regress
    assert _error(classify, classification_request("iris", [], "")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")
    assert _error(classify, classification_request("iris", [example(x=1.0)], "nope")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "No signature was found with the name: nope")
    code, text = _error(regress, regression_request("iris", [example(x=1.0)], ""))  # a classification signature
    assert code == grpc.StatusCode.INVALID_ARGUMENT and text == "Expected one output Tensor."
    code, text = _error(classify, classification_request("tiny", [example(x=1.0)]))  # the token signature
    assert code == grpc.StatusCode.INVALID_ARGUMENT and text == "Expected one input Tensor."
    code, text = _error(regress, regression_request("half_plus_two", [example(x=1.0)], "regress_x2_to_y3"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and text == "Expects arg[inputs] to be float but string is provided"
    code, text = _error(classify, classification_request("iris", [example(sepal_length=1.0)]))  # features missing
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "is required but could not be found" in text
    code, _ = _error(classify, classification_request("missing", [example(x=1.0)]))
    assert code == grpc.StatusCode.NOT_FOUND


def test_rest_classify_and_regress_in_tf_serving_json(tf_serving_server):
    base = f"{tf_serving_server.rest}/v1/models"
    rows = _iris_rows(2, seed=7)
    body = {"examples": [dict(zip(IRIS_FEATURES, map(float, row))) for row in rows]}
    reply = requests.post(f"{base}/iris:classify", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [[label for label, _ in entry] for entry in results] == [[c.decode() for c in IRIS_CLASSES]] * 2
    np.testing.assert_allclose([[score for _, score in entry] for entry in results],
                               IrisLikeClassifier(IRIS_SEED).expected(rows)[0], rtol=1e-5)

    body = {"signature_name": "regress_x_to_y", "context": {"x": 10.0}, "examples": [{"x": 1.0}, {"x2": 5.0}]}
    reply = requests.post(f"{base}/half_plus_two/versions/123:regress", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(reply.json()["results"], half_plus_two([1.0, 10.0]))
    reply = requests.post(f"{base}/half_plus_two/versions/123:classify",
                          json={"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}, timeout=60)
    assert reply.json() == {"results": [[["", 3.0]]]}


@pytest.mark.parametrize("body, status, text", [
    ({"signature_name": "regress_x_to_y"}, 400, "key 'examples' is expected and was not found"),
    ({"examples": []}, 400, "'examples' value is an empty array"),
    ({"examples": {"x": 1.0}}, 400, "Expecting 'examples' value to be an list/array"),
    ({"examples": [{"x": [1.0, "a"]}]}, 400, "Unexpected element type in feature: x expecting type: float"),
    ({"examples": [{"x": None}]}, 400, "Feature: x has element with unexpected JSON type"),
    ({"examples": [3]}, 400, "Example must be JSON object"),
    ({"signature_name": "serving_default", "examples": [{"x": 1.0}]}, 400, "Expected one input Tensor."),
])
def test_rest_regress_errors(tf_serving_server, body, status, text):
    reply = requests.post(f"{tf_serving_server.rest}/v1/models/tiny:regress", json=body, timeout=60)
    assert reply.status_code == status and text in reply.json()["error"], reply.text
