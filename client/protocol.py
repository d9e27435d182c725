"""PredictRequest <-> tensors for both TF Serving front ends: gRPC (official stubs) and REST (JSON)."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from bertserve.client.padding import PaddedBatch
from bertserve.model_dir import OUTPUT_NAME, SIGNATURE_NAME


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which servable answers: a model name plus at most one of a version number or a version label."""

    name: str
    signature_name: str = SIGNATURE_NAME
    version: int | None = None
    version_label: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a model name is required")
        if self.version is not None and self.version_label is not None:
            raise ValueError("give a version or a version label, not both")

    def rest_path(self) -> str:
        """`/v1/models/<name>[/versions/<v>|/labels/<l>]` as in TF Serving's REST API."""
        path = f"/v1/models/{self.name}"
        if self.version is not None:
            path += f"/versions/{self.version}"
        elif self.version_label is not None:
            path += f"/labels/{self.version_label}"
        return path


def grpc_request(batch: PaddedBatch, spec: ModelSpec, output: str = OUTPUT_NAME) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = spec.name
    request.model_spec.signature_name = spec.signature_name
    if spec.version is not None:
        request.model_spec.version.value = spec.version
    elif spec.version_label is not None:
        request.model_spec.version_label = spec.version_label
    for name, array in batch.as_inputs().items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    request.output_filter.append(output)
    return request


def grpc_scores(response: predict_pb2.PredictResponse, output: str = OUTPUT_NAME) -> np.ndarray:
    if output not in response.outputs:
        raise ValueError(f"response has no output {output!r} (got: {', '.join(response.outputs) or 'none'})")
    return tf.make_ndarray(response.outputs[output]).reshape(-1)


def rest_body(batch: PaddedBatch, spec: ModelSpec) -> dict:
    """Columnar ("inputs") form: one list per input, the compact form for many rows."""
    return {"signature_name": spec.signature_name,
            "inputs": {name: array.tolist() for name, array in batch.as_inputs().items()}}


def rest_scores(body: dict, output: str = OUTPUT_NAME) -> np.ndarray:
    """Columnar responses carry a bare list for a one-output signature and a dict for several."""
    if "outputs" not in body:
        raise ValueError(f"REST response has no 'outputs' (keys: {', '.join(body) or 'none'})")
    outputs = body["outputs"]
    if isinstance(outputs, dict):
        if output not in outputs:
            raise ValueError(f"REST response has no output {output!r} (got: {', '.join(outputs)})")
        outputs = outputs[output]
    return np.asarray(outputs, dtype=np.float32).reshape(-1)
