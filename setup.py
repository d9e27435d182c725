"""Builds the fused-encoder op library with g++ and TensorFlow's own compile/link flags (no Bazel).

`pip install --no-build-isolation -e .` runs this; so does `python setup.py build_ext --inplace`.
The same sources build with Bazel (`bazel build //custom_ops:all`); tests check both give identical outputs.
"""

from __future__ import annotations

import glob
import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def op_sources() -> list[str]:
    """CPU core + TF wrappers; CUDA sources (*.cu.cc) are built separately (see custom_ops/README.md)."""
    patterns = ["custom_ops/kernels/*.cc", "custom_ops/tf/*.cc"]
    files = sorted(f for p in patterns for f in glob.glob(os.path.join(HERE, p)))
    return [f for f in files if not f.endswith(".cu.cc") and not f.endswith("_test.cc")]


class TensorFlowOpBuild(build_ext):
    """Compiles an Extension as a TF op library: tf.sysconfig flags, no Python C-API."""

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext: Extension) -> None:
        import tensorflow as tf  # needs --no-build-isolation: the op is built against the installed TF

        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [
            os.environ.get("CXX", "g++"), "-shared", "-fPIC", "-O3", "-DNDEBUG",
            "-fvisibility=hidden", *tf.sysconfig.get_compile_flags(), "-I", HERE,
            *ext.sources, "-o", out, *tf.sysconfig.get_link_flags(), *ext.extra_link_args,
        ]
        print(" ".join(cmd))
        subprocess.check_call(cmd)


SOURCES = op_sources()
setup(
    ext_modules=[Extension("bertserve.custom_ops._bert_ops", sources=SOURCES)] if SOURCES else [],
    cmdclass={"build_ext": TensorFlowOpBuild},
)
