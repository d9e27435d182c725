"""The FP8 E4M3 scheme of the encoder's four GEMMs per layer, simulated exactly in NumPy, so that the export and the
Hopper kernels implement a scheme whose ranking accuracy is already measured (bench/fp8_accuracy.py).

The scheme:
- GEMMs in FP8: QKV, attention output, FFN in, FFN out. Their operands are E4M3 codes times fp32 scales and they
  accumulate in fp32; the epilogue multiplies by (activation scale x weight scale) before the bias.
- weights: one scale per output channel (column of the [in, out] kernel), amax / 448, 448 being E4M3's largest
  finite value; the codes are the kernel divided by its column's scale, rounded to nearest even.
- activations (the GEMM inputs): one static scale per tensor (layer x GEMM), amax / 448 with the amax taken over
  calibration batches of pairs (optionally a percentile of the batch amaxes), or, as the alternative, one dynamic
  scale per token (row amax / 448, computed at run time). Values beyond 448 x scale saturate to +-448 (the
  kernels convert with satfinite; ml_dtypes alone would turn them into NaN).
- everything else stays as in the fp32 model: embeddings, LayerNorm, attention's two batched GEMMs and softmax,
  bias adds, GELU, residuals, the pooler and the head.
- variants, for measuring what each part costs: FP8 on some GEMMs only (a [layers, 4] mask, `gemm_mask`), the
  others reading fp32 or fp16 operands; SmoothQuant-style smoothing, per input channel j of an FP8 GEMM a factor
  s_j (`smoothing_factors`) that the GEMM's input is divided by and its kernel's row j multiplied by, before
  both are rounded. In the kernels s costs nothing at run time: it joins the per-channel multiply of the epilogue
  that writes the FP8 copy of the input (the LayerNorm that feeds QKV and FFN in, whose gamma and beta of the FP8
  copy absorb it: the fp16/fp32 copy that feeds the residual keeps the unsmoothed ones; the attention kernel's
  context store, or the value kernel's columns and bias; the FFN-in GEMM's GELU epilogue) and the kernel rows at
  export.

Two forwards apply the rounding where the kernels will: `reference_scores` runs the float64 reference model
(export/reference.py) through its GEMM hook, the exact definition; `packed_scores` runs the same model in float32
with all tokens of a batch packed into one matrix per GEMM and the last layer past its QKV GEMM on the first
tokens only (as the fused ops do), fast enough for thousands of queries on a CPU. Scales are float32 numbers, as
the SavedModel will store them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Iterable

import ml_dtypes
import numpy as np
import tensorflow as tf

from bertserve.export import reference
from bertserve.export.reference import GEMM_SITES, GemmHook
from bertserve.export.weights import BertConfig, BertWeights

E4M3 = ml_dtypes.float8_e4m3fn
E4M3_MAX = 448.0
SITE_KERNELS = {"qkv": ("query_kernel", "key_kernel", "value_kernel"),
                "attention_output": ("attention_output_kernel",),
                "ffn_in": ("intermediate_kernel",),
                "ffn_out": ("output_kernel",)}
GEMM_KERNELS = tuple(name for names in SITE_KERNELS.values() for name in names)
DYNAMIC = "dynamic"  # per-token activation scales computed at run time
Inputs = tuple[np.ndarray, np.ndarray, np.ndarray]  # input_ids, input_mask, segment_ids [batch, seq]
Forward = Callable[..., np.ndarray]  # (weights, input_ids, input_mask, segment_ids, hook) -> scores
Smoothing = dict[str, np.ndarray]  # GEMM site -> per-input-channel array, [layers, in] (or [batches, layers, in])


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """E4M3 codes of x: round to nearest even, saturating at +-448 like the kernels' satfinite conversion."""
    return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(E4M3)


def round_e4m3(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest E4M3 value (saturating), in x's dtype."""
    return to_e4m3(x).astype(x.dtype)


def scale_for(amax: np.ndarray) -> np.ndarray:
    """float32 scales amax / 448 that map amax onto E4M3's largest value; 1 where amax is 0 (all codes are 0)."""
    amax = np.asarray(amax, dtype=np.float32)
    return np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1.0)).astype(np.float32)


def quantize(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """x / scale as E4M3 codes (scale broadcasts: per tensor, per row or per column)."""
    return to_e4m3(x / scale.astype(x.dtype))


def fake_quantize(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """What a GEMM reads for x: its E4M3 codes times the scale, in x's dtype (exact in float64)."""
    s = scale.astype(x.dtype)
    return round_e4m3(x / s) * s


@dataclasses.dataclass(frozen=True)
class Fp8Weights:
    """The four GEMM kernels of every layer as E4M3 codes [layers, in, out] and float32 column scales
    [layers, out]; the other arrays of the model stay in its BertWeights. With smoothing, the codes are those of
    the kernels with each input row j multiplied by s_j (see smoothing_factors)."""

    codes: dict[str, np.ndarray]
    scales: dict[str, np.ndarray]
    smoothing: Smoothing | None = None

    def uint8_codes(self, name: str) -> np.ndarray:
        """The codes' bytes: the form a TF SavedModel stores (beside the float32 scales)."""
        return self.codes[name].view(np.uint8)

    def dequantized(self, name: str, dtype: type = np.float64, layer: int | None = None) -> np.ndarray:
        """codes x scales: the kernel the fp8 GEMM computes with (exact in float64), of every layer or one."""
        if layer is None:
            return self.codes[name].astype(dtype) * self.scales[name][:, None, :].astype(dtype)
        return self.codes[name][layer].astype(dtype) * self.scales[name][layer].astype(dtype)


def quantize_weights(w: BertWeights, smoothing: Smoothing | None = None) -> Fp8Weights:
    """Per-output-channel E4M3 quantization of the four GEMM kernels of every layer (smoothed first, if given)."""
    codes, scales = {}, {}
    for site, names in SITE_KERNELS.items():
        for name in names:
            kernel = w[name].astype(np.float64)
            if smoothing is not None:
                kernel = kernel * smoothing[site][:, :, None]
            scales[name] = scale_for(np.abs(kernel).max(axis=1))
            codes[name] = quantize(kernel, scales[name][:, None, :])
    return Fp8Weights(codes, scales, smoothing)


def gemm_mask(layers: int, sites: Iterable[str] = GEMM_SITES, excluded_layers: Iterable[int] = ()) -> np.ndarray:
    """[layers, 4] bool (GEMM_SITES order): the GEMMs of the given kinds in every layer but the excluded ones
    (negative indices count from the last layer)."""
    mask = np.zeros((layers, len(GEMM_SITES)), dtype=bool)
    mask[:, [GEMM_SITES.index(site) for site in sites]] = True
    mask[list(excluded_layers)] = False
    return mask


@dataclasses.dataclass(frozen=True)
class Fp8Scheme:
    """Which GEMMs are FP8 and how their operands are rounded.

    weights: E4M3 kernels (None: the FP8 GEMMs' kernels unrounded); activations: [layers, 4] static scales in
    GEMM_SITES order, DYNAMIC, or None (unrounded); fp8: which GEMMs follow the two, [layers, 4] or [4] (every
    layer) bool, None: all; rest: the operands of the other GEMMs, "fp32" (unrounded) or "fp16" (rounded to fp16,
    what the fp16 kernels' GEMMs read); smoothing: per-input-channel factors s of the FP8 GEMMs (the GEMM reads
    x / s and the kernel's rows times s; must be the weights' own). Fp8Scheme(None, None) is the fp32 model."""

    weights: Fp8Weights | None
    activations: np.ndarray | str | None
    fp8: np.ndarray | None = None
    rest: str = "fp32"
    smoothing: Smoothing | None = None

    def __post_init__(self) -> None:
        if self.rest not in ("fp32", "fp16"):
            raise ValueError(f"rest: expected 'fp32' or 'fp16', got {self.rest!r}")
        if isinstance(self.activations, str) and self.activations != DYNAMIC:
            raise ValueError(f"activation scales: expected an array or {DYNAMIC!r}, got {self.activations!r}")
        if self.weights is not None and self.weights.smoothing is not self.smoothing:
            raise ValueError("the scheme's smoothing must be the one its weights were quantized with")

    def is_fp8(self, layer: int, site: str) -> bool:
        """Whether GEMM `site` of `layer` reads FP8 operands (else `rest`)."""
        if self.fp8 is None:
            return True
        row = self.fp8[layer] if self.fp8.ndim == 2 else self.fp8
        return bool(row[GEMM_SITES.index(site)])

    def hook(self, dtype: type = np.float64) -> GemmHook:
        return _SchemeHook(self, dtype)


FP32 = Fp8Scheme(None, None)
FP16 = Fp8Scheme(None, None, fp8=np.zeros(len(GEMM_SITES), dtype=bool), rest="fp16")


def _fp16(x: np.ndarray) -> np.ndarray:
    """x rounded to float16, in x's dtype: what an fp16 GEMM reads."""
    return x.astype(np.float16).astype(x.dtype)


class _SchemeHook:
    """Applies an Fp8Scheme to the reference (float64) or the packed forward (float32) through their GEMM hook."""

    def __init__(self, scheme: Fp8Scheme, dtype: type) -> None:
        self.scheme, self.dtype = scheme, dtype

    def weights(self, layer: int, g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        scheme, out = self.scheme, dict(g)
        for site, names in SITE_KERNELS.items():
            for name in names:
                if not scheme.is_fp8(layer, site):
                    out[name] = _fp16(g[name]) if scheme.rest == "fp16" else g[name]
                elif scheme.weights is not None:
                    out[name] = scheme.weights.dequantized(name, self.dtype, layer)
                elif scheme.smoothing is not None:
                    out[name] = g[name] * scheme.smoothing[site][layer][:, None].astype(g[name].dtype)
        return out

    def inputs(self, layer: int, site: str, x: np.ndarray) -> np.ndarray:
        scheme = self.scheme
        if not scheme.is_fp8(layer, site):
            return _fp16(x) if scheme.rest == "fp16" else x
        if scheme.smoothing is not None:
            x = x / scheme.smoothing[site][layer].astype(x.dtype)
        if scheme.activations is None:
            return x
        if isinstance(scheme.activations, str):
            return fake_quantize(x, scale_for(np.abs(x).max(axis=-1, keepdims=True)))
        return fake_quantize(x, scheme.activations[layer, GEMM_SITES.index(site)])


def reference_scores(w: BertWeights, scheme: Fp8Scheme, input_ids: np.ndarray,
                     input_mask: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """float64 scores of the reference model with the scheme's rounding: the exact simulation."""
    return reference.scores(w, input_ids, input_mask, segment_ids, scheme.hook(np.float64))


def _gelu32(x: np.ndarray) -> np.ndarray:
    """GELU in erf form for float32 arrays: TensorFlow's erf, since np.vectorize(math.erf) is far too slow here."""
    return 0.5 * x * (1.0 + tf.math.erf(x * np.float32(1.0 / math.sqrt(2.0))).numpy())


def _packed_layer(x: np.ndarray, g: dict[str, np.ndarray], runs: list[tuple[int, int, int]], heads: int,
                  eps: float, gemm_input: reference.GemmInput, first_only: bool) -> np.ndarray:
    """One layer on packed tokens x [tokens, hidden]; runs: (length, first row, sequences) of equal-length
    sequences, so attention batches over a run without masks. first_only: rows after QKV are the first tokens."""
    hidden = x.shape[1]
    d = hidden // heads
    qkv = gemm_input("qkv", x) @ g["qkv_kernel"] + g["qkv_bias"]
    context = []
    for n, start, count in runs:
        q, k, v = qkv[start:start + n * count].reshape(count, n, 3, heads, d).transpose(2, 0, 3, 1, 4)
        if first_only:
            q = q[:, :, :1]
        scores = q @ k.swapaxes(-1, -2) * np.float32(1.0 / math.sqrt(d))
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        context.append((probs @ v).transpose(0, 2, 1, 3).reshape(-1, hidden))
    if first_only:
        x = x[np.concatenate([start + n * np.arange(count) for n, start, count in runs])]
    attn = gemm_input("attention_output", np.concatenate(context)) @ g["attention_output_kernel"]
    x = reference.layer_norm(attn + g["attention_output_bias"] + x, g["attention_ln_gamma"], g["attention_ln_beta"],
                             eps)
    inner = _gelu32(gemm_input("ffn_in", x) @ g["intermediate_kernel"] + g["intermediate_bias"])
    ffn = gemm_input("ffn_out", inner) @ g["output_kernel"] + g["output_bias"]
    return reference.layer_norm(ffn + x, g["output_ln_gamma"], g["output_ln_beta"], eps)


def packed_scores(w: BertWeights, input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray,
                  hook: GemmHook | None = None) -> np.ndarray:
    """reference.scores' model and hook in float32, batched: rows sorted by length and packed, so each GEMM is one
    large matrix product. The caller sets BLAS threads (the reference pins them to 1)."""
    c = w.config
    lengths = reference.sequence_lengths(input_mask)
    order = [b for b in np.argsort(lengths, kind="stable") if lengths[b] > 0]
    x = np.concatenate([reference.embed(w, input_ids[b, :lengths[b]], segment_ids[b, :lengths[b]])
                        for b in order]).astype(np.float32)
    runs, start = [], 0
    for n in np.unique(lengths[order]):
        count = int(np.sum(lengths[order] == n))
        runs.append((int(n), start, count))
        start += int(n) * count
    hook = hook or FP32.hook(np.float32)
    for layer in range(c.num_hidden_layers):
        g = {name: a.astype(np.float32) for name, a in hook.weights(layer, reference.layer_params(w, layer)).items()}
        g["qkv_kernel"] = np.concatenate([g[name] for name in SITE_KERNELS["qkv"]], axis=1)
        g["qkv_bias"] = np.concatenate([g["query_bias"], g["key_bias"], g["value_bias"]])
        x = _packed_layer(x, g, runs, c.num_attention_heads, c.layer_norm_eps, functools.partial(hook.inputs, layer),
                          first_only=layer == c.num_hidden_layers - 1)
    first = np.zeros((len(lengths), c.hidden_size))
    first[order] = x
    return reference.head_scores(w, first)


class _AmaxRecorder:
    """A hook that changes nothing and records the amax of each GEMM input's channels (columns), per (layer,
    site)."""

    def __init__(self, config: BertConfig) -> None:
        width = {"ffn_out": config.intermediate_size}
        self.amax = {site: np.zeros((config.num_hidden_layers, width.get(site, config.hidden_size)))
                     for site in GEMM_SITES}

    def weights(self, layer: int, g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return g

    def inputs(self, layer: int, site: str, x: np.ndarray) -> np.ndarray:
        np.maximum(self.amax[site][layer], np.abs(x).max(axis=0), out=self.amax[site][layer])
        return x


def channel_amax(w: BertWeights, batches: Iterable[Inputs], forward: Forward = packed_scores) -> Smoothing:
    """Amax of every GEMM input channel per calibration batch, site -> [batches, layers, in], on the unrounded
    model.

    The default forward is the packed one, which sees what the kernels quantize: in the last layer, past QKV,
    the first tokens only."""
    out: dict[str, list[np.ndarray]] = {site: [] for site in GEMM_SITES}
    for input_ids, input_mask, segment_ids in batches:
        recorder = _AmaxRecorder(w.config)
        forward(w, input_ids, input_mask, segment_ids, recorder)
        for site in GEMM_SITES:
            out[site].append(recorder.amax[site])
    if not out["qkv"]:
        raise ValueError("calibration needs at least one batch of pairs")
    return {site: np.stack(a) for site, a in out.items()}


def tensor_amax(channels: Smoothing, smoothing: Smoothing | None = None) -> np.ndarray:
    """Per-tensor amax [batches, layers, 4] (GEMM_SITES order) of what the FP8 GEMMs read: the inputs of
    channel_amax, divided by the smoothing factors if any."""
    return np.stack([(channels[site] if smoothing is None else channels[site] / smoothing[site]).max(axis=-1)
                     for site in GEMM_SITES], axis=-1)


def static_scales(amax: np.ndarray, percentile: float | None = None) -> np.ndarray:
    """Per-tensor activation scales [layers, 4] from tensor_amax: the amax over all batches / 448, or the given
    percentile of the batch amaxes (drops rare outlier batches at the price of saturating them)."""
    top = amax.max(axis=0) if percentile is None else np.percentile(amax, percentile, axis=0)
    return scale_for(top)


def calibrate(w: BertWeights, batches: Iterable[Inputs], percentile: float | None = None,
              forward: Forward = packed_scores) -> np.ndarray:
    """Static activation scales [layers, 4] (GEMM_SITES order) calibrated on batches of pairs."""
    return static_scales(tensor_amax(channel_amax(w, batches, forward)), percentile)


def smoothing_factors(w: BertWeights, channels: Smoothing, alpha: float) -> Smoothing:
    """SmoothQuant's migration of activation range into the weights: s_j = amax(X_j)^alpha / amax(W_j)^(1-alpha)
    per input channel j of each GEMM (W_j: row j of the layer's kernels of that GEMM; amax(X_j) over every
    calibration batch of channel_amax), float32 [layers, in] per site; 1 where either amax is 0."""
    out = {}
    for site, names in SITE_KERNELS.items():
        x = channels[site].max(axis=0)
        weight = np.max([np.abs(w[name].astype(np.float64)).max(axis=2) for name in names], axis=0)
        ok = (x > 0) & (weight > 0)
        out[site] = (np.where(ok, x, 1.0) ** alpha / np.where(ok, weight, 1.0) ** (1 - alpha)).astype(np.float32)
    return out


def fp8_flop_share(fp8: np.ndarray, config: BertConfig, mean_tokens: float) -> float:
    """Share of the four encoder GEMMs' FLOPs that the mask fp8 ([layers, 4] or [4]) runs in FP8, at a mean
    sequence length, with the last layer past QKV on first tokens only, as the fused ops run it: what bounds an
    FP8 export's speed-up over fp16 (attention's batched GEMMs, about 1 % at 21 tokens, are left out)."""
    h, inner = config.hidden_size, config.intermediate_size
    tokens = np.full((config.num_hidden_layers, len(GEMM_SITES)), float(mean_tokens))
    tokens[-1, 1:] = 1.0
    flops = tokens * np.array([3 * h * h, h * h, h * inner, inner * h], dtype=np.float64)
    return float((flops * np.broadcast_to(fp8, flops.shape)).sum() / flops.sum())
