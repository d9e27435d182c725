"""Builds the fused-encoder op library with g++ and TensorFlow's own compile/link flags (no Bazel).

`pip install --no-build-isolation -e .` runs this; so does `python setup.py build_ext --inplace`. configure.sh
imports it for the MKL paths (`mkl_paths`), so the Bazel build links the same MKL.
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


def wheel_file(distribution: str, name: str) -> str:
    """Absolute path of the file `name` that the installed wheel `distribution` put in place."""
    from importlib import metadata

    try:
        files = metadata.distribution(distribution).files or []
    except metadata.PackageNotFoundError as e:
        raise ModuleNotFoundError(f"building the ops needs MKL: pip install {distribution}") from e
    for file in files:
        if file.name == name:
            return str(file.locate().resolve())
    raise FileNotFoundError(f"the {distribution} wheel has no {name}: reinstall it")


def mkl_paths() -> tuple[str, str]:
    """Intel MKL as the mkl and mkl-include wheels installed it: the folder of mkl.h, and the single dynamic
    library libmkl_rt, which picks its kernels for the CPU at run time. configure.sh gives the Bazel build the
    same two paths."""
    return os.path.dirname(wheel_file("mkl-include", "mkl.h")), wheel_file("mkl", "libmkl_rt.so.3")


def blas_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags for MKL (see custom_ops/README.md); the rpath lets the op library find libmkl_rt
    wherever the wheel is installed, and libmkl_rt its CPU-specific parts in its own folder."""
    include_dir, library = mkl_paths()
    return ["-I", include_dir], [library, f"-Wl,-rpath,{os.path.dirname(library)}"]


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
            print("MKL is not installed yet: skipping the op library (build it with `make ops`)")
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


if __name__ == "__main__":  # pip's build backend runs this file as __main__ too; configure.sh imports it
    sources = op_sources()
    setup(
        ext_modules=[Extension("bertserve.custom_ops._bert_ops", sources=sources)] if sources else [],
        cmdclass={"build_ext": TensorFlowOpBuild},
    )
