"""HTTP/REST front end with TF Serving's URLs and JSON (g3doc/api_rest.md), plus the Prometheus endpoint.

Served by aiohttp (maintained, C-accelerated llhttp parser, asyncio) on the front ends' event loop, beside
gRPC. The library owns HTTP/1.1 framing and keep-alive: it refuses requests that both chunk and give a
Content-Length or give two different lengths (the ambiguities request smuggling relies on), answers every
framing error with a status instead of dropping the connection, and closes idle connections. What is ours:
- a request slot (--rest_api_num_threads of them) is taken before its body is read, and the body is refused with
  413 when its Content-Length, or a chunked body as it arrives, exceeds MAX_BODY_BYTES: memory per request is
  bounded before it is spent;
- JSON is parsed on `blocking_threads`, so a large body does not stall the loop; a body too deep to parse or a
  version number too long for int64 is a 400, as any other bad request;
- on shutdown, requests still waiting for a slot or their body are dropped at once (a slow client cannot hold
  the exit), requests being served get the drain grace, idle keep-alive connections are closed.
Every error body is TF Serving's {"error": "..."}; statuses follow errors.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import time
from typing import Awaitable, Callable

import numpy as np
from aiohttp import web, web_protocol
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from bertserve.server.errors import ServingError, invalid_argument
from bertserve.server.grpc_service import SIGNATURE_DEF_FIELD, model_metadata
from bertserve.server.metrics import ServerMetrics
from bertserve.server.predict import Predictor
from bertserve.server.servable import Signature
from bertserve.server.inference import rest_classify, rest_regress
from bertserve.server.tensors import is_b64_value, json_to_ndarray, json_value

log = logging.getLogger("bertserve.server")
# JSON parses to several times its size: with --rest_api_num_threads slots at once, this bounds REST's memory.
# A 1,000-pair ranking request at 128 tokens is a few MB of JSON.
MAX_BODY_BYTES = 64 << 20
# A kept-alive connection idle this long is closed, so abandoned connections do not hold resources.
KEEP_ALIVE_IDLE_SECONDS = 60.0
# After refusing a body it did not read, the server drains it this long before closing, so the client reads the
# answer instead of a connection reset; longer would let a refused upload hold the connection (and shutdown).
LINGER_SECONDS = 1.0
INT64_MAX = (1 << 63) - 1
JSON_CONTENT_TYPE = "application/json"
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_MODEL_URL = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)"
    r"(?:/versions/(?P<version>-?\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?:(?P<metadata>/metadata)|:(?P<verb>[A-Za-z]+))?$")


def _message_dict(message) -> dict:
    """TF Serving's JSON for protos (json_util): field names as declared, default values printed."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def _inputs_from_json(body: dict, signature: Signature) -> tuple[dict[str, np.ndarray], bool]:
    """Row ("instances") or columnar ("inputs") request -> arrays of the signature's dtypes; returns is_row."""
    if ("instances" in body) == ("inputs" in body):
        raise invalid_argument('Missing \'inputs\' or \'instances\' key' if "instances" not in body
                               else 'Only one of \'inputs\' or \'instances\' may be set')
    specs = signature.inputs
    if "instances" in body:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise invalid_argument("'instances' must be a non-empty list")
        if all(isinstance(row, dict) and not is_b64_value(row) for row in instances):
            names = set(instances[0])
            if any(set(row) != names for row in instances):
                raise invalid_argument("every instance must name the same inputs")
            columns = {name: [row[name] for row in instances] for name in names}
        elif any(isinstance(row, dict) and not is_b64_value(row) for row in instances):
            raise invalid_argument("instances mix named objects and plain values")
        else:
            columns = {_only_input(specs): instances}
        is_row = True
    else:
        given = body["inputs"]
        columns = given if isinstance(given, dict) and not is_b64_value(given) else {_only_input(specs): given}
        is_row = False
    arrays = {}
    for name, value in columns.items():
        spec = specs.get(name)
        arrays[name] = (json_to_ndarray(name, value, spec.dtype) if spec is not None
                        else np.asarray(0))  # an unknown name: validation reports it with the full lists
    return arrays, is_row


def _only_input(specs: dict) -> str:
    if len(specs) != 1:
        raise invalid_argument(f"the signature has {len(specs)} inputs {sorted(specs)}: name them "
                               f"(list of objects in 'instances', or an object in 'inputs')")
    return next(iter(specs))


def _predict_body(outputs: dict[str, np.ndarray], is_row: bool) -> dict:
    if is_row:
        if len(outputs) == 1:
            return {"predictions": json_value(*next(iter(outputs.items())))}
        rows = len(next(iter(outputs.values())))
        return {"predictions": [{name: json_value(name, value[i]) for name, value in outputs.items()}
                                for i in range(rows)]}
    if len(outputs) == 1:
        return {"outputs": json_value(*next(iter(outputs.items())))}
    return {"outputs": {name: json_value(name, value) for name, value in outputs.items()}}


# A request's handler: (api, name, version, label, body) -> JSON-able answer. Registered per verb below.
VerbHandler = Callable[["RestApi", str, "int | None", "str | None", bytes], Awaitable[dict]]


def _version_number(text: str) -> int:
    """A URL's version as int64, refused as TF Serving refuses it (no int() of thousands of digits)."""
    if len(text.lstrip("-")) > 19 or not -INT64_MAX - 1 <= int(text) <= INT64_MAX:
        raise invalid_argument(f"Failed to convert version: {text[:32]}{'...' if len(text) > 32 else ''} to numeric.")
    return int(text)


class RestApi:
    """Routes one HTTP request to the model server's functions; returns (status, JSON-able body or bytes)."""

    # POST /v1/models/<name>[/versions/<v> | /labels/<l>]:<verb>. Classify and Regress plug in here.
    verbs: dict[str, VerbHandler] = {}

    def __init__(self, predictor: Predictor, metrics: ServerMetrics, prometheus_path: str | None,
                 timeout_seconds: float, blocking_threads: concurrent.futures.Executor):
        self.predictor, self.metrics, self.prometheus_path = predictor, metrics, prometheus_path
        self.timeout_seconds, self.blocking_threads = timeout_seconds, blocking_threads

    async def handle(self, method: str, path: str, body: bytes) -> tuple[int, dict | bytes]:
        try:
            if self.prometheus_path and path == self.prometheus_path and method == "GET":
                return 200, self.metrics.exposition()
            match = _MODEL_URL.match(path)
            if match is None:
                raise _malformed(method, path)
            name, label = match["name"], match["label"]
            version = _version_number(match["version"]) if match["version"] is not None else None
            if method == "GET" and match["verb"] is None:
                if match["metadata"]:
                    return 200, self._metadata(name, version, label)
                statuses = self.predictor.manager.version_statuses(name, version, label)
                return 200, {"model_version_status": [_message_dict(s) for s in statuses]}
            if method == "POST" and match["verb"] is not None and not match["metadata"]:
                verb = self.verbs.get(match["verb"])
                if verb is None:
                    raise _malformed(method, path)
                return 200, await verb(self, name, version, label, body)
            raise _malformed(method, path)
        except ServingError as error:
            return error.http_status, {"error": error.message}

    async def parse_json(self, raw: bytes) -> dict:
        """A request body as a JSON object, parsed off the loop; anything unparsable is INVALID_ARGUMENT."""
        try:
            body = await asyncio.get_running_loop().run_in_executor(self.blocking_threads, json.loads, raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise invalid_argument(f"JSON Parse error: {exc}") from exc
        except RecursionError as exc:
            raise invalid_argument("JSON Parse error: the document is nested too deeply") from exc
        if not isinstance(body, dict):
            raise invalid_argument("request body must be a JSON object")
        return body

    def _metadata(self, name: str, version: int | None, label: str | None) -> dict:
        response = model_metadata(self.predictor.manager, name, version, label, [SIGNATURE_DEF_FIELD])
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata[SIGNATURE_DEF_FIELD].Unpack(signature_map)
        return {"model_spec": _message_dict(response.model_spec),
                "metadata": {SIGNATURE_DEF_FIELD: _message_dict(signature_map)}}


def _malformed(method: str, path: str) -> ServingError:
    return invalid_argument(f"Malformed request: {method} {path[:256]}")


async def _predict(api: RestApi, name: str, version: int | None, label: str | None, raw: bytes) -> dict:
    body = await api.parse_json(raw)
    signature_name = body.get("signature_name", "")
    if not isinstance(signature_name, str):
        raise invalid_argument("'signature_name' must be a string")
    layout: dict[str, bool] = {}

    def inputs_of(signature: Signature) -> dict[str, np.ndarray]:
        arrays, layout["row"] = _inputs_from_json(body, signature)
        return arrays

    result = await api.predictor.predict(model_name=name, version=version, label=label,
                                         signature_name=signature_name, inputs_of=inputs_of, output_filter=[],
                                         deadline=time.monotonic() + api.timeout_seconds, entrypoint="REST")
    return _predict_body(result.outputs, layout["row"])


RestApi.verbs.update(predict=_predict, classify=rest_classify, regress=rest_regress)


class _JsonErrorsRequestHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler, answering framing errors (bad lengths, smuggling attempts, oversized
    headers) with TF Serving's JSON error body; the connection still closes after it, as the library does."""

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs, and refuses if a response already began
        text = message or (str(exc) if exc else "") or f"HTTP {status}"
        response = web.json_response({"error": text.split("\n", 1)[0].rstrip(":")}, status=status)
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _JsonErrorsRequestHandler(self, loop=self._loop, **self._kwargs)


class RestFrontEnd:
    """The HTTP server on the running event loop."""

    def __init__(self, api: RestApi, num_slots: int):
        self.api = api
        self._slots = asyncio.Semaphore(num_slots)  # --rest_api_num_threads requests handled at once
        self._receiving: set[asyncio.Task] = set()  # waiting for a slot or reading their body
        self._closing = False
        self._runner: web.ServerRunner | None = None

    @classmethod
    async def start(cls, port: int, api: RestApi, num_slots: int, grace_seconds: float) -> "RestFrontEnd":
        """Listens on `port` (OSError if it cannot); call from the event loop that will serve it."""
        front_end = cls(api, num_slots)
        server = _Server(front_end._serve, keepalive_timeout=KEEP_ALIVE_IDLE_SECONDS, access_log=None,
                         lingering_time=LINGER_SECONDS)
        front_end._runner = web.ServerRunner(server, shutdown_timeout=grace_seconds, handle_signals=False)
        await front_end._runner.setup()
        site = web.TCPSite(front_end._runner, "0.0.0.0", port, reuse_port=False)
        try:
            await site.start()
        except OSError:
            await front_end._runner.cleanup()
            raise
        return front_end

    async def stop(self) -> None:
        """Stops listening; drops requests not yet received, lets requests in flight finish (up to the grace),
        closes idle connections."""
        self._closing = True
        for task in list(self._receiving):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        task = asyncio.current_task()
        self._receiving.add(task)
        try:
            await self._slots.acquire()
        finally:
            self._receiving.discard(task)
        try:
            body = await self._receive(request, task)
            if body is None:  # the rest of an oversized body is never read: the connection closes after this
                response = _respond(413, {"error": f"request body larger than the limit of {MAX_BODY_BYTES} bytes"})
                response.force_close()
                return response
            response = _respond(*await self.api.handle(request.method, request.path, body))
        finally:
            self._slots.release()
        if self._closing:
            response.force_close()
        return response

    async def _receive(self, request: web.BaseRequest, task: asyncio.Task) -> bytes | None:
        """The body, or None when its Content-Length (checked before reading) or its chunks exceed the limit."""
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return None
        self._receiving.add(task)
        try:
            return await _read_capped(request, MAX_BODY_BYTES)
        finally:
            self._receiving.discard(task)


def _respond(status: int, payload: dict | bytes) -> web.Response:
    if isinstance(payload, bytes):
        return web.Response(body=payload, status=status, headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})
    return web.Response(body=json.dumps(payload).encode("utf-8"), status=status, content_type=JSON_CONTENT_TYPE)


async def _read_capped(request: web.BaseRequest, limit: int) -> bytes | None:
    """The body (chunked or not), or None as soon as it exceeds `limit` bytes."""
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)
