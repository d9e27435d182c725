"""add_bertserve_ops.sh edits a TensorFlow Serving tree as g3doc/custom_op.md says, and only that.

The real TF Serving build cannot run here (it downloads and compiles all of TensorFlow); these tests run the
script on a tree holding the two files it edits, with SUPPORTED_TENSORFLOW_OPS written as in TF Serving 2.x.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "serving_config" / "tensorflow_model_server" / "add_bertserve_ops.sh"
OPS_LABEL = "@bertserve//custom_ops:bert_ops"
GPU_OPS_LABEL = "@bertserve//custom_ops/gpu:bert_ops_gpu"
CUDA_CORE_LOAD = 'load("@bertserve//third_party:cuda_core.bzl", "cuda_core_repository")'
CUDA_CORE_REPOSITORY = 'cuda_core_repository(name = "bertserve_cuda")'

SERVERS_BUILD = '''\
SUPPORTED_TENSORFLOW_OPS = if_v2([]) + if_not_v2([
    "@org_tensorflow//tensorflow/contrib:contrib_kernels",
]) + [
    "@org_tensorflow_text//tensorflow_text:ops_lib",
]

cc_library(
    name = "server_lib",
    deps = [":server_core"] + SUPPORTED_TENSORFLOW_OPS,
)
'''


@pytest.fixture
def serving_tree(tmp_path: Path) -> Path:
    (tmp_path / "tensorflow_serving" / "model_servers").mkdir(parents=True)
    (tmp_path / "WORKSPACE").write_text('workspace(name = "tf_serving")\n')
    (tmp_path / "tensorflow_serving" / "model_servers" / "BUILD").write_text(SERVERS_BUILD)
    return tmp_path


def run_script(serving: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *flags, str(serving), str(REPO)], capture_output=True, text=True, timeout=30)


def edited_files(serving: Path) -> list[str]:
    return [(serving / name).read_text() for name in ("WORKSPACE", "tensorflow_serving/model_servers/BUILD")]


def supported_ops(build_text: str) -> list[str]:
    """Evaluates the SUPPORTED_TENSORFLOW_OPS assignment (Starlark here is valid Python) for a TF2 build."""
    statement = re.search(r"^SUPPORTED_TENSORFLOW_OPS = .*?^\]\n", build_text, re.S | re.M).group(0)
    scope = {"if_v2": lambda x: x, "if_not_v2": lambda x: []}
    exec(statement, scope)
    return scope["SUPPORTED_TENSORFLOW_OPS"]


def test_ops_are_linked_into_the_model_server(serving_tree: Path):
    done = run_script(serving_tree)
    assert done.returncode == 0, done.stderr
    build_text = (serving_tree / "tensorflow_serving" / "model_servers" / "BUILD").read_text()
    assert supported_ops(build_text) == [OPS_LABEL, "@org_tensorflow_text//tensorflow_text:ops_lib"]
    assert build_text.replace(f'["{OPS_LABEL}"] + ', "") == SERVERS_BUILD
    workspace = (serving_tree / "WORKSPACE").read_text()
    assert f'name = "bertserve",\n    path = "{REPO}",' in workspace
    for name in ("tensorflow", "blas"):
        assert f'name = "bertserve_{name}",\n    path = "{REPO}/third_party/serving/{name}",' in workspace
    assert "bertserve_cuda" not in workspace


def test_gpu_mode_also_links_the_gpu_kernels(serving_tree: Path):
    done = run_script(serving_tree, "--gpu")
    assert done.returncode == 0, done.stderr
    workspace, build_text = edited_files(serving_tree)
    assert supported_ops(build_text) == [GPU_OPS_LABEL, OPS_LABEL, "@org_tensorflow_text//tensorflow_text:ops_lib"]
    # The archive's repository rule is loaded from @bertserve, so it must come after that repository.
    assert workspace.index(f'path = "{REPO}",') < workspace.index(CUDA_CORE_LOAD) < workspace.index(
        CUDA_CORE_REPOSITORY)
    assert (REPO / "custom_ops" / "gpu" / "BUILD").read_text().count('name = "bert_ops_gpu"') == 1


@pytest.mark.parametrize("runs", [((), ()), (("--gpu",), ("--gpu",)), (("--gpu",), ())], ids=str)
def test_running_twice_changes_nothing(serving_tree: Path, runs: tuple[tuple[str, ...], tuple[str, ...]]):
    """Again with the same flags, or without --gpu after it: the tree stays as the first run left it."""
    first_flags, second_flags = runs
    assert run_script(serving_tree, *first_flags).returncode == 0
    first = edited_files(serving_tree)
    assert run_script(serving_tree, *second_flags).returncode == 0
    assert edited_files(serving_tree) == first


def test_gpu_mode_after_a_cpu_run_adds_only_the_gpu_parts(serving_tree: Path):
    assert run_script(serving_tree).returncode == 0
    cpu_workspace, _ = edited_files(serving_tree)
    assert run_script(serving_tree, "--gpu").returncode == 0
    workspace, build_text = edited_files(serving_tree)
    assert supported_ops(build_text) == [GPU_OPS_LABEL, OPS_LABEL, "@org_tensorflow_text//tensorflow_text:ops_lib"]
    assert workspace.startswith(cpu_workspace) and workspace.count('name = "bertserve"') == 1
    assert CUDA_CORE_REPOSITORY in workspace[len(cpu_workspace):]


def test_a_tree_without_supported_tensorflow_ops_is_refused(serving_tree: Path):
    servers_build = serving_tree / "tensorflow_serving" / "model_servers" / "BUILD"
    servers_build.write_text(SERVERS_BUILD.replace("SUPPORTED_TENSORFLOW_OPS", "LINKED_OPS"))
    done = run_script(serving_tree)
    assert done.returncode != 0
    assert "no 'SUPPORTED_TENSORFLOW_OPS = ' line" in done.stderr
    assert (serving_tree / "WORKSPACE").read_text() == 'workspace(name = "tf_serving")\n'


def test_a_directory_that_is_not_a_serving_tree_is_refused(tmp_path: Path):
    done = run_script(tmp_path)
    assert done.returncode != 0
    assert f"{tmp_path}/WORKSPACE not found" in done.stderr


def test_an_unknown_option_is_refused(serving_tree: Path):
    done = run_script(serving_tree, "--cuda")
    assert done.returncode != 0
    assert "usage:" in done.stderr and "[--gpu]" in done.stderr
    assert edited_files(serving_tree) == ['workspace(name = "tf_serving")\n', SERVERS_BUILD]
