"""The gRPC server itself: terminates gRPC and hands every call on as bytes, whatever its method.

With `--grpc_front_end_processes` 1 (the default) this server terminates gRPC in the main process and `answer` is
the API's own (server/grpc_service.py). No handler deserializes anything, so every method (Predict, Classify,
Regress, MultiInference, metadata, status, reload) is parsed, checked and answered by the same code as the
calls that front-end processes (N > 1: server/cc/front_end_process.cc) forward as bytes. Health (grpc.health.v1,
with its streaming Watch) is served here from the state the server sets.
"""

from __future__ import annotations

import collections
import logging
from typing import Awaitable, Callable, NamedTuple, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

log = logging.getLogger("bertserve.server")
HEALTH_SERVICES = ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService")
_STATUS_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


class RpcAnswer(NamedTuple):
    """A call's outcome: gRPC status code number, its details (empty on OK) and the serialized response."""
    code: int
    details: str
    body: bytes


# (full method name, request bytes, seconds left before the call's deadline or None) -> its answer
Answer = Callable[[str, bytes, "float | None"], Awaitable[RpcAnswer]]


def _forwarding_handler(method: str, answer: Answer) -> grpc.RpcMethodHandler:
    """A unary handler without (de)serializers: the request's bytes go to `answer`, its bytes come back."""

    async def call(payload: bytes, context: grpc.aio.ServicerContext) -> bytes:
        code, details, body = await answer(method, payload, context.time_remaining())
        if code:
            await context.abort(_STATUS_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN), details)
        return body

    return grpc.unary_unary_rpc_method_handler(call)


class GrpcFrontEnd:
    """The gRPC server on the running event loop; health says NOT_SERVING until told otherwise."""

    def __init__(self, server: grpc.aio.Server, health_servicer: health.aio.HealthServicer):
        self.server, self.health = server, health_servicer

    @classmethod
    async def start(cls, port: int, unix_socket: str, methods: Sequence[str], answer: Answer) -> "GrpcFrontEnd":
        """Listens on `port` (0: none) and `unix_socket` ("": none), OSError if it cannot; call from the event loop
        that will serve it. methods: the full names ("/package.Service/Method") handed to `answer`; gRPC answers
        others UNIMPLEMENTED. The port is not shared (no SO_REUSEPORT): a port already taken is an error."""
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1),
                                          ("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 0)])
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        # Registered, not generic, handlers: gRPC then delivers a call together with its request bytes, where a
        # generic handler costs the call another round through the completion queue to read them.
        by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = collections.defaultdict(dict)
        for method in methods:
            _, service, name = method.split("/")
            by_service[service][name] = _forwarding_handler(method, answer)
        for service, handlers in by_service.items():
            server.add_registered_method_handlers(service, handlers)
        for address in ([f"0.0.0.0:{port}"] if port else []) + ([f"unix:{unix_socket}"] if unix_socket else []):
            try:
                bound = server.add_insecure_port(address)
            except RuntimeError as exc:  # grpc.aio raises where the sync server returned 0
                raise OSError(f"cannot listen for gRPC on {address}: {exc}") from exc
            if bound == 0:
                raise OSError(f"cannot listen for gRPC on {address}")
        for service in HEALTH_SERVICES:
            await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        return cls(server, health_servicer)

    async def set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in HEALTH_SERVICES:
            await self.health.set(service, status)

    async def stop(self, grace_seconds: float) -> None:
        """Health says NOT_SERVING, new RPCs are refused, RPCs in flight get `grace_seconds` to finish."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_seconds)
