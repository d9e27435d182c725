"""Fixtures for the server tests: tiny SavedModels on disk and real `bertserve serve` processes on free ports."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serving_harness import ServerProcess  # noqa: E402
from tiny_models import build_tiny_ranker  # noqa: E402


@pytest.fixture
def start_server(tmp_path):
    """Starts servers for one test (their logs in its temporary folder) and always stops them."""
    started: list[ServerProcess] = []

    def start(*flags: str, ready: bool = True, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(*flags, log_dir=str(tmp_path), env=env)
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
