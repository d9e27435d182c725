"""TF Serving's gRPC API (PredictionService, ModelService) from a call's request bytes to its answer.

The gRPC server (server/grpc_front_end.py) hands every call over as bytes, in the main process or from a
front-end process, and `GrpcApi.answer` parses them with the method's request type, runs it and serializes the
response: one path for both modes of --grpc_front_end_processes. Bytes that are no valid request of the method's
type are INVALID_ARGUMENT naming that type.

Inference RPCs (Predict, Classify, Regress, MultiInference) in flight are bounded (`max_in_flight`: what the batch
queues and the model threads can hold); beyond it they are refused UNAVAILABLE at once, as TF Serving refuses a
full batch queue, instead of piling up. Metadata, status and reload RPCs are not counted, and health is answered
by the gRPC server itself, so a probe is never refused because of load.

Adding an RPC of these services: an `async def` method of GrpcApi taking (request, deadline) and returning the
response message, entered under the method's name in the `handlers` of `GrpcApi.__init__` (request types and
full names come from the services' descriptors); blocking work runs with
`asyncio.get_running_loop().run_in_executor(self.predictor.blocking_threads, ...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Awaitable, Callable, Iterator

import grpc
from google.protobuf import message, message_factory
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_management_pb2,
                                     model_service_pb2, prediction_service_pb2)

from bertserve.server.errors import ServingError, from_exception, invalid_argument, unavailable
from bertserve.server.forwarding import DecodedPredict
from bertserve.server.grpc_front_end import RpcAnswer
from bertserve.server.inference import classify, multi_inference, regress
from bertserve.server.manager import ModelManager
from bertserve.server.predict import PredictResult, Predictor
from bertserve.server.tensors import decode_inputs

log = logging.getLogger("bertserve.server")
SIGNATURE_DEF_FIELD = "signature_def"
SERVICES = (prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"],
            model_service_pb2.DESCRIPTOR.services_by_name["ModelService"])
OK = grpc.StatusCode.OK.value[0]
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"


def _version_and_label(request) -> tuple[int | None, str | None]:
    """The request's model_spec as (version, label); a missing spec or name is INVALID_ARGUMENT, as in TF Serving."""
    if not request.HasField("model_spec"):
        raise invalid_argument("Missing ModelSpec")
    model_spec = request.model_spec
    if not model_spec.name:
        raise invalid_argument("ModelSpec has no name specified.")
    return _one_of(model_spec.version.value if model_spec.HasField("version") else None, model_spec.version_label)


def _one_of(version: int | None, label: str) -> tuple[int | None, str | None]:
    if version is not None and label:
        raise invalid_argument("model_spec may set version or version_label, not both")
    return version, (label or None)


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



def _nothing_to_cancel() -> None:
    pass


def failed_answer(method: str, exc: Exception) -> RpcAnswer:
    """A failure as the call's status; anything but a ServingError is logged (and INTERNAL)."""
    error = from_exception(exc)
    if not isinstance(exc, ServingError):
        log.exception("%s failed", method)
    return RpcAnswer(error.code.value[0], error.message, b"")


Handler = Callable[[message.Message, "float | None"], Awaitable[message.Message]]


class GrpcApi:
    """Every PredictionService and ModelService method, called with the request's bytes."""

    def __init__(self, predictor: Predictor, max_in_flight: int):
        self.predictor, self.manager, self.max_in_flight = predictor, predictor.manager, max_in_flight
        self._in_flight = 0  # touched only on the event loop
        handlers: dict[str, Handler] = {
            "Predict": self.predict, "Classify": self.classify, "Regress": self.regress,
            "MultiInference": self.multi_inference, "GetModelMetadata": self.get_model_metadata,
            "GetModelStatus": self.get_model_status, "HandleReloadConfigRequest": self.reload_config}
        self._inference_handlers = {self.predict, self.classify, self.regress, self.multi_inference}
        # full method name -> (request type, handler), from the services' descriptors
        self._methods: dict[str, tuple[type[message.Message], Handler]] = {
            f"/{service.full_name}/{method.name}": (message_factory.GetMessageClass(method.input_type),
                                                     handlers[method.name])
            for service in SERVICES for method in service.methods}

    def is_inference(self, method: str) -> bool:
        """Whether a full method name runs a model (Predict, Classify, Regress, MultiInference): the calls that
        queue for batches and may be refused when the server is overloaded."""
        found = self._methods.get(method)
        return found is not None and found[1] in self._inference_handlers

    @property
    def methods(self) -> list[str]:
        """The full method names this API answers ("/tensorflow.serving.PredictionService/Predict", ...)."""
        return list(self._methods)

    async def answer(self, method: str, payload: bytes, seconds_left: float | None) -> RpcAnswer:
        """Parses, runs and answers one call; failures are statuses (anything unexpected is INTERNAL)."""
        deadline = None if seconds_left is None else time.monotonic() + seconds_left
        found = self._methods.get(method)
        if found is None:
            return RpcAnswer(grpc.StatusCode.UNIMPLEMENTED.value[0], f"Method not found: {method}", b"")
        request_type, handler = found
        try:
            try:
                request = request_type.FromString(payload)
            except message.DecodeError as exc:
                raise invalid_argument(f"the request is not a valid {request_type.DESCRIPTOR.full_name} "
                                       f"({len(payload)} bytes): {exc}") from exc
            response = await handler(request, deadline)
        except Exception as exc:  # noqa: BLE001 - every failure becomes the call's status, never a crash
            return failed_answer(method, exc)
        return RpcAnswer(OK, "", response.SerializeToString())

    def start_decoded(self, call: DecodedPredict, on_done: Callable[[RpcAnswer | PredictResult], None]
                      ) -> Callable[[], None]:
        """Starts a Predict a front end took apart; `on_done` gets its result, for the front end to encode, or
        its failure, once (at once if it is refused). Returns `cancel` (the client went away): on_done is then
        not called. No task per call: the hot path of the front-end processes."""
        try:
            version, label = _one_of(call.version, call.version_label)
            self._admit()
        except ServingError as exc:
            on_done(failed_answer(PREDICT_METHOD, exc))
            return _nothing_to_cancel

        counted = True  # in self._in_flight until answered or cancelled

        def done(result: PredictResult | None, error: ServingError | None) -> None:
            nonlocal counted
            counted = False
            self._in_flight -= 1
            on_done(result if error is None else failed_answer(PREDICT_METHOD, error))

        cancel_prediction = self.predictor.start(
            model_name=call.model_name, version=version, label=label, signature_name=call.signature_name,
            inputs_of=lambda signature: decode_inputs(signature, call.inputs), output_filter=call.output_filter,
            deadline=None if call.seconds_left is None else time.monotonic() + call.seconds_left,
            entrypoint="GRPC", on_done=done, token_ranges=call.token_ranges)

        def cancel() -> None:
            nonlocal counted
            if counted:
                counted = False
                self._in_flight -= 1
                cancel_prediction()

        return cancel

    def _admit(self) -> None:
        """Counts an inference RPC in flight, or refuses it UNAVAILABLE at once when max_in_flight are."""
        if self._in_flight >= self.max_in_flight:
            raise unavailable(f"The server is handling {self._in_flight} requests, its limit; retry later")
        self._in_flight += 1

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        self._admit()
        try:
            yield
        finally:
            self._in_flight -= 1

    async def predict(self, request, deadline: float | None):
        version, label = _version_and_label(request)
        with self.admitted():
            result = await self.predictor.predict(
                model_name=request.model_spec.name, version=version, label=label,
                signature_name=request.model_spec.signature_name,
                inputs_of=lambda signature: decode_inputs(signature, request.inputs),
                output_filter=list(request.output_filter), deadline=deadline, entrypoint="GRPC")
        return self.predictor.predict_response(result)

    async def get_model_metadata(self, request, deadline: float | None):
        version, label = _version_and_label(request)
        return model_metadata(self.manager, request.model_spec.name, version, label, list(request.metadata_field))

    async def classify(self, request, deadline: float | None):
        return await self._inference(classify, request, request, deadline)

    async def regress(self, request, deadline: float | None):
        return await self._inference(regress, request, request, deadline)

    async def multi_inference(self, request, deadline: float | None):
        # TF Serving serves the version the first task names; MultiInferencePlan checks the tasks agree.
        return await self._inference(multi_inference, request, request.tasks[0] if request.tasks else request,
                                     deadline)

    async def _inference(self, handler, request, spec_holder, deadline: float | None):
        """Classify, Regress, MultiInference (server/inference.py) with Predict's admission and deadline."""
        version, label = _version_and_label(spec_holder)
        with self.admitted():
            return await handler(self.predictor, request, version, label, deadline, "GRPC")

    async def get_model_status(self, request, deadline: float | None):
        version, label = _version_and_label(request)
        statuses = self.manager.version_statuses(request.model_spec.name, version, label)
        return get_model_status_pb2.GetModelStatusResponse(model_version_status=statuses)

    async def reload_config(self, request, deadline: float | None):
        """Loading models takes seconds: it runs on a thread, so the loop keeps serving meanwhile."""
        try:
            await asyncio.get_running_loop().run_in_executor(self.predictor.blocking_threads, self._reload,
                                                             request.config)
        except ValueError as error:
            log.error("config reload failed: %s", error)
            raise invalid_argument(str(error)) from error
        except ServingError as error:
            log.error("config reload failed: %s", error)
            raise
        log.info("config reloaded: models %s", ", ".join(self.manager.model_names()))
        return model_management_pb2.ReloadConfigResponse()

    def _reload(self, config) -> None:
        self.manager.apply_config(config)
        self.manager.poll()
        self.manager.check_labels()
