"""Starts and stops `bertserve serve` as a child process: the tuner restarts it for every batching parameter set
(TF Serving reads batching parameters once, at start), and the demo, the tests and the benchmarks run against the
real server. The one place that launches it and waits for it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator, Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

AVAILABLE = get_model_status_pb2.ModelVersionStatus.State.AVAILABLE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class ServerProcess:
    process: subprocess.Popen
    grpc_port: int
    rest_port: int
    log_path: str | None  # None: output discarded

    @property
    def target(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def rest_target(self) -> str:
        return f"localhost:{self.rest_port}"

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None:
            return "(output discarded)"
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def check_running(self, waiting_for: str) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"bertserve serve exited with {self.process.returncode} before {waiting_for}; "
                               f"log tail:\n{self.log_tail()}")

    def wait_serving(self, timeout_s: float = 120.0) -> None:
        """Polls grpc.health.v1 until the server reports SERVING (it does once its models are loaded and both
        front ends listen)."""
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                self.check_running("it was serving")
                try:
                    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not serving after {timeout_s:.0f} s; log tail:\n{self.log_tail()}")
                time.sleep(0.2)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (the server drains in-flight requests), SIGKILL only if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def launch(flags: Sequence[str], log_path: str | None, env: Mapping[str, str] | None = None) -> ServerProcess:
    """`bertserve serve` with flags on two free ports (gRPC, REST), its output to log_path (None: discarded). It
    returns at once: wait_serving or wait_until_available waits for the server."""
    grpc_port, rest_port = free_port(), free_port()
    command = [sys.executable, "-m", "bertserve.cli", "serve", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
               *flags]
    if log_path is None:
        log = subprocess.DEVNULL
    else:
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        log = open(log_path, "w", encoding="utf-8")
    try:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=None if env is None else dict(env))
    finally:
        if log is not subprocess.DEVNULL:
            log.close()
    return ServerProcess(process, grpc_port, rest_port, log_path)


def wait_until_available(server: ServerProcess, models: Sequence[str], timeout_s: float) -> None:
    """Polls ModelService.GetModelStatus until every model has an AVAILABLE version."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(server.target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        pending = list(models)
        while pending:
            server.check_running("its models were available")
            if time.monotonic() > deadline:
                raise TimeoutError(f"models {pending} not AVAILABLE after {timeout_s:.0f} s; log tail:\n"
                                   f"{server.log_tail()}")
            request = get_model_status_pb2.GetModelStatusRequest()
            request.model_spec.name = pending[0]
            try:
                status = stub.GetModelStatus(request, timeout=2.0)
                if any(v.state == AVAILABLE for v in status.model_version_status):
                    pending.pop(0)
                    continue
            except grpc.RpcError:
                pass  # not listening yet, or the model is still loading
            time.sleep(0.5)


def start_server(model_config_file: str, models: Sequence[str], log_path: str,
                 batching_parameters_file: str | None = None, extra_flags: Sequence[str] = (),
                 ready_timeout_s: float = 300.0) -> ServerProcess:
    flags = [f"--model_config_file={model_config_file}"]
    if batching_parameters_file:
        flags += ["--enable_batching=true", f"--batching_parameters_file={batching_parameters_file}"]
    server = launch([*flags, *extra_flags], log_path)
    try:
        wait_until_available(server, models, ready_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def running_server(model_config_file: str, models: Sequence[str], log_path: str, **kwargs) -> Iterator[ServerProcess]:
    server = start_server(model_config_file, models, log_path, **kwargs)
    try:
        yield server
    finally:
        server.stop()


def batch_size_totals(rest_target: str, prometheus_path: str, model: str) -> tuple[float, float]:
    """(rows, executed batches) of `model` so far, from the server's Prometheus `bertserve_batch_size` histogram."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"http://{rest_target}{prometheus_path}", timeout=30).text
    totals = {"sum": 0.0, "count": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name == "bertserve_batch_size":
            for sample in family.samples:
                kind = sample.name.rsplit("_", 1)[-1]
                if kind in totals and sample.labels.get("model_name") == model:
                    totals[kind] += sample.value
    return totals["sum"], totals["count"]


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
