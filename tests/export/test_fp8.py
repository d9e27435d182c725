"""The FP8 E4M3 simulation (export/fp8.py): rounding, weight and activation scales, and the two forwards."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from export_testing import TINY_CONFIG, padded_inputs

from bertserve.export import fp8, reference

SEQ = 20
INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")
# Measured on the tiny model below (fp8 static 0.033, dynamic 0.011, fp16 operands 1.6e-4), with margin: the
# fp8 rounding moves its scores by a few hundredths, not by a fraction of their 0..1 range.
FP8_SCORE_BOUND = 0.06
FP16_SCORE_BOUND = 1e-3


def as_batch(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    return tuple(inputs[name] for name in INPUT_NAMES)


@pytest.fixture(scope="module")
def calibration() -> list[tuple[np.ndarray, ...]]:
    return [as_batch(padded_inputs([7, 9, 16, 3], SEQ, TINY_CONFIG, seed=seed)) for seed in (3, 4)]


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    return padded_inputs([5, 16, 1, 0, 12, 16, 3], SEQ, TINY_CONFIG)


def test_known_e4m3_values_round_to_nearest_even_and_saturate():
    x = np.array([448.0, 449.0, 1e6, -1e6, 240.0, 232.0, 1.0625, 1.1875, 2.0 ** -6, 2.0 ** -9, 2.0 ** -10,
                  3 * 2.0 ** -10, 2.0 ** -11, -(2.0 ** -9)])
    expected = np.array([448.0, 448.0, 448.0, -448.0, 240.0, 224.0, 1.0, 1.25, 2.0 ** -6, 2.0 ** -9, 0.0,
                         2.0 ** -8, 0.0, -(2.0 ** -9)])
    np.testing.assert_array_equal(fp8.round_e4m3(x), expected)
    assert float(ml_dtypes.finfo(fp8.E4M3).max) == fp8.E4M3_MAX


def test_rounding_is_ml_dtypes_round_trip():
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(fp8.E4M3).astype(np.float64)
    finite = np.isfinite(values)
    np.testing.assert_array_equal(fp8.to_e4m3(values[finite]).view(np.uint8), codes[finite])
    x = np.random.default_rng(0).standard_normal(10_000) * np.exp(np.random.default_rng(1).uniform(-10, 6, 10_000))
    np.testing.assert_array_equal(fp8.round_e4m3(x), np.clip(x, -448, 448).astype(fp8.E4M3).astype(np.float64))
    assert fp8.round_e4m3(x.astype(np.float32)).dtype == np.float32


def test_weight_scales_are_per_output_channel_and_reconstruct_within_half_a_step(tiny_weights):
    q = fp8.quantize_weights(tiny_weights)
    for name in fp8.GEMM_KERNELS:
        kernel = tiny_weights[name].astype(np.float64)
        scale = q.scales[name]
        assert scale.dtype == np.float32 and scale.shape == (kernel.shape[0], kernel.shape[2])
        np.testing.assert_array_equal(scale, (np.abs(kernel).max(axis=1) / 448).astype(np.float32))
        assert q.uint8_codes(name).dtype == np.uint8 and q.uint8_codes(name).shape == kernel.shape
        # Each column's largest weight maps onto 448; every weight is within half an E4M3 step: 2^-4 relative
        # for normal codes, 2^-10 x scale for subnormal ones.
        assert np.all(np.abs(q.codes[name].astype(np.float64)).max(axis=1) == 448)
        error = np.abs(q.dequantized(name) - kernel)
        assert np.all(error <= np.maximum(2.0 ** -4 * np.abs(kernel), 2.0 ** -10 * scale[:, None, :]))


def test_static_scale_is_the_observed_amax_over_448(tiny_weights, calibration):
    scales = fp8.calibrate(tiny_weights, calibration)
    assert scales.dtype == np.float32 and scales.shape == (TINY_CONFIG.num_hidden_layers, 4)
    # Layer 0's QKV GEMM reads the embedding LayerNorm's output.
    embedded = [reference.embed(tiny_weights, ids[b, :n], segments[b, :n]).astype(np.float32)
                for ids, mask, segments in calibration for b, n in enumerate(mask.sum(axis=1)) if n]
    amax = max(float(np.abs(e).max()) for e in embedded)
    assert scales[0, 0] == np.float32(amax) / np.float32(448)
    per_batch = [fp8.calibrate(tiny_weights, [batch]) for batch in calibration]
    np.testing.assert_array_equal(scales, np.maximum(*per_batch))
    np.testing.assert_array_equal(fp8.calibrate(tiny_weights, calibration, percentile=0), np.minimum(*per_batch))
    # The float64 reference sees the same inputs, except that it runs the last layer past QKV on every token.
    from_reference = fp8.calibrate(tiny_weights, calibration, forward=reference.scores)
    np.testing.assert_allclose(scales[:-1], from_reference[:-1], rtol=1e-5)
    np.testing.assert_allclose(scales[-1, 0], from_reference[-1, 0], rtol=1e-5)
    assert np.all(scales[-1, 1:] <= from_reference[-1, 1:] * (1 + 1e-5))


def test_activations_beyond_the_static_range_saturate():
    np.testing.assert_array_equal(fp8.fake_quantize(np.array([1000.0, -3.0]), np.float32(1.0)), [448.0, -3.0])


def test_disabled_quantization_is_the_float64_reference(tiny_weights, inputs):
    np.testing.assert_array_equal(fp8.reference_scores(tiny_weights, fp8.FP32, **inputs),
                                  reference.scores(tiny_weights, **inputs))


@pytest.mark.parametrize("activations", ["static", fp8.DYNAMIC])
def test_fp8_scores_stay_near_fp32_and_both_forwards_agree(tiny_weights, inputs, calibration, activations):
    static = fp8.calibrate(tiny_weights, calibration) if activations == "static" else activations
    scheme = fp8.Fp8Scheme(fp8.quantize_weights(tiny_weights), static)
    fp32 = reference.scores(tiny_weights, **inputs)
    simulated = fp8.reference_scores(tiny_weights, scheme, **inputs)
    error = np.abs(simulated - fp32)
    assert 0 < error.max() <= FP8_SCORE_BOUND
    packed = fp8.packed_scores(tiny_weights, *as_batch(inputs), scheme.hook(np.float32))
    np.testing.assert_allclose(packed, simulated, atol=1e-5)


def test_fp16_operands_for_comparison(tiny_weights, inputs):
    fp32 = reference.scores(tiny_weights, **inputs)
    error = np.abs(fp8.reference_scores(tiny_weights, fp8.FP16, **inputs) - fp32)
    assert 0 < error.max() <= FP16_SCORE_BOUND


def test_packed_forward_is_the_reference_in_float32(tiny_weights, inputs):
    np.testing.assert_allclose(fp8.packed_scores(tiny_weights, *as_batch(inputs)),
                               reference.scores(tiny_weights, **inputs), atol=1e-6)


def test_gemm_mask_selects_kinds_and_layers():
    mask = fp8.gemm_mask(3, ("qkv", "ffn_out"), excluded_layers=(-1,))
    np.testing.assert_array_equal(mask, [[1, 0, 0, 1], [1, 0, 0, 1], [0, 0, 0, 0]])
    assert fp8.gemm_mask(2).all() and not fp8.gemm_mask(2, ()).any()


def test_gemms_left_out_of_fp8_read_fp32_or_fp16_operands(tiny_weights, calibration):
    g = reference.layer_params(tiny_weights, 0)
    x = np.random.default_rng(0).standard_normal((5, TINY_CONFIG.hidden_size))
    for rest, rounded in (("fp32", lambda a: a), ("fp16", lambda a: a.astype(np.float16).astype(a.dtype))):
        hook = fp8.Fp8Scheme(fp8.quantize_weights(tiny_weights), fp8.calibrate(tiny_weights, calibration),
                             fp8.gemm_mask(TINY_CONFIG.num_hidden_layers, ("qkv",), excluded_layers=(1,)),
                             rest).hook()
        for layer in range(TINY_CONFIG.num_hidden_layers):
            kernels = hook.weights(layer, g)
            for site, names in fp8.SITE_KERNELS.items():
                in_fp8 = layer == 0 and site == "qkv"
                for name in names:
                    assert np.array_equal(kernels[name], rounded(g[name])) != in_fp8
                if site != "ffn_out":
                    assert np.array_equal(hook.inputs(layer, site, x), rounded(x)) != in_fp8


def test_fp8_on_no_gemm_is_fp32_and_on_every_gemm_is_the_full_scheme(tiny_weights, inputs, calibration):
    quantized, static = fp8.quantize_weights(tiny_weights), fp8.calibrate(tiny_weights, calibration)
    none = fp8.Fp8Scheme(quantized, static, fp8.gemm_mask(TINY_CONFIG.num_hidden_layers, ()))
    np.testing.assert_array_equal(fp8.reference_scores(tiny_weights, none, **inputs),
                                  reference.scores(tiny_weights, **inputs))
    every = fp8.Fp8Scheme(quantized, static, np.ones(4, dtype=bool))
    np.testing.assert_array_equal(fp8.reference_scores(tiny_weights, every, **inputs),
                                  fp8.reference_scores(tiny_weights, fp8.Fp8Scheme(quantized, static), **inputs))


def test_channel_amax_is_per_input_channel_and_per_batch(tiny_weights, calibration):
    channels = fp8.channel_amax(tiny_weights, calibration)
    layers, hidden = TINY_CONFIG.num_hidden_layers, TINY_CONFIG.hidden_size
    assert {site: a.shape for site, a in channels.items()} == {
        "qkv": (2, layers, hidden), "attention_output": (2, layers, hidden), "ffn_in": (2, layers, hidden),
        "ffn_out": (2, layers, TINY_CONFIG.intermediate_size)}
    ids, mask, segments = calibration[0]
    embedded = np.concatenate([reference.embed(tiny_weights, ids[b, :n], segments[b, :n]).astype(np.float32)
                               for b, n in enumerate(mask.sum(axis=1)) if n])
    np.testing.assert_array_equal(channels["qkv"][0, 0], np.abs(embedded).max(axis=0))
    np.testing.assert_array_equal(fp8.static_scales(fp8.tensor_amax(channels)),
                                  fp8.calibrate(tiny_weights, calibration))


def test_smoothing_balances_operand_ranges(tiny_weights, calibration):
    channels = fp8.channel_amax(tiny_weights, calibration)
    smoothing = fp8.smoothing_factors(tiny_weights, channels, alpha=0.5)
    for site, names in fp8.SITE_KERNELS.items():
        x = channels[site].max(axis=0) / smoothing[site]
        w = np.max([np.abs(tiny_weights[name].astype(np.float64)).max(axis=2) for name in names], axis=0)
        # alpha 0.5: the smoothed activation and weight rows have the same amax, sqrt(amax X_j x amax W_j).
        np.testing.assert_allclose(x, w * smoothing[site], rtol=1e-6)
    quantized = fp8.quantize_weights(tiny_weights, smoothing)
    smoothed = tiny_weights["intermediate_kernel"] * smoothing["ffn_in"][:, :, None]
    assert np.all(np.abs(quantized.dequantized("intermediate_kernel") - smoothed) <= 2.0 ** -4 * np.abs(smoothed)
                  + 2.0 ** -10 * quantized.scales["intermediate_kernel"][:, None, :])
    # Static scales of a smoothed scheme: the amax of x / s, per tensor.
    np.testing.assert_array_equal(fp8.tensor_amax(channels, smoothing)[..., 2],
                                  (channels["ffn_in"] / smoothing["ffn_in"]).max(axis=-1))


def test_smoothing_without_rounding_is_the_fp32_model(tiny_weights, inputs):
    # Arbitrary factors over two decades: x / s times the kernel's rows times s is the same product.
    rng = np.random.default_rng(5)
    smoothing = {site: np.exp(rng.uniform(-2.3, 2.3, a.shape[1:])).astype(np.float32)
                 for site, a in fp8.channel_amax(tiny_weights, [as_batch(inputs)]).items()}
    smoothed = fp8.Fp8Scheme(None, None, smoothing=smoothing)
    np.testing.assert_allclose(fp8.reference_scores(tiny_weights, smoothed, **inputs),
                               reference.scores(tiny_weights, **inputs), rtol=0, atol=1e-9)


def test_scheme_rejects_inconsistent_parts(tiny_weights, calibration):
    channels = fp8.channel_amax(tiny_weights, calibration)
    smoothing = fp8.smoothing_factors(tiny_weights, channels, alpha=0.5)
    with pytest.raises(ValueError, match="smoothing"):
        fp8.Fp8Scheme(fp8.quantize_weights(tiny_weights, smoothing), fp8.DYNAMIC)
    with pytest.raises(ValueError, match="rest"):
        fp8.Fp8Scheme(None, None, rest="bf16")
    with pytest.raises(ValueError, match="activation"):
        fp8.Fp8Scheme(None, "per-token")


def test_fp8_flop_share_counts_the_last_layer_on_first_tokens():
    config, tokens = TINY_CONFIG, 10.0
    assert fp8.fp8_flop_share(fp8.gemm_mask(2), config, tokens) == 1.0
    assert fp8.fp8_flop_share(fp8.gemm_mask(2, ()), config, tokens) == 0.0
    # intermediate = 2 x hidden in the tiny config: per token 3, 1, 2 and 2 hidden^2; the last layer's
    # attention output and FFN run on 1 token (1 + 2 + 2).
    total = 8 * tokens + 3 * tokens + 5
    assert fp8.fp8_flop_share(fp8.gemm_mask(2, excluded_layers=(0,)), config, tokens) == pytest.approx(
        (3 * tokens + 5) / total)
    assert fp8.fp8_flop_share(np.array([True, False, False, False]), config, tokens) == pytest.approx(
        6 * tokens / total)
