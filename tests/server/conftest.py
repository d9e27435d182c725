"""Fixtures for the server tests: tiny SavedModels on disk and real `bertserve serve` processes on free ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

sys.path.insert(0, os.path.dirname(__file__))
from tiny_models import build_tiny_ranker  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`python -m bertserve.cli serve ...` in a subprocess, reached only through gRPC stubs and HTTP."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None):
        self.grpc_port, self.rest_port = free_port(), free_port()
        self.log_file = tempfile.NamedTemporaryFile(prefix="bertserve-serve-", suffix=".log", delete=False)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bertserve.cli", "serve", f"--port={self.grpc_port}",
             f"--rest_api_port={self.rest_port}", *flags],
            stdout=self.log_file, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.predict = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.rest = f"http://127.0.0.1:{self.rest_port}"

    def log(self) -> str:
        with open(self.log_file.name, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def wait_ready(self, timeout: float = 120.0) -> "ServerProcess":
        health = health_pb2_grpc.HealthStub(self.channel)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return self
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()[-3000:]}")

    def terminate(self, timeout: float = 90.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.channel.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.channel.close()


@pytest.fixture
def start_server():
    """Starts servers for one test and always stops them."""
    started: list[ServerProcess] = []

    def start(*flags: str, ready: bool = True, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(*flags, env=env)
        started.append(server)
        return server.wait_ready() if ready else server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> str:
    """tiny: versions 1 and 2 (different weights, version 1 with warmup records); slow: a busy version 1."""
    root = str(tmp_path_factory.mktemp("models"))
    build_tiny_ranker(os.path.join(root, "tiny"), 1, warmup_requests=2)
    build_tiny_ranker(os.path.join(root, "tiny"), 2)
    build_tiny_ranker(os.path.join(root, "slow"), 1, work=1500)  # ~0.25 s a call on the dev machine
    return root
