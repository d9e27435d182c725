"""gRPC front end: PredictionService, ModelService and grpc.health.v1 over the official generated stubs."""

from __future__ import annotations

import logging
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_management_pb2,
                                     model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc)

from bertserve.server.errors import ServingError, invalid_argument, unimplemented
from bertserve.server.manager import ModelManager
from bertserve.server.predict import Predictor
from bertserve.server.tensors import ndarray_to_proto, proto_to_ndarray

log = logging.getLogger("bertserve.server")
SIGNATURE_DEF_FIELD = "signature_def"


def _version_and_label(model_spec) -> tuple[int | None, str | None]:
    has_version = model_spec.HasField("version")
    if has_version and model_spec.version_label:
        raise invalid_argument("model_spec may set version or version_label, not both")
    return (model_spec.version.value if has_version else None), (model_spec.version_label or None)


def _abort(context: grpc.ServicerContext, error: ServingError):
    context.abort(error.code, error.message)


def model_metadata(manager: ModelManager, name: str, version: int | None, label: str | None,
                   fields: list[str]) -> get_model_metadata_pb2.GetModelMetadataResponse:
    """GetModelMetadata's answer (also served over REST); only signature_def exists, as in TF Serving."""
    if not fields:
        raise invalid_argument("GetModelMetadataRequest must specify at least one metadata_field")
    unsupported = [f for f in fields if f != SIGNATURE_DEF_FIELD]
    if unsupported:
        raise invalid_argument(f"Metadata field {unsupported[0]} is not supported")
    with manager.serving(name, version, label) as handle:
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for key, signature in handle.servable.signatures.items():
            signature_map.signature_def[key].CopyFrom(signature.signature_def)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = name
        response.model_spec.version.value = handle.servable.version
        response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
        return response


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def Predict(self, request: predict_pb2.PredictRequest, context: grpc.ServicerContext):
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        try:
            version, label = _version_and_label(request.model_spec)
            result = self.predictor.predict(
                model_name=request.model_spec.name, version=version, label=label,
                signature_name=request.model_spec.signature_name,
                inputs_of=lambda _signature: {n: proto_to_ndarray(n, t) for n, t in request.inputs.items()},
                output_filter=list(request.output_filter), deadline=deadline, entrypoint="GRPC")
        except ServingError as error:
            _abort(context, error)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = result.model_name
        response.model_spec.version.value = result.version
        response.model_spec.signature_name = result.signature_name
        for name, value in result.outputs.items():
            response.outputs[name].CopyFrom(ndarray_to_proto(value))
        return response

    def GetModelMetadata(self, request, context):
        try:
            version, label = _version_and_label(request.model_spec)
            return model_metadata(self.predictor.manager, request.model_spec.name, version, label,
                                  list(request.metadata_field))
        except ServingError as error:
            _abort(context, error)

    def Classify(self, request, context):
        _abort(context, unimplemented("Classify is not implemented; use Predict with the serving_default signature"))

    def Regress(self, request, context):
        _abort(context, unimplemented("Regress is not implemented; use Predict with the serving_default signature"))

    def MultiInference(self, request, context):
        _abort(context, unimplemented("MultiInference is not implemented; use Predict"))


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, manager: ModelManager):
        self.manager = manager

    def GetModelStatus(self, request: get_model_status_pb2.GetModelStatusRequest, context):
        try:
            version, label = _version_and_label(request.model_spec)
            statuses = self.manager.version_statuses(request.model_spec.name, version, label)
        except ServingError as error:
            _abort(context, error)
        return get_model_status_pb2.GetModelStatusResponse(model_version_status=statuses)

    def HandleReloadConfigRequest(self, request: model_management_pb2.ReloadConfigRequest, context):
        response = model_management_pb2.ReloadConfigResponse()
        try:
            self.manager.apply_config(request.config)
            self.manager.poll()
            self.manager.check_labels()
        except ServingError as error:
            log.error("config reload failed: %s", error)
            _abort(context, error)
        except ValueError as error:
            log.error("config reload failed: %s", error)
            _abort(context, invalid_argument(str(error)))
        log.info("config reloaded: models %s", ", ".join(self.manager.model_names()))
        return response


def start_grpc_server(port: int, max_threads: int, predictor: Predictor) -> tuple[grpc.Server, health.HealthServicer]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="grpc"),
                         options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                                  ("grpc.so_reuseport", 0)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(predictor), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(predictor.manager), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(f"0.0.0.0:{port}") == 0:
        raise OSError(f"cannot listen for gRPC on port {port}")
    server.start()
    for service in ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"):
        health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    return server, health_servicer
