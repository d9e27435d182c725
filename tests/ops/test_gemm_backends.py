"""Every GEMM backend the library has (custom_ops/kernels/cpu_gemm.h), forced through BERTSERVE_CPU_GEMM whatever
this machine would pick, against the float64 reference; the variable is read whenever weights are packed, and a
fresh set of weight arrays is packed again."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ops_testing import (FP32_TOLERANCE, ODD_CONFIG, assert_close, check_against_reference, cpu_has, op_weights,
                         random_batch)

from bertserve import custom_ops as ops
from bertserve.export import reference
from bertserve.export.weights import BertWeights

BACKENDS = ("mkl", "avx512")


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    if request.param == "avx512" and not cpu_has("avx512f"):
        pytest.skip("this CPU has no AVX-512F")
    monkeypatch.setenv("BERTSERVE_CPU_GEMM", request.param)
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_odd_widths_and_many_tokens_match_reference(backend, dtype):
    lengths = np.random.default_rng(1).integers(1, 25, 48)
    assert lengths.sum() > 512
    check_against_reference(BertWeights.random(ODD_CONFIG, seed=2), lengths=lengths, seq=24, dtype=dtype)


@pytest.mark.parametrize("lengths", [[1], [7], [3, 0, 9]], ids=["one_token", "seven_tokens", "with_empty_row"])
def test_few_rows_match_reference(backend, lengths):
    """Fewer rows than one register tile of the avx512 kernel (8), the batch-1 case."""
    check_against_reference(BertWeights.random(ODD_CONFIG, seed=3), lengths=lengths, seq=9)


def test_first_token_only_matches_reference(backend):
    weights = BertWeights.random(ODD_CONFIG, seed=4)
    lengths = [5, 0, 17, 1]
    ids, mask, segments = random_batch(np.random.default_rng(5), lengths, 17, weights.config)
    embedding, encoder = op_weights(weights)
    hidden, cu_seqlens = ops.bert_embedding(ids, segments, mask, *embedding)
    first = ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=3, first_token_only=True).numpy()
    expected = np.stack([rows[0] if len(rows) else np.zeros(72) for rows in
                         reference.encode(weights, ids, mask, segments)])
    assert_close(first, expected, FP32_TOLERANCE)


def test_override_is_the_backend_that_packs(backend):
    assert ops.cpu_gemm_backend() == backend


def test_without_override_a_backend_is_chosen(monkeypatch):
    monkeypatch.delenv("BERTSERVE_CPU_GEMM", raising=False)
    assert ops.cpu_gemm_backend() in BACKENDS


def test_unknown_backend_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("BERTSERVE_CPU_GEMM", "cublas")
    _, encoder = op_weights(BertWeights.random(ODD_CONFIG, seed=6))
    hidden = np.ones((3, 72), np.float32)
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"BERTSERVE_CPU_GEMM=cublas names no GEMM backend \(known: avx512, mkl\)"):
        ops.bert_encoder(hidden, np.array([0, 3], np.int32), **encoder, num_heads=3)
