"""A real `bertserve serve` process on free ports, for the server tests (imported by conftest and test modules;
a uniquely named module, since every test folder has a conftest)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from bertserve.client.server_process import free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



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
