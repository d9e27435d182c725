"""The GEMM backends with bfloat16 operands (custom_ops/kernels/cpu_gemm_bf16.cc), each forced through
BERTSERVE_CPU_GEMM_BF16: products against float64 products of the bf16-rounded operands, the portable path bit
for bit the AVX512_BF16 one, and BertEncoder with gemm_operands="bfloat16" against its float run."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from ops_testing import ODD_CONFIG, cpu_has, op_weights

from bertserve import custom_ops as ops
from bertserve.export.graph import build_ranker_module
from bertserve.export.samples import mixed_length_inputs
from bertserve.export.validate import TOLERANCES
from bertserve.export.weights import CHITCHAT_CONFIG, BertWeights

BF16_BACKENDS = ("avx512_bf16", "bf16_portable")
# k odd (a pair half empty) and beyond one 512-row slice, widths that fill no 48-column panel, 1 to 600 rows.
SHAPES = [(1, 768, 2304), (7, 3072, 768), (9, 1025, 97), (600, 33, 50)]


HAS_AVX512_BF16 = cpu_has("avx512_bf16")
needs_avx512_bf16 = pytest.mark.skipif(not HAS_AVX512_BF16, reason="this CPU has no AVX512_BF16")


@pytest.fixture(params=BF16_BACKENDS)
def bf16_backend(request, monkeypatch):
    if request.param == "avx512_bf16" and not HAS_AVX512_BF16:
        pytest.skip("this CPU has no AVX512_BF16")
    monkeypatch.setenv("BERTSERVE_CPU_GEMM_BF16", request.param)
    return request.param


def library() -> ctypes.CDLL:
    ops.load_op_library()  # its TensorFlow dependencies, before ctypes opens it
    return ctypes.CDLL(ops.library_path())


def gemm(a: np.ndarray, b: np.ndarray, bfloat16: bool = True) -> np.ndarray:
    """a @ b through the library's selected backend (bertserve_cpu_gemm), on the calling thread."""
    run = library().bertserve_cpu_gemm
    run.restype = ctypes.c_int
    run.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 3
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    c = np.empty((a.shape[0], b.shape[1]), np.float32)
    assert run(int(bfloat16), a.shape[0], b.shape[1], a.shape[1], a.ctypes.data, b.ctypes.data, c.ctypes.data) == 0
    return c


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even) as float64."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_product_of_rounded_operands_summed_in_float(bf16_backend, shape):
    m, k, n = shape
    rng = np.random.default_rng(k)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    expected = to_bf16(a) @ to_bf16(b)
    # float sums of k exact products: a few float roundings of the largest partial sums
    np.testing.assert_allclose(gemm(a, b), expected, rtol=0, atol=2e-6 * np.abs(expected).max())


def test_operands_round_to_nearest_even(bf16_backend):
    """1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7 (goes to 1, the even one); 1 + 3 * 2^-8 halfway
    between 1 + 2^-7 and 1 + 2^-6 (goes to 1 + 2^-6); 1 + 2^-8 + 2^-16 is past halfway (1 + 2^-7)."""
    a = np.array([[1 + 2**-8], [1 + 3 * 2**-8], [1 + 2**-8 + 2**-16]], np.float32)
    np.testing.assert_array_equal(gemm(a, np.ones((1, 1), np.float32))[:, 0], [1, 1 + 2**-6, 1 + 2**-7])
    np.testing.assert_array_equal(gemm(np.ones((1, 1), np.float32), a.T)[0], [1, 1 + 2**-6, 1 + 2**-7])


@needs_avx512_bf16
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_portable_path_is_the_instruction_bit_for_bit(monkeypatch, shape):
    m, k, n = shape
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    products = {}
    for backend in BF16_BACKENDS:
        monkeypatch.setenv("BERTSERVE_CPU_GEMM_BF16", backend)
        products[backend] = gemm(a, b)
    np.testing.assert_array_equal(products["bf16_portable"], products["avx512_bf16"])


def test_override_is_the_backend_that_packs(bf16_backend):
    assert ops.cpu_gemm_backend("bfloat16") == bf16_backend


def test_without_override_the_instruction_where_the_cpu_has_it(monkeypatch):
    monkeypatch.delenv("BERTSERVE_CPU_GEMM_BF16", raising=False)
    assert ops.cpu_gemm_backend("bfloat16") == ("avx512_bf16" if HAS_AVX512_BF16 else "bf16_portable")


def encoder_call(gemm_operands: str, dtype=np.float32) -> tf.Tensor:
    _, encoder = op_weights(BertWeights.random(ODD_CONFIG, seed=6), dtype)
    hidden = np.linspace(-1, 1, 5 * 72).reshape(5, 72).astype(dtype)
    return ops.bert_encoder(hidden, np.array([0, 2, 5], np.int32), **encoder, num_heads=3,
                            gemm_operands=gemm_operands)


def test_unknown_backend_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("BERTSERVE_CPU_GEMM_BF16", "amx")
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"BERTSERVE_CPU_GEMM_BF16=amx names no GEMM backend \(known: avx512_bf16, "
                             r"bf16_portable\)"):
        encoder_call("bfloat16")


def test_bf16_operands_need_a_float_model():
    with pytest.raises(tf.errors.InvalidArgumentError, match="gemm_operands='bfloat16' needs T=float, got half"):
        encoder_call("bfloat16", np.float16)


def test_encoder_close_to_its_float_run(bf16_backend):
    """LayerNorm outputs (O(1)) after two layers of bf16 operands: within a few bf16 steps (2^-8) of float."""
    bf16, fp32 = encoder_call("bfloat16").numpy(), encoder_call("float").numpy()
    assert 0 < np.abs(bf16 - fp32).max() < 0.05


@pytest.fixture(scope="module")
def chitchat_weights() -> BertWeights:
    return BertWeights.random(CHITCHAT_CONFIG, seed=0)


@pytest.mark.parametrize("model", ["minilm", "chitchat"])
def test_ranker_scores_within_the_bf16_tolerance_of_fp32(bf16_backend, model, request):
    """The exported fused bf16 ranker against the fused fp32 one on 64 mixed-length rows: within the tolerance
    `bertserve export --validate` holds bf16 to (the README gives the measured errors)."""
    weights = request.getfixturevalue(f"{model}_weights")
    inputs = {k: tf.constant(v) for k, v in mixed_length_inputs(weights.config, 64, 32).items()}
    scores = {p: build_ranker_module(weights, "fused", p).serving_default(**inputs)["scores"].numpy()
              for p in ("fp32", "bf16")}
    error = float(np.abs(scores["bf16"] - scores["fp32"]).max())
    assert 0 < error <= TOLERANCES["bf16"]
