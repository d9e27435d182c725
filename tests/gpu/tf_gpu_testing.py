"""Shared by the TensorFlow GPU tests (test_tf_gpu_*.py; a module, not conftest, so they import it by a unique name):
where they run, what they compare with, the served variants and the GPU kernels library's counters.

They run the fused SavedModels through tf.saved_model.load on GPU:0 against what gpu_rig/reference.py wrote on the CPU
machine (the folder named by $BERTSERVE_GPU_REFERENCE). On the GPU machine, from the repository root:
`source gpu_rig/env.sh && gpu_rig/run_tf_tests.sh`. They skip, saying why, where TensorFlow lists no GPU, the GPU
kernels library (_bert_ops_gpu.so beside the op library) is absent or $BERTSERVE_GPU_REFERENCE is unset.
BERTSERVE_TEST_DEVICE=CPU runs the same checks on the CPU op where they make sense (debugging on a machine without
GPU; the GPU-only ones skip), e.g. `BERTSERVE_GPU_REFERENCE=.device_carry/reference BERTSERVE_TEST_DEVICE=CPU
.venv/bin/python -m pytest -q tests/gpu -k tf`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import re
import threading

import numpy as np
import pytest

from bertserve.gpu_rig import reference as carried

DEVICE_ENV = "BERTSERVE_TEST_DEVICE"
REFERENCE_ENV = "BERTSERVE_GPU_REFERENCE"
BATCH_SIZES = (1, 2, 7, 32, 33, 512, 8192)
# The CPU op takes minutes for the largest batches on a small machine; on CPU the tests stop at this batch size.
CPU_MAX_BATCH = 512
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-3}  # max abs score error against float64 (the targets)
VARIANTS = [pytest.param((model, precision), id=f"{model}-{precision}")
            for model in carried.MODELS for precision in carried.PRECISIONS]


def device_kind() -> str:
    kind = os.environ.get(DEVICE_ENV, "GPU").upper()
    if kind not in ("GPU", "CPU"):
        raise ValueError(f"${DEVICE_ENV} must be GPU or CPU, got {kind!r}")
    return kind


def on_gpu() -> bool:
    return device_kind() == "GPU"


def device_name() -> str:
    return f"/{device_kind()}:0"


def reference_dir() -> str:
    return os.environ.get(REFERENCE_ENV, "")


def gpu_kernels_path() -> str:
    from bertserve import custom_ops

    return os.path.join(os.path.dirname(custom_ops.library_path()), custom_ops.GPU_LIBRARY_FILE)


@functools.cache
def skip_reason() -> str | None:
    """What this machine lacks to run the TensorFlow GPU tests (on the device BERTSERVE_TEST_DEVICE names), or None."""
    import tensorflow as tf

    from bertserve import custom_ops

    lacks = []
    if on_gpu() and not tf.config.list_physical_devices("GPU"):
        lacks.append("TensorFlow lists no GPU (on a CPU machine, BERTSERVE_TEST_DEVICE=CPU runs the CPU op)")
    if not os.path.isfile(custom_ops.library_path()):
        lacks.append(f"no op library at {custom_ops.library_path()} (make ops, or gpu_rig/build_ops.sh)")
    if on_gpu() and not os.path.isfile(gpu_kernels_path()):
        lacks.append(f"no TF GPU kernels library at {gpu_kernels_path()} (gpu_rig/build_ops.sh)")
    if not reference_dir():
        lacks.append(f"${REFERENCE_ENV} is unset (the folder gpu_rig/reference.py writes, carried to the GPU machine)")
    elif not os.path.isfile(os.path.join(reference_dir(), carried.SCORES_FILE)):
        lacks.append(f"no {carried.SCORES_FILE} in ${REFERENCE_ENV}={reference_dir()} (gpu_rig/reference.py)")
    return "; ".join(lacks) or None


needs_device = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
gpu_only = pytest.mark.skipif(not on_gpu(), reason="checks the GPU kernels alone (BERTSERVE_TEST_DEVICE=CPU)")


def batch_sizes() -> list[int]:
    return [b for b in BATCH_SIZES if on_gpu() or b <= CPU_MAX_BATCH]


@dataclasses.dataclass
class Served:
    """A fused variant exported into a temporary folder and loaded on the test device, with what it must give."""

    model: str
    precision: str
    config: object  # its BertConfig
    path: str
    loaded: object  # the loaded SavedModel: keeps the signature's variables alive
    reference: np.ndarray  # float64 scores of every pool row
    cpu_op: np.ndarray  # the CPU fused op's scores of every pool row, computed on the CPU machine

    @property
    def signature(self):
        from bertserve.model_dir import SIGNATURE_NAME

        return self.loaded.signatures[SIGNATURE_NAME]

    def scores(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        import tensorflow as tf

        from bertserve.model_dir import OUTPUT_NAME

        return self.signature(**{name: tf.constant(value) for name, value in inputs.items()})[OUTPUT_NAME].numpy()


def load_saved_model(path: str):
    import tensorflow as tf

    from bertserve import custom_ops

    custom_ops.load_op_library()
    with tf.device(device_name()):
        return tf.saved_model.load(path)


def op_message(error) -> str:
    """The first line of a tf.errors.OpError's message without TensorFlow's function-node prefix."""
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", error.message.splitlines()[0])


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max(initial=0.0))


@contextlib.contextmanager
def tensor_float_32(enabled: bool):
    """TF32 in TensorFlow's float32 matmuls on or off (process-wide) for the block, then as it was."""
    import tensorflow as tf

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(enabled)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


def tf32_off_for_fp32(precision: str):
    """TF32 off for an fp32 variant (whose 1e-4 target TF32 in the stock head exceeds: test_fp32_with_default_tf32),
    TensorFlow's default for fp16 (whose head runs in float32 as served)."""
    return tensor_float_32(False) if precision == "fp32" else contextlib.nullcontext()


def run_threads(work, count: int) -> None:
    """work(thread index) on count threads started together; re-raises the first failure."""
    barrier, failures = threading.Barrier(count), []

    def body(index: int) -> None:
        try:
            barrier.wait()
            work(index)
        except BaseException as e:  # noqa: BLE001 (handed to the test's thread)
            failures.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]


@functools.cache
def _gpu_library() -> ctypes.CDLL:
    """The GPU kernels library TensorFlow loaded (dlopen of the same path gives the same copy, counters included)."""
    library = ctypes.CDLL(gpu_kernels_path())
    for name in ("bertserve_graphs_captured", "bertserve_graphs_held", "bertserve_most_graphs_held_per_stream",
                 "bertserve_max_graphs_per_stream", "bertserve_device_bytes_in_use", "bertserve_pinned_staging_bytes"):
        getattr(library, name).restype = ctypes.c_int64
    return library


def graphs_captured() -> int:
    """CUDA graphs the encoder kernels have captured in this process."""
    return _gpu_library().bertserve_graphs_captured()


def graphs_held() -> int:
    return _gpu_library().bertserve_graphs_held()


def most_graphs_held_per_stream() -> int:
    return _gpu_library().bertserve_most_graphs_held_per_stream()


def max_graphs_per_stream() -> int:
    """The graph cache's documented bound (graph_cache.h, kMaxGraphsPerStream)."""
    return _gpu_library().bertserve_max_graphs_per_stream()


def device_bytes_in_use() -> int:
    """cudaMemGetInfo's bytes in use on GPU:0: TensorFlow's allocator region and everything outside it (graphs)."""
    return _gpu_library().bertserve_device_bytes_in_use()


def pinned_staging_bytes() -> int:
    """Pinned host memory the kernels' index staging pools hold (host_staging.h): large batches' ids go through it."""
    return _gpu_library().bertserve_pinned_staging_bytes()


def tf_bytes_in_use() -> int:
    """Bytes TensorFlow's allocator has handed out on GPU:0 now."""
    import tensorflow as tf

    return tf.config.experimental.get_memory_info("GPU:0")["current"]

