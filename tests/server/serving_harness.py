"""A real `bertserve serve` process on free ports, for the server tests (imported by conftest and test modules;
a uniquely named module, since every test folder has a conftest). Launching, waiting, the stubs and
stopping are bertserve.loadtest.server_process's; this starts it the tests' way."""

from __future__ import annotations

import os
import re
import resource
import tempfile

from bertserve.loadtest import server_process
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


class ServerProcess(server_process.ServerProcess):
    """The one `bertserve serve` launcher (bertserve.loadtest.server_process), started the tests' way: its log in
    the test's temporary folder, TensorFlow's C++ logging quiet, optionally under an address-space limit."""

    def __init__(self, *flags: str, log_dir: str, env: dict[str, str] | None = None,
                 address_space_limit: int | None = None):
        """log_dir: a test's temporary folder (pytest keeps those of its last three runs, then removes them).
        address_space_limit: RLIMIT_AS in bytes, set as the process starts, so that a request that makes the
        server allocate gigabytes fails (MemoryError, a crash) instead of exhausting the machine."""
        handle, log_path = tempfile.mkstemp(prefix="serve-", suffix=".log", dir=log_dir)
        os.close(handle)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **(env or {}))
        super().__init__(flags, log_path, env)
        if address_space_limit is not None:
            resource.prlimit(self.proc.pid, resource.RLIMIT_AS, (address_space_limit, address_space_limit))
