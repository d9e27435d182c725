"""gRPC front end: PredictionService, ModelService and grpc.health.v1 over the official generated stubs.

An asyncio server (grpc.aio) on the front ends' event loop: a Predict decodes, validates and joins its batch on
the loop and then awaits its answer, holding no thread, so a full batch queue is refused UNAVAILABLE at once (as
TF Serving does) instead of piling up in an executor's queue, and health probes are answered between requests.
PredictionService RPCs in flight are bounded too (`max_in_flight`: what the batch queues and the model threads
can hold); beyond it they are refused UNAVAILABLE at once. Health, status and metadata RPCs are not counted, so
a probe is never refused because of load.

Adding an RPC: an `async def` method here that awaits the Predictor or, for blocking work, runs it with
`asyncio.get_running_loop().run_in_executor(self.predictor.blocking_threads, ...)`; a plain `def` method also works
(gRPC runs it on `blocking_rpc_threads`), at the cost of a thread per call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from typing import Iterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_management_pb2,
                                     model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc)

from bertserve.server.errors import ServingError, invalid_argument, unavailable
from bertserve.server.inference import classify, multi_inference, regress
from bertserve.server.manager import ModelManager
from bertserve.server.predict import Predictor
from bertserve.server.tensors import decode_inputs

log = logging.getLogger("bertserve.server")
SIGNATURE_DEF_FIELD = "signature_def"


def _version_and_label(request) -> tuple[int | None, str | None]:
    """The request's model_spec as (version, label); a missing spec or name is INVALID_ARGUMENT, as in TF Serving."""
    if not request.HasField("model_spec"):
        raise invalid_argument("Missing ModelSpec")
    model_spec = request.model_spec
    if not model_spec.name:
        raise invalid_argument("ModelSpec has no name specified.")
    has_version = model_spec.HasField("version")
    if has_version and model_spec.version_label:
        raise invalid_argument("model_spec may set version or version_label, not both")
    return (model_spec.version.value if has_version else None), (model_spec.version_label or None)


async def _abort(context: grpc.aio.ServicerContext, error: ServingError):
    await context.abort(error.code, error.message)


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
    def __init__(self, predictor: Predictor, max_in_flight: int):
        self.predictor, self.max_in_flight = predictor, max_in_flight
        self._in_flight = 0  # touched only on the event loop

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Counts an inference RPC in flight, or refuses it UNAVAILABLE at once when max_in_flight are."""
        if self._in_flight >= self.max_in_flight:
            raise unavailable(f"The server is handling {self._in_flight} requests, its limit; retry later")
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    async def Predict(self, request: predict_pb2.PredictRequest, context: grpc.aio.ServicerContext):
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        try:
            version, label = _version_and_label(request)
            with self.admitted():
                result = await self.predictor.predict(
                    model_name=request.model_spec.name, version=version, label=label,
                    signature_name=request.model_spec.signature_name,
                    inputs_of=lambda signature: decode_inputs(signature, request.inputs),
                    output_filter=list(request.output_filter), deadline=deadline, entrypoint="GRPC")
        except ServingError as error:
            await _abort(context, error)
        return self.predictor.predict_response(result)

    async def GetModelMetadata(self, request, context):
        try:
            version, label = _version_and_label(request)
            return model_metadata(self.predictor.manager, request.model_spec.name, version, label,
                                  list(request.metadata_field))
        except ServingError as error:
            await _abort(context, error)

    async def Classify(self, request, context):
        return await self._inference(classify, request, request, context)

    async def Regress(self, request, context):
        return await self._inference(regress, request, request, context)

    async def MultiInference(self, request, context):
        # TF Serving serves the version the first task names; MultiInferencePlan checks the tasks agree.
        return await self._inference(multi_inference, request, request.tasks[0] if request.tasks else request,
                                     context)

    async def _inference(self, handler, request, spec_holder, context):
        """Classify, Regress, MultiInference (server/inference.py) with Predict's admission and deadline."""
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        try:
            version, label = _version_and_label(spec_holder)
            with self.admitted():
                return await handler(self.predictor, request, version, label, deadline, "GRPC")
        except ServingError as error:
            await _abort(context, error)


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, manager: ModelManager, blocking_threads: concurrent.futures.Executor):
        self.manager, self.blocking_threads = manager, blocking_threads

    async def GetModelStatus(self, request: get_model_status_pb2.GetModelStatusRequest, context):
        try:
            version, label = _version_and_label(request)
            statuses = self.manager.version_statuses(request.model_spec.name, version, label)
        except ServingError as error:
            await _abort(context, error)
        return get_model_status_pb2.GetModelStatusResponse(model_version_status=statuses)

    async def HandleReloadConfigRequest(self, request: model_management_pb2.ReloadConfigRequest, context):
        """Loading models takes seconds: it runs on a thread, so the loop keeps serving meanwhile."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.blocking_threads, self._reload, request.config)
        except ServingError as error:
            log.error("config reload failed: %s", error)
            await _abort(context, error)
        except ValueError as error:
            log.error("config reload failed: %s", error)
            await _abort(context, invalid_argument(str(error)))
        log.info("config reloaded: models %s", ", ".join(self.manager.model_names()))
        return model_management_pb2.ReloadConfigResponse()

    def _reload(self, config) -> None:
        self.manager.apply_config(config)
        self.manager.poll()
        self.manager.check_labels()


SERVICES = ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService")


class GrpcFrontEnd:
    """The gRPC server on the running event loop; health says NOT_SERVING until told otherwise."""

    def __init__(self, server: grpc.aio.Server, health_servicer: health.aio.HealthServicer):
        self.server, self.health = server, health_servicer

    @classmethod
    async def start(cls, port: int, max_in_flight: int, predictor: Predictor,
                    blocking_threads: concurrent.futures.ThreadPoolExecutor, unix_socket: str = "") -> "GrpcFrontEnd":
        """Listens on `port` (0: none) and `unix_socket` ("": none) (OSError if it cannot); call from the event
        loop that will serve it."""
        server = grpc.aio.server(migration_thread_pool=blocking_threads,
                                 options=[("grpc.max_receive_message_length", -1),
                                          ("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 0)])
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionService(predictor, max_in_flight), server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(
            ModelService(predictor.manager, blocking_threads), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for address in ([f"0.0.0.0:{port}"] if port else []) + ([f"unix:{unix_socket}"] if unix_socket else []):
            try:
                bound = server.add_insecure_port(address)
            except RuntimeError as exc:  # grpc.aio raises where the sync server returned 0
                raise OSError(f"cannot listen for gRPC on {address}: {exc}") from exc
            if bound == 0:
                raise OSError(f"cannot listen for gRPC on {address}")
        for service in SERVICES:
            await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        return cls(server, health_servicer)

    async def set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in SERVICES:
            await self.health.set(service, status)

    async def stop(self, grace_seconds: float) -> None:
        """Health says NOT_SERVING, new RPCs are refused, RPCs in flight get `grace_seconds` to finish."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_seconds)
