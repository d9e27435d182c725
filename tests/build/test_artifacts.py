"""The pip-built and the Bazel-built op libraries are the same code: identical outputs on the same inputs.

Each library runs in its own process (an op library registers its ops once per process); bertserve.custom_ops
loads the one named by BERTSERVE_OPS_LIBRARY. The Bazel artifact comes from `./configure.sh && bazel build
//custom_ops:all` (`make bazel`); this test skips only when that has not been run, and fails when the artifact is
older than the sources (bazel_freshness).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bazel_freshness import stale_reason

REPO = Path(__file__).resolve().parents[2]
PIP_LIBRARY = REPO / "custom_ops" / "_bert_ops.so"
BAZEL_LIBRARY = REPO / "bazel-bin" / "custom_ops" / "_bert_ops.so"
RUNNER = Path(__file__).with_name("op_outputs.py")


def outputs_of(library: Path, out: Path) -> dict[str, np.ndarray]:
    """Runs op_outputs.py in a fresh interpreter with `library` selected; returns what it saved in `out`."""
    env = dict(os.environ, BERTSERVE_OPS_LIBRARY=str(library), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, str(RUNNER), str(out)], env=env, cwd=out.parent,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{RUNNER.name} with {library} failed:\n{done.stderr[-4000:]}"
    with np.load(out) as saved:
        return {name: saved[name] for name in saved.files}


def dynamic_section(library: Path) -> tuple[list[str], list[str]]:
    """The NEEDED libraries and the RUNPATH folders of a shared library, as readelf reads them."""
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dynamic)
    runpath = [folder for path in re.findall(r"\(RUNPATH\)\s+Library runpath: \[(.*)\]", dynamic)
               for folder in path.split(":")]
    return needed, runpath


def setup_module_of_repo():
    """The repository's setup.py as a module (importing it does not run setuptools.setup())."""
    spec = importlib.util.spec_from_file_location("bertserve_setup", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def both_libraries() -> tuple[Path, Path]:
    """The pip and the Bazel artifact."""
    if not BAZEL_LIBRARY.exists():
        pytest.skip(f"Bazel artifact {BAZEL_LIBRARY.relative_to(REPO)} not built: run "
                    "`./configure.sh && bazel build //custom_ops:all` (make bazel)")
    stale = stale_reason(BAZEL_LIBRARY, REPO)
    if stale:
        pytest.fail(f"stale Bazel artifact: {stale}")
    assert PIP_LIBRARY.exists(), f"pip artifact {PIP_LIBRARY} missing: run `make ops` (setup.py build_ext --inplace)"
    return PIP_LIBRARY, BAZEL_LIBRARY


@pytest.fixture(scope="module")
def both_outputs(both_libraries, tmp_path_factory) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    pip_library, bazel_library = both_libraries
    tmp_path = tmp_path_factory.mktemp("artifacts")
    return outputs_of(pip_library, tmp_path / "pip.npz"), outputs_of(bazel_library, tmp_path / "bazel.npz")


def test_each_process_loaded_the_library_it_was_given(both_outputs):
    pip, bazel = both_outputs
    assert [Path(p).resolve() for p in pip["mapped_libraries"]] == [PIP_LIBRARY.resolve()]
    assert [Path(p).resolve() for p in bazel["mapped_libraries"]] == [BAZEL_LIBRARY.resolve()]


def test_outputs_are_bit_identical(both_outputs):
    pip, bazel = both_outputs
    names = sorted(n for n in pip if n != "mapped_libraries")
    assert names == sorted(n for n in bazel if n != "mapped_libraries")
    # 2 head sizes x 2 dtypes x (embedding, cu_seqlens, encoder, first_token, first_token_only, ranker_head)
    assert len(names) == 24
    for name in names:
        assert pip[name].dtype == bazel[name].dtype and pip[name].shape == bazel[name].shape, name
        assert np.isfinite(pip[name]).all() and np.any(pip[name] != 0), f"{name}: degenerate output {pip[name]}"
        assert pip[name].tobytes() == bazel[name].tobytes(), (
            f"{name}: pip and Bazel builds differ (max abs diff "
            f"{np.max(np.abs(pip[name].astype(np.float64) - bazel[name].astype(np.float64)))})")


def test_both_link_mkl_where_its_wheel_put_it(both_libraries):
    """libmkl_rt loads its CPU-specific parts from the folder it was loaded from, so both builds must find it in
    the mkl wheel's own folder, the one setup.py names (configure.sh hands Bazel the same path), not in a copy."""
    mkl_folder = os.path.dirname(setup_module_of_repo().mkl_paths()[1])
    for library in both_libraries:
        needed, runpath = dynamic_section(library)
        assert "libmkl_rt.so.3" in needed, f"{library} does not link libmkl_rt: {needed}"
        assert mkl_folder in runpath, f"{library} does not look for MKL in {mkl_folder}: RUNPATH {runpath}"
