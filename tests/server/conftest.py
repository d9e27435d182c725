"""Fixtures for the server tests: tiny SavedModels on disk and real `bertserve serve` processes on free ports."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serving_harness import ServerProcess  # noqa: E402
from tf_serving_models import (half_plus_two_warmup_logs, write_half_plus_two_tf1,  # noqa: E402
                               write_half_plus_two_tf2, write_iris_like_classifier, write_warmup_logs)
from tiny_models import build_tiny_ranker  # noqa: E402

# The generated TF Serving kinds of model (tf_serving_models.py) and how tests reach them.
IRIS_SEED = 0


@pytest.fixture
def start_server(tmp_path):
    """Starts servers for one test (their logs in its temporary folder) and always stops them."""
    started: list[ServerProcess] = []

    def start(*flags: str, ready: bool = True, env: dict[str, str] | None = None,
              address_space_limit: int | None = None) -> ServerProcess:
        server = ServerProcess(*flags, log_dir=str(tmp_path), env=env, address_space_limit=address_space_limit)
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


@pytest.fixture(scope="module")
def tiny_server(models_dir, tmp_path_factory):
    """A plain server of the tiny ranker (no batching) for one test module."""
    process = ServerProcess("--model_name=tiny", f"--model_base_path={models_dir}/tiny",
                            log_dir=str(tmp_path_factory.mktemp("tiny_server"))).wait_ready()
    yield process
    process.kill()


@pytest.fixture(scope="session")
def tf_serving_models(tmp_path_factory) -> str:
    """half_plus_two (TF1: versions 00000123 with a warmup record of each kind, and 00000124 with b=3),
    half_plus_two_tf2 (00000123) and iris (00000001), laid out as TF Serving's testdata."""
    root = str(tmp_path_factory.mktemp("tf_serving_models"))
    first = write_half_plus_two_tf1(os.path.join(root, "half_plus_two"), "00000123")
    write_warmup_logs(first, half_plus_two_warmup_logs("half_plus_two"))
    write_half_plus_two_tf1(os.path.join(root, "half_plus_two"), "00000124", b=3.0)
    write_half_plus_two_tf2(os.path.join(root, "half_plus_two_tf2"), "00000123")
    write_iris_like_classifier(os.path.join(root, "iris"), "00000001", seed=IRIS_SEED)
    return root


def tf_serving_config(root: str, path: str, models_dir: str) -> str:
    """A model config file serving the generated models (every version of half_plus_two) and the tiny ranker."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"""model_config_list {{
  config {{ name: "half_plus_two" base_path: "{root}/half_plus_two" model_platform: "tensorflow"
           model_version_policy {{ all {{}} }} }}
  config {{ name: "half_plus_two_tf2" base_path: "{root}/half_plus_two_tf2" model_platform: "tensorflow" }}
  config {{ name: "iris" base_path: "{root}/iris" model_platform: "tensorflow" }}
  config {{ name: "tiny" base_path: "{models_dir}/tiny" model_platform: "tensorflow" }}
}}""")
    return path


@pytest.fixture(scope="session")
def tf_serving_server(tf_serving_models, models_dir, tmp_path_factory):
    """One batching server for the TF Serving API tests (Predict, Classify, Regress, MultiInference)."""
    config_dir = tmp_path_factory.mktemp("tf_serving_server")
    config = tf_serving_config(tf_serving_models, str(config_dir / "models.config"), models_dir)
    (config_dir / "batching.txt").write_text(
        "max_batch_size { value: 16 } batch_timeout_micros { value: 2000 } num_batch_threads { value: 2 }")
    process = ServerProcess(f"--model_config_file={config}", "--enable_batching",
                            f"--batching_parameters_file={config_dir}/batching.txt", log_dir=str(config_dir))
    yield process.wait_ready()
    assert process.terminate() == 0


@pytest.fixture(scope="session")
def tf_serving_server_unbatched(tf_serving_models, models_dir, tmp_path_factory):
    """The same models without batching: requests of any shape (scalars, outputs without a batch dimension)."""
    config_dir = tmp_path_factory.mktemp("tf_serving_server_unbatched")
    config = tf_serving_config(tf_serving_models, str(config_dir / "models.config"), models_dir)
    process = ServerProcess(f"--model_config_file={config}", log_dir=str(config_dir))
    yield process.wait_ready()
    assert process.terminate() == 0
