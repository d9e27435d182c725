"""One Predict call to one of several targets, round robin: gRPC (official stubs, sync and asyncio) or REST.

Each transport turns failures into ServingError with TF Serving's status code, so callers see one error type
whatever the wire. Retries live a level up (retry.py), so that a retry goes to the next target in the rotation.
"""

from __future__ import annotations

import itertools
from typing import Protocol, Sequence

import grpc
import numpy as np
import requests
from tensorflow_serving.apis import prediction_service_pb2_grpc

from bertserve.client.errors import ServingError
from bertserve.client.padding import PaddedBatch
from bertserve.client.protocol import ModelSpec, grpc_request, grpc_scores, rest_body, rest_scores

# Message size limits well above the largest ranker request (thousands of 32-token pairs), and keepalive
# pings only during calls (TF Serving's server refuses idle pings more often than every 5 minutes).
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
)


class Transport(Protocol):
    def predict(self, batch: PaddedBatch, spec: ModelSpec, timeout_s: float) -> np.ndarray: ...
    def close(self) -> None: ...


def _check_targets(targets: Sequence[str]) -> list[str]:
    targets = [t for t in targets if t]
    if not targets:
        raise ValueError("at least one target (host:port) is required")
    return targets


class _RoundRobin:
    """Picks targets in turn; itertools.count is atomic under the GIL, so threads share it safely."""

    def __init__(self, items: Sequence):
        self._items = list(items)
        self._counter = itertools.count()

    def next(self):
        return self._items[next(self._counter) % len(self._items)]

    def all(self) -> list:
        return list(self._items)


class GrpcTransport:
    def __init__(self, targets: Sequence[str], channel_options: Sequence[tuple[str, int]] = DEFAULT_CHANNEL_OPTIONS):
        self.targets = _check_targets(targets)
        self._channels = [grpc.insecure_channel(t, options=list(channel_options)) for t in self.targets]
        self._stubs = _RoundRobin([(t, prediction_service_pb2_grpc.PredictionServiceStub(c))
                                   for t, c in zip(self.targets, self._channels)])

    def predict(self, batch: PaddedBatch, spec: ModelSpec, timeout_s: float) -> np.ndarray:
        target, stub = self._stubs.next()
        try:
            response = stub.Predict(grpc_request(batch, spec), timeout=timeout_s)
        except grpc.RpcError as error:
            raise ServingError.from_grpc(error, target) from None
        return grpc_scores(response)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


class AsyncGrpcTransport:
    """grpc.aio channels, opened on first use so they bind to the event loop that runs the calls."""

    def __init__(self, targets: Sequence[str], channel_options: Sequence[tuple[str, int]] = DEFAULT_CHANNEL_OPTIONS):
        self.targets = _check_targets(targets)
        self._options = list(channel_options)
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: _RoundRobin | None = None

    def _next_stub(self):
        if self._stubs is None:
            self._channels = [grpc.aio.insecure_channel(t, options=self._options) for t in self.targets]
            self._stubs = _RoundRobin([(t, prediction_service_pb2_grpc.PredictionServiceStub(c))
                                       for t, c in zip(self.targets, self._channels)])
        return self._stubs.next()

    async def predict(self, batch: PaddedBatch, spec: ModelSpec, timeout_s: float) -> np.ndarray:
        return await self.predict_request(grpc_request(batch, spec), timeout_s)

    async def predict_request(self, request, timeout_s: float) -> np.ndarray:
        """Sends a prebuilt PredictRequest (the load generator builds its requests once, up front)."""
        target, stub = self._next_stub()
        try:
            response = await stub.Predict(request, timeout=timeout_s)
        except grpc.RpcError as error:
            raise ServingError.from_grpc(error, target) from None
        return grpc_scores(response)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


class RestTransport:
    """TF Serving's REST API, columnar form. Targets are host:port of --rest_api_port (or full http URLs)."""

    def __init__(self, targets: Sequence[str]):
        self.targets = _check_targets(targets)
        urls = [t if t.startswith(("http://", "https://")) else f"http://{t}" for t in self.targets]
        self._sessions = _RoundRobin([(url.rstrip("/"), requests.Session()) for url in urls])

    def predict(self, batch: PaddedBatch, spec: ModelSpec, timeout_s: float) -> np.ndarray:
        base, session = self._sessions.next()
        url = f"{base}{spec.rest_path()}:predict"
        try:
            response = session.post(url, json=rest_body(batch, spec), timeout=timeout_s)
        except requests.Timeout as error:
            raise ServingError("DEADLINE_EXCEEDED", str(error), base) from None
        except requests.ConnectionError as error:
            raise ServingError("UNAVAILABLE", str(error), base) from None
        if response.status_code != 200:
            raise ServingError.from_http(response.status_code, _rest_error_message(response), base)
        return rest_scores(response.json())

    def close(self) -> None:
        for _, session in self._sessions.all():
            session.close()


def _rest_error_message(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", response.text))
    except ValueError:
        return response.text
