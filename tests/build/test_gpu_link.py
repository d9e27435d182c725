"""//custom_ops/gpu links the TF GPU kernels into one binary with the ops, as a GPU tensorflow_model_server does.

A GPU server adds //custom_ops/gpu:bert_ops_gpu to SUPPORTED_TENSORFLOW_OPS (add_bertserve_ops.sh --gpu): the TF
GPU kernels compiled by Bazel, over the CUDA core that custom_ops/kernels/cuda/build.sh packs into
libbertserve_cuda_core.a (core_archive.sh), plus //custom_ops:bert_ops. These tests build the same link as a
loadable library, //custom_ops/gpu:_bert_ops_with_gpu.so, against the pip TensorFlow, and load it on this machine
(no GPU is needed to register kernels). They skip where the archive or the CUDA 13 headers are missing (CI has
neither): `make gpu-ops` builds the archive; BERTSERVE_CUDA_CORE and CUDA_HOME point elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = Path(os.environ.get("BERTSERVE_CUDA_CORE", REPO / "build" / "cuda" / "libbertserve_cuda_core.a")).absolute()
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
TARGET = "//custom_ops/gpu:_bert_ops_with_gpu.so"
LIBRARY = REPO / "bazel-bin" / "custom_ops" / "gpu" / "_bert_ops_with_gpu.so"
OPS_LIBRARY = REPO / "custom_ops" / "_bert_ops.so"
RUNNER = Path(__file__).with_name("registered_kernels.py")
# The CUDA runtime API and its internal entry points (cudaMalloc, __cudaRegisterFatBinary, ...) and the driver
# API (cuStreamBeginCapture, ...): TensorFlow defines all of them for its own CUDA 12 runtime.
CUDA_RUNTIME_SYMBOL = re.compile(r"^(cuda|__cuda|cu[A-Z])")
# What core_archive.sh leaves global: the core's namespace (functions, vtables, typeinfo) and, renamed with this
# prefix, the GNU unique symbols it cannot make local.
CORE_INTERFACE_SYMBOL = re.compile(r"^(_Z(T[VIST])?N[KVR]*9bertserve4cuda|bertserve_cuda_core\.)")


@pytest.fixture(scope="module")
def archive() -> Path:
    if not (CUDA_HOME / "include" / "cuda_runtime.h").exists():
        pytest.skip(f"no CUDA toolkit at {CUDA_HOME} (its headers compile the TF GPU kernels): set CUDA_HOME")
    if not ARCHIVE.exists():
        pytest.skip(f"no CUDA core archive at {ARCHIVE}: `make gpu-ops` builds it (custom_ops/kernels/cuda/build.sh), "
                    "or set BERTSERVE_CUDA_CORE")
    return ARCHIVE


@pytest.fixture(scope="module")
def linked_library(archive: Path) -> Path:
    """The Bazel link of the GPU kernels, the core archive and the ops (`make bazel` has run configure.sh)."""
    done = subprocess.run(["bazel", "build", f"--repo_env=BERTSERVE_CUDA_CORE={archive}",
                           f"--repo_env=BERTSERVE_CUDA_HOME={CUDA_HOME}", TARGET],
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"bazel build {TARGET} failed:\n{done.stderr[-4000:]}"
    return LIBRARY


def nm(path: Path, *flags: str) -> list[str]:
    """Symbol names (mangled) that `nm` lists for path with flags."""
    out = subprocess.run(["nm", "--format=posix", *flags, str(path)], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if len(line.split()) >= 2]


def demangled(names: list[str]) -> list[str]:
    return subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                          check=True).stdout.splitlines()


def registered_kernels(*libraries: Path) -> dict[str, dict[str, list[dict[str, list[str]]]]]:
    """{op: {device: constraint sets}} for the ops that libraries register, loaded in order in a fresh process."""
    done = subprocess.run([sys.executable, str(RUNNER), *map(str, libraries)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, f"loading {[str(lib) for lib in libraries]} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


def test_archive_shares_nothing_but_the_core_interface(archive: Path):
    """A server's static link also holds TensorFlow's CUDA 12 runtime and XLA's CUTLASS host code: any other
    global of the archive (its CUDA 13 runtime, CUTLASS's inline launchers) could be defined twice or merged with
    theirs, and the core's runtime calls must not be left open either (they would go to TensorFlow's runtime)."""
    shared = [name for name in nm(archive, "-g", "--defined-only") if not CORE_INTERFACE_SYMBOL.match(name)]
    assert shared == [], f"{archive} defines globals outside the core's interface: {demangled(shared[:10])}"
    open_calls = [name for name in nm(archive, "--undefined-only") if CUDA_RUNTIME_SYMBOL.match(name)]
    assert open_calls == [], f"{archive} leaves CUDA runtime calls to the binary it is linked into: {open_calls}"


def test_no_bertserve_symbol_is_left_undefined(linked_library: Path):
    undefined = [name for name in demangled(nm(linked_library, "-D", "--undefined-only")) if "bertserve" in name]
    assert undefined == [], (f"{linked_library.name} leaves bertserve symbols undefined (a core source missing from "
                             f"the archive, or an archive older than the sources?): {undefined}")


def test_gpu_kernels_are_registered_for_every_op(linked_library: Path):
    assert OPS_LIBRARY.exists(), f"{OPS_LIBRARY} missing: run `make ops`"
    pip_ops = registered_kernels(OPS_LIBRARY)
    linked = registered_kernels(linked_library)
    assert sorted(linked) == sorted(pip_ops), "the linked library registers other ops than _bert_ops.so"
    for op, by_device in linked.items():
        assert by_device.get("CPU") == pip_ops[op]["CPU"], f"{op}: CPU kernels differ from _bert_ops.so's"
        assert by_device.get("GPU") == by_device["CPU"], (
            f"{op}: GPU kernels {by_device.get('GPU')} do not cover the types of its CPU kernels {by_device['CPU']}")
