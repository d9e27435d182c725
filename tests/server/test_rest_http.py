"""The REST port as HTTP: framing that leaves no room for request smuggling, body limits applied before the body
is read, chunked bodies, hostile JSON answered with 400, and a prompt exit on SIGTERM with a slow client."""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from bertserve.server.rest import MAX_BODY_BYTES
from tiny_models import token_inputs


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def _exchange(server, request: bytes, timeout: float = 30) -> bytes:
    """Sends raw bytes on a new connection; everything the server sends until it closes the connection."""
    with socket.create_connection(server.rest_address, timeout=timeout) as raw:
        raw.sendall(request)
        received = b""
        while chunk := raw.recv(65536):
            received += chunk
    return received


def _responses(received: bytes) -> list[tuple[int, dict]]:
    """(status, JSON body) of each response in a byte stream (bodies framed by Content-Length)."""
    found = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
        length = int(headers.get(b"content-length", b"0"))
        found.append((int(lines[0].split(b" ")[1]), json.loads(rest[:length] or b"null")))
        received = rest[length:]
    return found


def _predict_body() -> bytes:
    return json.dumps({"inputs": {name: value.tolist() for name, value in token_inputs(2, 8).items()}}).encode()


def test_transfer_encoding_with_content_length_is_refused_not_smuggled(server):
    # Chunked framing ends the body after "0\r\n\r\n" and leaves a second request behind it; Content-Length
    # framing cuts elsewhere. A server that frames by either answers twice; the request must be refused whole.
    smuggled = b"GET /v1/models/tiny HTTP/1.1\r\nHost: test\r\n\r\n"
    received = _exchange(server, b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: test\r\nContent-Length: 6\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled)
    (status, body), = _responses(received)
    assert status == 400 and "Transfer-Encoding" in body["error"]


def test_conflicting_content_lengths_are_refused(server):
    body = _predict_body()
    received = _exchange(server, b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    (status, reply), = _responses(received)
    assert status == 400 and "Content-Length" in reply["error"]


def test_chunked_body_is_accepted(server):
    body = _predict_body()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n"
    received = _exchange(server, b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
    (status, reply), = _responses(received)
    assert status == 200 and len(reply["outputs"]) == 2


def test_body_limit_applies_before_reading(server):
    # Only the headers are sent: the answer must come from the declared length alone, at once.
    started = time.monotonic()
    received = _exchange(server, b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: test\r\n"
                                 b"Content-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1), timeout=10)
    (status, reply), = _responses(received)
    assert status == 413 and "limit" in reply["error"]
    assert time.monotonic() - started < 5


def test_chunked_body_over_the_limit_is_cut_off(server):
    chunk = b"[" * (1 << 20)
    with socket.create_connection(server.rest_address, timeout=30) as raw:
        raw.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n")
        sent = 0
        try:
            while sent <= MAX_BODY_BYTES + (4 << 20):  # never the terminating chunk
                raw.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading: what matters is its answer
        received = b""
        try:
            while part := raw.recv(65536):
                received += part
        except ConnectionResetError:
            pass
    (status, reply), = _responses(received)
    assert status == 413 and "limit" in reply["error"]


def test_deeply_nested_json_gets_400_and_the_server_lives_on(server):
    deep = b"[" * 100_000 + b"]" * 100_000
    for body in (deep, b'{"inputs": ' + deep + b"}"):
        reply = requests.post(f"{server.rest}/v1/models/tiny:predict", data=body, timeout=30)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"].startswith("JSON Parse error")
    assert requests.post(f"{server.rest}/v1/models/tiny:predict", data=_predict_body(), timeout=30).status_code == 200


def test_sigterm_with_a_slow_client_exits_promptly(models_dir, start_server):
    server = start_server("--model_name=tiny", f"--model_base_path={models_dir}/tiny")
    stalled_body = socket.create_connection(server.rest_address, timeout=30)
    stalled_body.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n{")
    stalled_headers = socket.create_connection(server.rest_address, timeout=30)
    stalled_headers.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: te")
    time.sleep(0.5)
    started = time.monotonic()
    assert server.terminate(timeout=20) == 0
    assert time.monotonic() - started < 10
    stalled_body.close()
    stalled_headers.close()
