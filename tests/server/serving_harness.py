"""A real `bertserve serve` process on free ports, for the server tests (imported by conftest and test modules;
a uniquely named module, since every test folder has a conftest). Launching and waiting are the client's
(bertserve.client.server_process); this adds the stubs the tests call."""

from __future__ import annotations

import os
import re
import signal
import tempfile

import grpc
import requests
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from bertserve.client.server_process import launch
from bertserve.server.config_files import DEFAULT_PROMETHEUS_PATH as METRICS_PATH

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def metric_total(text: str, name: str, **labels: str) -> float:
    """Sum of the Prometheus samples `name` whose labels include `labels`, from an exposition text; 0 if none."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


class ServerProcess:
    """`bertserve serve ...` in a subprocess, reached only through gRPC stubs and HTTP."""

    def __init__(self, *flags: str, log_dir: str, env: dict[str, str] | None = None):
        """log_dir: a test's temporary folder (pytest keeps those of its last three runs, then removes them)."""
        handle, log_path = tempfile.mkstemp(prefix="serve-", suffix=".log", dir=log_dir)
        os.close(handle)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **(env or {}))
        self.server = launch(flags, log_path, env)
        self.proc = self.server.process
        self.channel = grpc.insecure_channel(self.server.target)
        self.predict = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.rest = f"http://{self.server.rest_target}"

    @property
    def rest_address(self) -> tuple[str, int]:
        """(host, port) of the REST front end, for tests that speak HTTP on a socket of their own."""
        return "localhost", self.server.rest_port

    def metrics_text(self) -> str:
        """The Prometheus exposition text at METRICS_PATH (the tests' monitoring config enables it there)."""
        return requests.get(self.rest + METRICS_PATH, timeout=30).text

    def log(self) -> str:
        with open(self.server.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def wait_ready(self, timeout: float = 120.0) -> "ServerProcess":
        self.server.wait_serving(timeout)
        return self

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
