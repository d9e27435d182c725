"""HTTP/REST front end with TF Serving's URLs and JSON (g3doc/api_rest.md), plus the Prometheus endpoint.

HTTP/1.1 with persistent connections, as TF Serving's own HTTP server: a client that keeps its connection (a
requests.Session, a browser, a load balancer's pool) pays the TCP handshake once, not per request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from bertserve.server.errors import ServingError, invalid_argument, not_found, unimplemented
from bertserve.server.grpc_service import SIGNATURE_DEF_FIELD, model_metadata
from bertserve.server.metrics import ServerMetrics
from bertserve.server.predict import Predictor
from bertserve.server.servable import Signature
from bertserve.server.tensors import json_to_ndarray

log = logging.getLogger("bertserve.server")
MAX_BODY_BYTES = 256 << 20
# A kept-alive connection idle this long is closed, so abandoned connections do not hold a thread each.
KEEP_ALIVE_IDLE_SECONDS = 60.0

_MODEL_URL = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)"
    r"(?:/versions/(?P<version>-?\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?:(?P<metadata>/metadata)|:(?P<verb>[A-Za-z]+))?$")


def _message_dict(message) -> dict:
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
        if all(isinstance(row, dict) for row in instances):
            names = set(instances[0])
            if any(set(row) != names for row in instances):
                raise invalid_argument("every instance must name the same inputs")
            columns = {name: [row[name] for row in instances] for name in names}
        elif any(isinstance(row, dict) for row in instances):
            raise invalid_argument("instances mix named objects and plain values")
        else:
            columns = {_only_input(specs): instances}
        is_row = True
    else:
        given = body["inputs"]
        columns = given if isinstance(given, dict) else {_only_input(specs): given}
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
            return {"predictions": next(iter(outputs.values())).tolist()}
        rows = len(next(iter(outputs.values())))
        return {"predictions": [{name: value[i].tolist() for name, value in outputs.items()} for i in range(rows)]}
    if len(outputs) == 1:
        return {"outputs": next(iter(outputs.values())).tolist()}
    return {"outputs": {name: value.tolist() for name, value in outputs.items()}}


class RestApi:
    """Routes one HTTP request to the model server's functions; returns (status, JSON-able body or bytes)."""

    def __init__(self, predictor: Predictor, metrics: ServerMetrics, prometheus_path: str | None,
                 timeout_seconds: float):
        self.predictor, self.metrics, self.prometheus_path = predictor, metrics, prometheus_path
        self.timeout_seconds = timeout_seconds

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, dict | bytes]:
        try:
            if self.prometheus_path and path == self.prometheus_path and method == "GET":
                return 200, self.metrics.exposition()
            match = _MODEL_URL.match(path)
            if match is None:
                raise not_found(f"Malformed request: {method} {path}")
            name, label = match["name"], match["label"]
            version = int(match["version"]) if match["version"] is not None else None
            if method == "GET" and match["verb"] is None:
                if match["metadata"]:
                    return 200, self._metadata(name, version, label)
                statuses = self.predictor.manager.version_statuses(name, version, label)
                return 200, {"model_version_status": [_message_dict(s) for s in statuses]}
            if method == "POST" and match["verb"] is not None and not match["metadata"]:
                if match["verb"] != "predict":
                    raise unimplemented(f"{match['verb']} is not implemented; use :predict")
                return 200, self._predict(name, version, label, body)
            raise not_found(f"Malformed request: {method} {path}")
        except ServingError as error:
            return error.http_status, {"error": error.message}

    def _metadata(self, name: str, version: int | None, label: str | None) -> dict:
        response = model_metadata(self.predictor.manager, name, version, label, [SIGNATURE_DEF_FIELD])
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata[SIGNATURE_DEF_FIELD].Unpack(signature_map)
        return {"model_spec": _message_dict(response.model_spec),
                "metadata": {SIGNATURE_DEF_FIELD: json_format.MessageToDict(signature_map,
                                                                            preserving_proto_field_name=True)}}

    def _predict(self, name: str, version: int | None, label: str | None, raw: bytes) -> dict:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise invalid_argument(f"JSON Parse error: {exc}") from exc
        if not isinstance(body, dict):
            raise invalid_argument("request body must be a JSON object")
        signature_name = body.get("signature_name", "")
        if not isinstance(signature_name, str):
            raise invalid_argument("'signature_name' must be a string")
        layout: dict[str, bool] = {}

        def inputs_of(signature: Signature) -> dict[str, np.ndarray]:
            arrays, layout["row"] = _inputs_from_json(body, signature)
            return arrays

        result = self.predictor.predict(model_name=name, version=version, label=label,
                                        signature_name=signature_name, inputs_of=inputs_of, output_filter=[],
                                        deadline=time.monotonic() + self.timeout_seconds, entrypoint="REST")
        return _predict_body(result.outputs, layout["row"])


class _Connections:
    """The server's open client connections, and whether each is between requests, so that shutting down can
    close the idle ones (whose threads wait for a next request that may never come) and let busy ones finish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[socket.socket, bool] = {}
        self.closing = False

    def opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._idle[connection] = True

    def closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._idle.pop(connection, None)

    def mark_busy(self, connection: socket.socket) -> None:
        with self._lock:
            self._idle[connection] = False

    def mark_idle(self, connection: socket.socket) -> bool:
        """After a response; False once closing has begun (close_idle has passed this connection by)."""
        with self._lock:
            self._idle[connection] = True
            return not self.closing

    def close_idle(self) -> None:
        """From now on every response closes its connection; idle connections are shut down now."""
        with self._lock:
            self.closing = True
            idle = [connection for connection, is_idle in self._idle.items() if is_idle]
        for connection in idle:
            with contextlib.suppress(OSError):  # the client may have gone already
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    api: RestApi  # set on the subclass made per server
    slots: threading.BoundedSemaphore  # --rest_api_num_threads requests handled at once
    connections: _Connections
    protocol_version = "HTTP/1.1"
    timeout = KEEP_ALIVE_IDLE_SECONDS
    # Headers and body go out in two writes; with Nagle's algorithm the body would wait for the client's delayed
    # ACK of the headers (~40 ms) on a kept-alive connection.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.connections.opened(self.connection)

    def finish(self) -> None:
        self.connections.closed(self.connection)
        super().finish()

    def parse_request(self) -> bool:
        self.connections.mark_busy(self.connection)  # a request line arrived
        return super().parse_request()

    def _respond(self, method: str) -> None:
        body = b""
        length_text = self.headers.get("Content-Length", "0")
        try:
            length = int(length_text)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            status, payload = 400, {"error": f"bad Content-Length {length_text!r} (limit {MAX_BODY_BYTES} bytes)"}
            self.close_connection = True  # the unread body would be taken for the next request
        else:
            body = self.rfile.read(length) if length else b""
            with self.slots:
                status, payload = self.api.handle(method, self.path.split("?", 1)[0], body)
        if isinstance(payload, bytes):
            data, content_type = payload, "text/plain; version=0.0.4; charset=utf-8"
        else:
            data, content_type = json.dumps(payload).encode("utf-8"), "application/json"
        if self.connections.closing:
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        if not self.connections.mark_idle(self.connection):
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._respond("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._respond("POST")

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - keep access logs out of the server log
        return


class RestServer:
    """A threaded HTTP server; close() stops accepting, closes idle connections and waits for in-flight requests."""

    def __init__(self, port: int, api: RestApi, num_threads: int):
        self._connections = _Connections()
        handler = type("BoundHandler", (_Handler,), {"api": api, "slots": threading.BoundedSemaphore(num_threads),
                                                     "connections": self._connections})
        self._server = ThreadingHTTPServer(("0.0.0.0", port), handler)
        self._server.daemon_threads = False
        self._server.block_on_close = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="rest", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._connections.close_idle()
        self._server.server_close()
