"""Every fused variant (MiniLM and chit-chat, fp32 and fp16) served through tf.saved_model.load on the test device:
its scores against the float64 reference and the CPU op's scores carried from the CPU machine, at every real length
0..32 alone and at batches 1, 2, 7, 32, 33, 512 and 8192 drawn from the carried pool."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_gpu_testing import (TOLERANCE, VARIANTS, batch_sizes, carried, gpu_only, graphs_captured, load_saved_model,
                            max_abs, needs_device, on_gpu, tensor_float_32, tf32_off_for_fp32)

from bertserve.model_dir import OUTPUT_NAME, SIGNATURE_NAME

pytestmark = needs_device

# What TF32 in the head's two stock MatMuls may cost a score (TF runs float32 MatMuls in TF32 on Ampere and later by
# default: a 10-bit mantissa, relative rounding 2^-11 on each operand of the 768- and 384-long dot products).
TF32_TOLERANCE = 1e-3


def check_batch(served, pool, rows: np.ndarray, label: str) -> tuple[float, float]:
    """Scores of the pool rows as one batch -> (max abs error vs float64, vs the CPU op), printed."""
    scores = served.scores(carried.take(pool, rows))
    assert scores.shape == (len(rows),) and np.isfinite(scores).all(), f"{label}: scores {scores.shape}, not finite"
    error, cpu = max_abs(scores, served.reference[rows]), max_abs(scores, served.cpu_op[rows])
    print(f"{served.model} {served.precision} {label}: max abs vs float64 {error:.3e}, vs CPU op {cpu:.3e}")
    return error, cpu


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("batch", batch_sizes())
def test_batch_matches_float64_and_cpu_op(tf_served, tf_pool, variant, batch):
    """fp32 with TF32 off (test_fp32_with_default_tf32 says why), fp16 as served."""
    served = tf_served(*variant)
    rows = carried.batch_rows(len(tf_pool["input_ids"]), batch)
    with tf32_off_for_fp32(served.precision):
        error, cpu = check_batch(served, tf_pool, rows, f"batch {batch}")
    assert error <= TOLERANCE[served.precision] and cpu <= TOLERANCE[served.precision]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_length_alone(tf_served, tf_pool, variant):
    """Pool rows 0..32 hold every real length 0..32; each runs as a batch of one."""
    served = tf_served(*variant)
    worst = (0.0, 0.0)
    with tf32_off_for_fp32(served.precision):
        for length in range(carried.SEQ + 1):
            assert tf_pool["input_mask"][length].sum() == length
            result = check_batch(served, tf_pool, np.array([length]), f"length {length}")
            worst = tuple(max(a, b) for a, b in zip(worst, result))
    print(f"{served.model} {served.precision} lengths 0..32 alone: worst vs float64 {worst[0]:.3e}, "
          f"vs CPU op {worst[1]:.3e}")
    assert worst[0] <= TOLERANCE[served.precision] and worst[1] <= TOLERANCE[served.precision]


@gpu_only
@pytest.mark.parametrize("variant", VARIANTS)
def test_served_encoder_is_the_gpu_kernel(tf_served, tf_pool, variant):
    """A model loaded anew has new weight buffers, so the GPU encoder's first call captures a graph for them: the
    count going up shows that the GPU kernel served the call (no CPU kernel took it)."""
    served = tf_served(*variant)
    before = graphs_captured()
    scores = load_saved_model(served.path).signatures[SIGNATURE_NAME](
        **{name: tf.constant(value) for name, value in carried.take(tf_pool, np.arange(7)).items()})[OUTPUT_NAME]
    captured = graphs_captured() - before
    print(f"{served.model} {served.precision}: a fresh load's first call captured {captured} graph(s)")
    assert captured >= 1 and np.isfinite(scores.numpy()).all()


@pytest.mark.parametrize("model", carried.MODELS)
def test_fp32_with_default_tf32(tf_served, tf_pool, model):
    """fp32 as TensorFlow serves it by default. The encoder's float GEMMs are strict fp32 (cuBLASLt
    CUBLAS_COMPUTE_32F), but the pooler and classifier are stock MatMuls, which TensorFlow runs in TF32 on this GPU:
    their rounding alone can exceed 1e-4. So the check is: within 1e-4 with TF32 off (the encoder's own error), and
    within TF32_TOLERANCE with TF's default; the difference between the two is the head's TF32 rounding."""
    import tensorflow as tf

    served = tf_served(model, "fp32")
    rows = carried.batch_rows(len(tf_pool["input_ids"]), 512 if on_gpu() else 64)
    default = tf.config.experimental.tensor_float_32_execution_enabled()
    default_error, _ = check_batch(served, tf_pool, rows, f"TF32 default ({'on' if default else 'off'})")
    with tensor_float_32(False):
        strict_error, strict_cpu = check_batch(served, tf_pool, rows, "TF32 off")
    print(f"{model} fp32: default TF32 setting {default}; max abs vs float64 {default_error:.3e} with it, "
          f"{strict_error:.3e} with TF32 off")
    assert strict_error <= TOLERANCE["fp32"] and strict_cpu <= TOLERANCE["fp32"]
    assert default_error <= (TF32_TOLERANCE if default else TOLERANCE["fp32"])
