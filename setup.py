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
    files = sorted(os.path.relpath(f, HERE) for p in patterns for f in glob.glob(os.path.join(HERE, p)))
    return [f for f in files if not f.endswith(".cu.cc") and not f.endswith("_test.cc") and "_gpu" not in f]


def blas_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags for OpenBLAS from the scipy-openblas32 wheel (DYNAMIC_ARCH: picks its kernels for the
    CPU at run time). Its symbols carry the prefix `scipy_` (BLAS_SYMBOL_PREFIX); the rpath lets the op library
    find it wherever the wheel is installed. The Bazel build uses the same flags (see custom_ops/README.md)."""
    try:
        import scipy_openblas32
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("building the ops needs OpenBLAS: pip install scipy-openblas32") from e
    lib_dir = scipy_openblas32.get_lib_dir()
    compile_flags = ["-I", scipy_openblas32.get_include_dir(), "-DBLAS_SYMBOL_PREFIX=scipy_"]
    link_flags = ["-L", lib_dir, f"-l{scipy_openblas32.get_library()}", f"-Wl,-rpath,{lib_dir}"]
    return compile_flags, link_flags


class TensorFlowOpBuild(build_ext):
    """Compiles an Extension as a TF op library: tf.sysconfig flags, no Python C-API."""

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext: Extension) -> None:
        import tensorflow as tf  # needs --no-build-isolation: the op is built against the installed TF

        try:
            blas_compile, blas_link = blas_flags()
        except ModuleNotFoundError:
            if not self.editable_mode:
                raise
            # `pip install -e .` builds before it installs the dependencies; `make ops` builds the library after.
            print("scipy-openblas32 is not installed yet: skipping the op library (build it with `make ops`)")
            return
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [
            os.environ.get("CXX", "g++"), "-shared", "-fPIC", "-O3", "-DNDEBUG",
            "-fvisibility=hidden", *tf.sysconfig.get_compile_flags(), *blas_compile, "-I", HERE,
            *(os.path.join(HERE, src) for src in ext.sources), "-o", out, *tf.sysconfig.get_link_flags(), *blas_link,
        ]
        print(" ".join(cmd))
        subprocess.check_call(cmd)


SOURCES = op_sources()
setup(
    ext_modules=[Extension("bertserve.custom_ops._bert_ops", sources=SOURCES)] if SOURCES else [],
    cmdclass={"build_ext": TensorFlowOpBuild},
)
