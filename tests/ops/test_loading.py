"""Loading the op library: the path next to the package, the $BERTSERVE_OPS_LIBRARY override, a clear error."""

from __future__ import annotations

import os
import subprocess
import sys

from bertserve import custom_ops

PROBE = ("from bertserve import custom_ops as ops; lib = ops.load_op_library(); "
         "print(ops.library_path()); print(hasattr(lib, 'bert_encoder'))")


def run_probe(env_value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != custom_ops.LIBRARY_ENV}
    if env_value is not None:
        env[custom_ops.LIBRARY_ENV] = env_value
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)


def test_default_path_is_next_to_the_package():
    result = run_probe(None)
    assert result.returncode == 0, result.stderr[-2000:]
    path, has_op = result.stdout.split()[-2:]
    assert path == os.path.join(os.path.dirname(custom_ops.__file__), custom_ops.LIBRARY_FILE)
    assert has_op == "True"


def test_environment_variable_overrides_the_path(tmp_path):
    copy = tmp_path / "renamed_ops.so"
    copy.write_bytes(open(custom_ops.library_path(), "rb").read())
    result = run_probe(str(copy))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-2:] == [str(copy), "True"]


def test_missing_library_names_the_path_and_the_fix(tmp_path):
    result = run_probe(str(tmp_path / "absent.so"))
    assert result.returncode != 0
    assert "FileNotFoundError" in result.stderr
    assert "absent.so" in result.stderr and "make ops" in result.stderr
