"""REST load: TF Serving's `:predict` over HTTP/1.1 with keep-alive connections, from an asyncio loop.

The client library's RestTransport is synchronous (requests), which would need a thread per request in flight;
the load generator needs open-loop arrivals from one event loop, so it sends prebuilt JSON bodies through aiohttp.
Failures become ServingError with the gRPC code TF Serving's HTTP status maps back to, as in the client library.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from typing import Sequence

import aiohttp

from bertserve.client.errors import ServingError
from bertserve.client.padding import PaddedBatch
from bertserve.client.protocol import ModelSpec, rest_body


@dataclasses.dataclass(frozen=True)
class RestRequest:
    path: str  # /v1/models/<name>[...]:predict
    body: bytes  # the columnar JSON body, encoded once


def rest_request(batch: PaddedBatch, spec: ModelSpec) -> RestRequest:
    return RestRequest(f"{spec.rest_path()}:predict", json.dumps(rest_body(batch, spec)).encode())


class AsyncRestTransport:
    """One aiohttp session over all targets (host:port of --rest_api_port), round robin; opened on first use so
    that it binds to the loop that runs the calls. No connection limit: an open loop must not queue here."""

    def __init__(self, targets: Sequence[str]):
        if not targets:
            raise ValueError("at least one REST target (host:port) is required")
        self.bases = [t.rstrip("/") if t.startswith(("http://", "https://")) else f"http://{t}" for t in targets]
        self._next = itertools.cycle(self.bases)
        self._session: aiohttp.ClientSession | None = None

    async def predict_request(self, request: RestRequest, timeout_s: float) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        base = next(self._next)
        try:
            async with self._session.post(base + request.path, data=request.body,
                                          headers={"Content-Type": "application/json"},
                                          timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                body = await response.read()
        except asyncio.TimeoutError as error:
            raise ServingError("DEADLINE_EXCEEDED", str(error) or "timed out", base) from None
        except aiohttp.ClientError as error:
            raise ServingError("UNAVAILABLE", str(error), base) from None
        if response.status != 200:
            raise ServingError.from_http(response.status, body.decode(errors="replace")[:500], base)
        return body

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
