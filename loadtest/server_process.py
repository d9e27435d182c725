"""Starts and stops `bertserve serve` as a child process: the one place that launches it and waits for it.

The tuner restarts it for every batching parameter set (TF Serving reads batching parameters once, at start);
the demo, the tests and the benchmarks run against the real server through it."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator, Mapping, Sequence

import grpc
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc, prediction_service_pb2_grpc

from bertserve.loadtest import server_metrics
from bertserve.server.config_files import DEFAULT_PROMETHEUS_PATH

AVAILABLE = get_model_status_pb2.ModelVersionStatus.State.AVAILABLE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`bertserve serve` as a child process on two free ports (gRPC, REST), reached through gRPC stubs and HTTP.

    Starting returns at once; wait_ready or wait_until_available waits for the server. Use it as a context
    manager, or call terminate (or kill), so that no server outlives its caller."""

    def __init__(self, flags: Sequence[str], log_path: str | None = None, env: Mapping[str, str] | None = None):
        """flags: `bertserve serve` flags other than the ports; log_path: where its output goes (None: discarded);
        env: the child's whole environment (None: this process's)."""
        self.grpc_port, self.rest_port, self.log_path = free_port(), free_port(), log_path
        command = [sys.executable, "-m", "bertserve.cli", "serve", f"--port={self.grpc_port}",
                   f"--rest_api_port={self.rest_port}", *flags]
        if log_path is None:
            log = subprocess.DEVNULL
        else:
            os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
            log = open(log_path, "w", encoding="utf-8")
        try:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env=None if env is None else dict(env))
        finally:
            if log is not subprocess.DEVNULL:
                log.close()

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc_info) -> None:
        self.terminate()

    @property
    def target(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def rest_target(self) -> str:
        return f"localhost:{self.rest_port}"

    @property
    def rest(self) -> str:
        """The REST front end's base URL."""
        return f"http://{self.rest_target}"

    @property
    def rest_address(self) -> tuple[str, int]:
        """(host, port) of the REST front end, for callers that speak HTTP on a socket of their own."""
        return "localhost", self.rest_port

    @functools.cached_property
    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.target)

    @functools.cached_property
    def predict(self) -> prediction_service_pb2_grpc.PredictionServiceStub:
        return prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    @functools.cached_property
    def models(self) -> model_service_pb2_grpc.ModelServiceStub:
        return model_service_pb2_grpc.ModelServiceStub(self.channel)

    def log(self) -> str:
        if self.log_path is None:
            return "(output discarded)"
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def log_tail(self, lines: int = 30) -> str:
        return "".join(self.log().splitlines(keepends=True)[-lines:])

    def check_running(self, waiting_for: str) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"bertserve serve exited with {self.proc.returncode} before {waiting_for}; "
                               f"log tail:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 120.0) -> "ServerProcess":
        """Polls grpc.health.v1 until the server reports SERVING (it does once its models are loaded and both
        front ends listen)."""
        deadline = time.monotonic() + timeout
        health = health_pb2_grpc.HealthStub(self.channel)
        while True:
            self.check_running("it was serving")
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return self
            except grpc.RpcError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"not serving after {timeout:.0f} s; log tail:\n{self.log_tail()}")
            time.sleep(0.2)

    def wait_until_available(self, models: Sequence[str], timeout_s: float) -> "ServerProcess":
        """Polls ModelService.GetModelStatus until every model has an AVAILABLE version."""
        deadline = time.monotonic() + timeout_s
        pending = list(models)
        while pending:
            self.check_running("its models were available")
            if time.monotonic() > deadline:
                raise TimeoutError(f"models {pending} not AVAILABLE after {timeout_s:.0f} s; log tail:\n"
                                   f"{self.log_tail()}")
            request = get_model_status_pb2.GetModelStatusRequest()
            request.model_spec.name = pending[0]
            try:
                status = self.models.GetModelStatus(request, timeout=2.0)
                if any(v.state == AVAILABLE for v in status.model_version_status):
                    pending.pop(0)
                    continue
            except grpc.RpcError:
                pass  # not listening yet, or the model is still loading
            time.sleep(0.5)
        return self

    def metrics_text(self, prometheus_path: str = DEFAULT_PROMETHEUS_PATH) -> str:
        """The Prometheus exposition text (the monitoring config must enable it at prometheus_path)."""
        return requests.get(self.rest + prometheus_path, timeout=30).text

    def metrics(self, prometheus_path: str = DEFAULT_PROMETHEUS_PATH) -> server_metrics.Snapshot:
        """The batching and request counters now (server_metrics.batching_between subtracts two)."""
        return server_metrics.parse(self.metrics_text(prometheus_path))

    def batch_size_totals(self, model: str, prometheus_path: str = DEFAULT_PROMETHEUS_PATH) -> tuple[float, float]:
        """(rows, executed batches) of `model` so far, from the `bertserve_batch_size` histogram."""
        snapshot = self.metrics(prometheus_path)
        return snapshot.rows_sum[model], snapshot.batches[model]

    def terminate(self, timeout: float = 90.0) -> int:
        """SIGTERM (the server drains in-flight requests), SIGKILL only if it does not exit in time; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_channel()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_channel()

    def _close_channel(self) -> None:
        if "channel" in self.__dict__:
            self.__dict__.pop("channel").close()


def start_server(model_config_file: str, models: Sequence[str], log_path: str,
                 batching_parameters_file: str | None = None, extra_flags: Sequence[str] = (),
                 ready_timeout_s: float = 300.0) -> ServerProcess:
    flags = [f"--model_config_file={model_config_file}"]
    if batching_parameters_file:
        flags += ["--enable_batching=true", f"--batching_parameters_file={batching_parameters_file}"]
    server = ServerProcess([*flags, *extra_flags], log_path)
    try:
        server.wait_until_available(models, ready_timeout_s)
    except BaseException:
        server.terminate()
        raise
    return server


@contextlib.contextmanager
def running_server(model_config_file: str, models: Sequence[str], log_path: str, **kwargs) -> Iterator[ServerProcess]:
    server = start_server(model_config_file, models, log_path, **kwargs)
    try:
        yield server
    finally:
        server.terminate()


def write_model_config(path: str, models: dict[str, str]) -> str:
    """A ModelServerConfig text file serving each name -> base path (absolute, as TF Serving requires)."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    for name, base_path in models.items():
        entry = config.model_config_list.config.add()
        entry.name, entry.base_path, entry.model_platform = name, os.path.abspath(base_path), "tensorflow"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text_format.MessageToString(config))
    return path
