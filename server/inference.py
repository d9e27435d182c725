"""Classify, Regress and MultiInference over tf.Example inputs, as TF Serving runs them (its classifier.cc,
regressor.cc and multi_inference.cc), for gRPC, REST (:classify, :regress) and warmup.

The examples become one DT_STRING vector of serialized tf.Examples fed to the signature's single input; with a
context, the context's bytes go before each example's, which merges the two protos as parsing reads them.
Classify and Regress run their signature through the Predict path (validation, batching queue, metrics);
MultiInference runs its signatures' outputs together in one Session run, unbatched, as TF Serving does.
Signatures are checked by their shape (one input "inputs"; outputs "classes"/"scores", or "outputs"), not by
method_name, as TF Serving does by default (--enable_signature_method_name_check off).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import TYPE_CHECKING, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (classification_pb2, inference_pb2, input_pb2, model_pb2, regression_pb2)

from bertserve.model_dir import SIGNATURE_NAME
from bertserve.server.errors import deadline_exceeded, invalid_argument, unimplemented
from bertserve.server.servable import LoadedVersion, Signature
from bertserve.server.tensors import MAX_EXPANSION_BYTES, check_dtype, is_b64_value

if TYPE_CHECKING:  # predict imports the manager, which imports warmup, which imports this module
    from bertserve.server.predict import Predictor
    from bertserve.server.rest import RestApi

CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
INPUTS, CLASSES, SCORES, OUTPUTS = "inputs", "classes", "scores", "outputs"


# ---- tf.Example inputs ---------------------------------------------------------------------------------------

def serialized_examples(message: input_pb2.Input) -> np.ndarray:
    """TF Serving's InputToSerializedExampleTensor: a [num_examples] vector of serialized tf.Examples."""
    kind = message.WhichOneof("kind")
    if kind == "example_list":
        records = [example.SerializeToString() for example in message.example_list.examples]
    elif kind == "example_list_with_context":
        context = message.example_list_with_context.context.SerializeToString()
        examples = message.example_list_with_context.examples
        # The context is copied into every example: bounded like any tensor that stands for more than it carries.
        if len(context) * max(len(examples) - 1, 0) > MAX_EXPANSION_BYTES:
            raise invalid_argument(f"a context of {len(context)} bytes copied into each of {len(examples)} examples "
                                   f"exceeds the {MAX_EXPANSION_BYTES} bytes a request may expand to")
        records = [context + example.SerializeToString() for example in examples]
    else:
        records = []
    if not records:
        raise invalid_argument("Input is empty.")
    array = np.empty(len(records), dtype=object)
    array[:] = records
    return array


def example_feed(signature: Signature, message: input_pb2.Input) -> dict[str, np.ndarray]:
    """The signature's single input fed with the serialized examples (a non-string input is refused first)."""
    (alias, info), = signature.inputs.items()
    check_dtype(alias, info, types_pb2.DT_STRING)
    return {alias: serialized_examples(message)}


# ---- signatures, checked as TF Serving's PreProcessClassification / PreProcessRegression ---------------------

def _find_signature(servable: LoadedVersion, name: str) -> Signature:
    found = servable.signatures.get(name or SIGNATURE_NAME)
    if found is None:
        raise invalid_argument(f"No signature was found with the name: {name or SIGNATURE_NAME}")
    return found


def _described(signature: Signature) -> str:
    return str(signature.signature_def).replace("\n", " ").strip()


def check_classification_signature(signature: Signature) -> None:
    if len(signature.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    if len(signature.outputs) not in (1, 2):
        raise invalid_argument(f"Expected one or two output Tensors, found {len(signature.outputs)}")
    if INPUTS not in signature.inputs:
        raise invalid_argument(f"No classification inputs found in SignatureDef: {_described(signature)}")
    if CLASSES not in signature.outputs and SCORES not in signature.outputs:
        raise invalid_argument(f"Expected classification signature outputs to contain at least one of \"{CLASSES}\" "
                               f"or \"{SCORES}\". Signature was: {_described(signature)}")


def check_regression_signature(signature: Signature) -> None:
    if len(signature.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    if len(signature.outputs) != 1:
        raise invalid_argument("Expected one output Tensor.")
    if INPUTS not in signature.inputs:
        raise invalid_argument(f"No regression inputs found in SignatureDef: {_described(signature)}")
    if OUTPUTS not in signature.outputs:
        raise invalid_argument(f"No regression outputs found in SignatureDef: {_described(signature)}")


def classification_signature(servable: LoadedVersion, name: str) -> Signature:
    signature = _find_signature(servable, name)
    check_classification_signature(signature)
    return signature


def regression_signature(servable: LoadedVersion, name: str) -> Signature:
    signature = _find_signature(servable, name)
    check_regression_signature(signature)
    return signature


# ---- outputs, checked as TF Serving's PostProcessClassificationResult / PostProcessRegressionResult ----------

def _tensor_dtype(array: np.ndarray) -> str:
    if array.dtype == object or array.dtype.kind in "SU":
        return "DT_STRING"
    return types_pb2.DataType.Name(tf.dtypes.as_dtype(array.dtype).as_datatype_enum)


def classification_result(outputs: Mapping[str, np.ndarray], num_examples: int
                          ) -> classification_pb2.ClassificationResult:
    classes, scores = outputs.get(CLASSES), outputs.get(SCORES)
    for name, array, dtype in ((CLASSES, classes, "DT_STRING"), (SCORES, scores, "DT_FLOAT")):
        if array is None:
            continue
        if array.ndim != 2:
            raise invalid_argument(f"Expected Tensor shape: [batch_size num_classes] but got {list(array.shape)}")
        if _tensor_dtype(array) != dtype:
            raise invalid_argument(f"Expected {name} Tensor of {dtype}. Got: {_tensor_dtype(array)}")
        if array.shape[0] != num_examples:
            raise invalid_argument(f"Expected {name} output batch size of {num_examples}. Got: {array.shape[0]}")
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise invalid_argument(f"Tensors class and score should match in dim_size(1). Got {classes.shape[1]} vs. "
                               f"{scores.shape[1]}")
    num_classes = (classes if classes is not None else scores).shape[1]
    result = classification_pb2.ClassificationResult()
    for row in range(num_examples):
        entry = result.classifications.add()
        for column in range(num_classes):
            item = entry.classes.add()
            if classes is not None:
                label = classes[row, column]
                item.label = label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
            if scores is not None:
                item.score = float(scores[row, column])
    return result


def regression_result(outputs: Mapping[str, np.ndarray], num_examples: int) -> regression_pb2.RegressionResult:
    values = outputs[OUTPUTS]
    if not (values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)):
        raise invalid_argument(f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
                               f"{list(values.shape)}")
    if values.shape[0] != num_examples:
        raise invalid_argument(f"Input batch size did not match output batch size: {num_examples} vs. "
                               f"{values.shape[0]}")
    if _tensor_dtype(values) != "DT_FLOAT":
        raise invalid_argument(f"Expected output Tensor of DT_FLOAT.  Got: {_tensor_dtype(values)}")
    result = regression_pb2.RegressionResult()
    for value in values.reshape(-1).tolist():
        result.regressions.add().value = value
    return result


def _model_spec(target: model_pb2.ModelSpec, name: str, version: int, signature_name: str) -> None:
    target.name = name
    target.version.value = version
    target.signature_name = signature_name


# ---- Classify and Regress --------------------------------------------------------------------------------------

async def _run_examples(predictor: Predictor, request, version: int | None, label: str | None,
                        deadline: float | None, entrypoint: str, api: str, select_signature, make_result):
    """Classify or Regress: the examples through the signature's batching queue, the outputs checked into a
    result. Returns (PredictResult, result)."""
    feed: dict[str, np.ndarray] = {}

    def inputs_of(signature: Signature) -> dict[str, np.ndarray]:
        feed.update(example_feed(signature, request.input))
        return feed

    ran = await predictor.predict(
        model_name=request.model_spec.name, version=version, label=label,
        signature_name=request.model_spec.signature_name, select_signature=select_signature, inputs_of=inputs_of,
        output_filter=[], deadline=deadline, entrypoint=entrypoint, api=api)
    return ran, make_result(ran.outputs, len(next(iter(feed.values()))))


async def classify(predictor: Predictor, request: classification_pb2.ClassificationRequest, version: int | None,
                   label: str | None, deadline: float | None, entrypoint: str
                   ) -> classification_pb2.ClassificationResponse:
    """PredictionService.Classify (and REST :classify)."""
    ran, result = await _run_examples(predictor, request, version, label, deadline, entrypoint, "classify",
                                      classification_signature, classification_result)
    response = classification_pb2.ClassificationResponse(result=result)
    _model_spec(response.model_spec, ran.model_name, ran.version, ran.signature_name)
    return response


async def regress(predictor: Predictor, request: regression_pb2.RegressionRequest, version: int | None,
                  label: str | None, deadline: float | None, entrypoint: str) -> regression_pb2.RegressionResponse:
    """PredictionService.Regress (and REST :regress)."""
    ran, result = await _run_examples(predictor, request, version, label, deadline, entrypoint, "regress",
                                      regression_signature, regression_result)
    response = regression_pb2.RegressionResponse(result=result)
    _model_spec(response.model_spec, ran.model_name, ran.version, ran.signature_name)
    return response


# ---- MultiInference ----------------------------------------------------------------------------------------------

class MultiInferencePlan:
    """A MultiInferenceRequest's tasks checked against one version (TF Serving's texts): the signatures and the
    one set of tensors a single Session run feeds and fetches."""

    def __init__(self, servable: LoadedVersion, request: inference_pb2.MultiInferenceRequest):
        self.servable = servable
        self.tasks: list[tuple[inference_pb2.InferenceTask, Signature]] = []
        model_name, seen = "", set()
        if not request.tasks:
            raise invalid_argument("MultiInferenceRequest has no tasks")
        for task in request.tasks:
            if not task.model_spec.name:
                raise invalid_argument("Found ModelSpec with an empty model name.")
            if model_name and task.model_spec.name != model_name:
                raise invalid_argument("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
            model_name = task.model_spec.name
            key = task.model_spec.signature_name or SIGNATURE_NAME
            if key in seen:
                raise invalid_argument(f"Duplicate evaluation of signature: {key}")
            seen.add(key)
            signature = servable.signatures.get(key)
            if signature is None:
                raise invalid_argument(f"Requested signature not found in model graph: {key}")
            if task.method_name == CLASSIFY_METHOD:
                check_classification_signature(signature)
            elif task.method_name == REGRESS_METHOD:
                check_regression_signature(signature)
            else:
                raise unimplemented(f"Unsupported signature method_name: {task.method_name}")
            self.tasks.append((task, signature))
        self.feeds = sorted({signature.inputs[INPUTS].name for _, signature in self.tasks})
        self.fetches = sorted({info.name for _, signature in self.tasks for info in signature.outputs.values()})

    def run(self, message: input_pb2.Input) -> inference_pb2.MultiInferenceResponse:
        """One Session run feeding the examples to every task's input; blocking (run it off the event loop)."""
        examples = serialized_examples(message)
        for _, signature in self.tasks:
            check_dtype(INPUTS, signature.inputs[INPUTS], types_pb2.DT_STRING)
        values = dict(zip(self.fetches, self.servable.bundle.run({name: examples for name in self.feeds},
                                                                 self.fetches)))
        response = inference_pb2.MultiInferenceResponse()
        for task, signature in self.tasks:
            outputs = {alias: values[info.name] for alias, info in signature.outputs.items()}
            entry = response.results.add()
            if task.method_name == CLASSIFY_METHOD:
                entry.classification_result.CopyFrom(classification_result(outputs, len(examples)))
            else:
                entry.regression_result.CopyFrom(regression_result(outputs, len(examples)))
            _model_spec(entry.model_spec, task.model_spec.name, self.servable.version, signature.key)
        return response


async def multi_inference(predictor: Predictor, request: inference_pb2.MultiInferenceRequest, version: int | None,
                          label: str | None, deadline: float | None, entrypoint: str
                          ) -> inference_pb2.MultiInferenceResponse:
    """PredictionService.MultiInference: the version named by the first task's model spec, as in TF Serving."""
    model_name = request.tasks[0].model_spec.name if request.tasks else ""
    with predictor.recorded(model_name, "multi_inference", entrypoint):
        with predictor.manager.serving(model_name, version, label) as handle:
            plan = MultiInferencePlan(handle.servable, request)
            if deadline is not None and time.monotonic() >= deadline:
                raise deadline_exceeded("Deadline exceeded before the MultiInference run started")
            return await asyncio.get_running_loop().run_in_executor(predictor.blocking_threads, plan.run,
                                                                    request.input)


# ---- REST: TF Serving's JSON for :classify and :regress ----------------------------------------------------------

def _json_debug(value: object, limit: int = 200) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[:limit] + "..."


def _feature_from_json(name: str, content: object, feature: tf.train.Feature) -> None:
    """TF Serving's AddValueToFeature: numbers with a fraction are floats, integers and booleans int64, strings and
    {"b64": ...} bytes; one kind per feature."""
    kinds = {"float_list": "float", "int64_list": "int64", "bytes_list": "bytes"}
    for value in content if isinstance(content, list) else [content]:
        if isinstance(value, bool) or isinstance(value, int):
            kind, item = "int64_list", int(value)
            if not -(1 << 63) <= item < (1 << 63):
                raise invalid_argument(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
        elif isinstance(value, float):
            kind, item = "float_list", value
        elif isinstance(value, str):
            kind, item = "bytes_list", value.encode("utf-8")
        elif is_b64_value(value):
            kind = "bytes_list"
            try:
                item = base64.b64decode(value["b64"], validate=True)
            except ValueError as exc:
                raise invalid_argument(f"JSON Value: {_json_debug(value)} not formatted correctly for base64 "
                                       f"data") from exc
        else:
            raise invalid_argument(f"Feature: {name} has element with unexpected JSON type: "
                                   f"{type(value).__name__}")
        current = feature.WhichOneof("kind")
        if current is not None and current != kind:
            raise invalid_argument(f"Unexpected element type in feature: {name} expecting type: {kinds[current]}")
        getattr(feature, kind).value.append(item)


def _example_from_json(value: object, example: tf.train.Example) -> None:
    if not isinstance(value, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {type(value).__name__}")
    for name, content in value.items():
        _feature_from_json(name, content, example.features.feature[name])


def input_from_json(body: object, method: str) -> tuple[str, input_pb2.Input]:
    """TF Serving's FillClassifyRegressRequestFromJson: (signature_name, Input) from a :classify/:regress body."""
    if not isinstance(body, dict):
        raise invalid_argument(f"JSON Value: {_json_debug(body)} Is not object")
    signature_name = body.get("signature_name", "")
    if not isinstance(signature_name, str):
        raise invalid_argument(f"JSON Value: {_json_debug(signature_name)} not formatted correctly. "
                               f"'signature_name' key must be a string value.")
    message = input_pb2.Input()
    target = message.example_list
    if "context" in body:
        _example_from_json(body["context"], message.example_list_with_context.context)
        target = message.example_list_with_context
    examples = body.get("examples")
    if "examples" not in body:
        raise invalid_argument(f"JSON Value: {_json_debug(body)} When method is {method}, key 'examples' is "
                               f"expected and was not found")
    if not isinstance(examples, list):
        raise invalid_argument(f"JSON Value: {_json_debug(body)} Expecting 'examples' value to be an list/array")
    if not examples:
        raise invalid_argument(f"JSON Value: {_json_debug(body)} 'examples' value is an empty array")
    for value in examples:
        _example_from_json(value, target.examples.add())
    return signature_name, message


async def _rest_examples(api: "RestApi", method: str, name: str, version: int | None, label: str | None,
                         raw: bytes) -> dict:
    body = await api.parse_json(raw)
    signature_name, message = input_from_json(body, method)
    spec = model_pb2.ModelSpec(name=name, signature_name=signature_name)
    deadline = time.monotonic() + api.timeout_seconds
    if method == "classify":
        response = await classify(api.predictor, classification_pb2.ClassificationRequest(model_spec=spec,
                                                                                          input=message),
                                  version, label, deadline, "REST")
        return {"results": [[[item.label, item.score] for item in entry.classes]
                            for entry in response.result.classifications]}
    response = await regress(api.predictor, regression_pb2.RegressionRequest(model_spec=spec, input=message),
                             version, label, deadline, "REST")
    return {"results": [entry.value for entry in response.result.regressions]}


async def rest_classify(api: "RestApi", name: str, version: int | None, label: str | None, raw: bytes) -> dict:
    """POST .../<model>:classify: TF Serving's {"examples": [...], "context": ...} -> {"results": [[[label, score],
    ...], ...]}."""
    return await _rest_examples(api, "classify", name, version, label, raw)


async def rest_regress(api: "RestApi", name: str, version: int | None, label: str | None, raw: bytes) -> dict:
    """POST .../<model>:regress: the same request body -> {"results": [value, ...]}."""
    return await _rest_examples(api, "regress", name, version, label, raw)
