"""The CUDA core's correctness on a GPU, asserted: bench/gpu/correctness.py's checks (the core's scores and hidden
states against the float32 PyTorch reference over every path it has, that reference against the float64 numpy
reference and Hugging Face's BERT, and the padding ops), the same checks the harness's check stage records.

Skipped where torch sees no CUDA GPU, where the core is not built, or where the carried MiniLM files are missing.
On the GPU machine, from the repository root: `source gpu_rig/env.sh && python3 -m pytest -q tests/gpu`.
The core: $BERTSERVE_CUDA_LIB, else .device_carry/cuda/libbertserve_cuda.so
(`custom_ops/kernels/cuda/build.sh .device_carry/cuda` on the development machine); the MiniLM files:
$BERTSERVE_DEVICE_CARRY, else .device_carry (`bench/gpu/prepare_carry.py`).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from bertserve.bench.gpu import core, correctness  # noqa: E402
from bertserve.bench.gpu.harness import DEVICE_CARRY  # noqa: E402


def carry_dir() -> str:
    return os.environ.get("BERTSERVE_DEVICE_CARRY", DEVICE_CARRY)


def library_path() -> str:
    return os.environ.get("BERTSERVE_CUDA_LIB", os.path.join(carry_dir(), "cuda", "libbertserve_cuda.so"))


def why_skipped() -> str | None:
    """What this machine lacks to run the CUDA core, or None."""
    if not torch.cuda.is_available():
        return "no CUDA GPU for torch: these tests run on the GPU machine"
    if not os.path.isfile(library_path()):
        return (f"no CUDA core at {library_path()}: build it with custom_ops/kernels/cuda/build.sh "
                f"{os.path.join(carry_dir(), 'cuda')}, or name it in BERTSERVE_CUDA_LIB")
    missing = [f for f in correctness.MINILM_CARRY_FILES if not os.path.isfile(os.path.join(carry_dir(), f))]
    if missing:
        return f"no {', '.join(missing)} in {carry_dir()}: run bench/gpu/prepare_carry.py"
    return None


pytestmark = pytest.mark.skipif(why_skipped() is not None, reason=why_skipped() or "")


@pytest.fixture(scope="module")
def checks() -> dict:
    """Every check of correctness.run_checks, by name (one run for the module: it plans and autotunes rankers)."""
    return correctness.run_checks(core.load_library(library_path()), carry_dir())


def test_float32_reference_agrees_with_float64_and_hugging_face(checks):
    references = {"float64, chitchat": checks["torch_fp32_reference_vs_float64_chitchat"],
                  "HF eager, chitchat": checks["torch_fp32_reference_vs_hf_eager_chitchat"],
                  "float64, MiniLM": checks["minilm_real_mixed"]["torch_fp32_reference_vs_float64"]}
    apart = {name: c["max_abs"] for name, c in references.items() if c["max_abs"] > correctness.REFERENCE_TOLERANCE}
    assert not apart, f"the float32 reference disagrees (max abs score difference): {apart}"


def test_fp16_scores_within_tolerance_on_every_path_served(checks):
    """Eager and graph (as served) and the TF op's untuned plans, every model check."""
    worst = {}
    for name in correctness.model_checks(checks):
        entry = checks[name]
        errors = {f"fp16 {s}": entry["fp16"][s]["max_abs"] for s in correctness.SERVED}
        errors["fp16 untuned"] = entry["fp16_untuned"]["scores_vs_torch_fp32"]["max_abs"]
        worst.update({f"{name}: {path}": e for path, e in errors.items() if e > correctness.SCORE_TOLERANCE})
    assert correctness.model_checks(checks), "run_checks made no model check"
    assert not worst, f"fp16 scores over {correctness.SCORE_TOLERANCE} from the float32 reference: {worst}"


def test_served_scores_are_finite(checks):
    not_finite = [f"{name} {precision} {s}" for name in correctness.model_checks(checks)
                  for precision in ("fp16", "fp32") for s in correctness.SERVED
                  if not checks[name][precision][s]["finite"]]
    assert not not_finite, f"NaN or Inf scores: {not_finite}"


def test_padding_ops_are_exact(checks):
    inexact = [f"{dtype} {op}" for dtype, ops in checks["padding_ops"].items() for op, exact in ops.items()
               if not exact]
    assert checks["padding_ops"], "no padding op was checked"
    assert not inexact, f"padding ops not exact: {inexact}"
