"""The float64 NumPy BERT ranker: the ground truth that op tests and `--validate` compare against.

Written for clarity, not speed: every sequence is computed over its real length only (input_mask), so it
also defines what "padding never changes a real output" means.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from bertserve.export.weights import LAYER_ARRAY_NAMES, BertWeights

_erf = np.vectorize(math.erf, otypes=[np.float64])

# The four GEMMs of a layer whose inputs a GemmHook may change, named by the GEMM that reads the input.
GEMM_SITES = ("qkv", "attention_output", "ffn_in", "ffn_out")
GemmInput = Callable[[str, np.ndarray], np.ndarray]  # (site, GEMM input) -> what the GEMM reads instead


class GemmHook(Protocol):
    """What a reduced-precision scheme (export/fp8.py) changes in the reference: the operands of a layer's four
    GEMMs, at the places the kernels round them. The reference without a hook is the plain float64 model."""

    def weights(self, layer: int, g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The layer's float64 arrays with the GEMM kernels as the kernels read them."""

    def inputs(self, layer: int, site: str, x: np.ndarray) -> np.ndarray:
        """The float64 input of GEMM `site` of `layer` as the kernel reads it."""


def _unchanged(site: str, x: np.ndarray) -> np.ndarray:
    return x


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU in BERT's exact erf form."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def layer_params(w: BertWeights, layer: int) -> dict[str, np.ndarray]:
    """One layer's arrays in float64 (converted once per layer, not once per sequence)."""
    return {name: w[name][layer].astype(np.float64) for name in LAYER_ARRAY_NAMES}


def encoder_layer(x: np.ndarray, w: BertWeights, layer: int) -> np.ndarray:
    """One post-LN BERT layer on the real tokens of one sequence, x: [len, hidden] float64."""
    return _encoder_layer(x, layer_params(w, layer), w.config.num_attention_heads, w.config.layer_norm_eps)


def _encoder_layer(x: np.ndarray, g: dict[str, np.ndarray], heads: int, eps: float,
                   gemm_input: GemmInput = _unchanged) -> np.ndarray:
    n, d = x.shape[0], x.shape[1] // heads

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(n, heads, d).transpose(1, 0, 2)

    a = gemm_input("qkv", x)
    q = split(a @ g["query_kernel"] + g["query_bias"])
    k = split(a @ g["key_kernel"] + g["key_bias"])
    v = split(a @ g["value_kernel"] + g["value_bias"])
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    context = (probs @ v).transpose(1, 0, 2).reshape(n, heads * d)
    attn = gemm_input("attention_output", context) @ g["attention_output_kernel"] + g["attention_output_bias"]
    x = layer_norm(attn + x, g["attention_ln_gamma"], g["attention_ln_beta"], eps)
    inner = gelu(gemm_input("ffn_in", x) @ g["intermediate_kernel"] + g["intermediate_bias"])
    ffn = gemm_input("ffn_out", inner) @ g["output_kernel"] + g["output_bias"]
    return layer_norm(ffn + x, g["output_ln_gamma"], g["output_ln_beta"], eps)


def embed(w: BertWeights, input_ids: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """Embedding + LayerNorm of one sequence's real tokens, ids: [len] -> [len, hidden] float64."""
    n = input_ids.shape[0]
    x = (w["word_embeddings"][input_ids].astype(np.float64)
         + w["position_embeddings"][:n].astype(np.float64)
         + w["token_type_embeddings"][segment_ids].astype(np.float64))
    return layer_norm(x, w["embeddings_ln_gamma"].astype(np.float64), w["embeddings_ln_beta"].astype(np.float64),
                      w.config.layer_norm_eps)


def sequence_lengths(input_mask: np.ndarray) -> np.ndarray:
    """Real length of each row; raises on masks with gaps (a 0 before a 1), which no part of bertserve accepts."""
    mask = np.asarray(input_mask)
    lengths = mask.sum(axis=1)
    expected = np.arange(mask.shape[1])[None, :] < lengths[:, None]
    if not np.array_equal(mask.astype(bool), expected):
        raise ValueError("input_mask must be 1 for a prefix of each row and 0 after it (no gaps)")
    return lengths.astype(np.int64)


def encode(w: BertWeights, input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray,
           hook: GemmHook | None = None) -> list[np.ndarray]:
    """Final hidden states of every row's real tokens: a list of [len_b, hidden] float64 arrays; `hook` changes
    the GEMM operands (None: the float64 model).

    BLAS runs single-threaded here: one sequence's GEMMs are too small to gain from threads, and OpenBLAS'
    spinning workers would starve whatever shares the cores (measured 15x slower on a loaded 2-core machine).
    """
    c = w.config
    with threadpool_limits(limits=1, user_api="blas"):
        layers = [layer_params(w, layer) for layer in range(c.num_hidden_layers)]
        inputs: list[GemmInput] = [_unchanged] * len(layers)
        if hook is not None:
            layers = [hook.weights(layer, g) for layer, g in enumerate(layers)]
            inputs = [functools.partial(hook.inputs, layer) for layer in range(len(layers))]
        out = []
        for b, n in enumerate(sequence_lengths(input_mask)):
            if n == 0:
                out.append(np.zeros((0, c.hidden_size)))
                continue
            x = embed(w, input_ids[b, :n], segment_ids[b, :n])
            for g, gemm_input in zip(layers, inputs):
                x = _encoder_layer(x, g, c.num_attention_heads, c.layer_norm_eps, gemm_input)
            out.append(x)
    return out


def head_scores(w: BertWeights, first_tokens: np.ndarray) -> np.ndarray:
    """Pooler + classifier on [batch, hidden] first-token states -> scores in 0..1 (the `scores` contract)."""
    pooled = np.tanh(first_tokens @ w["pooler_kernel"].astype(np.float64) + w["pooler_bias"])
    logits = pooled @ w["classifier_kernel"].astype(np.float64) + w["classifier_bias"]
    if w.config.num_labels == 1:
        return 1.0 / (1.0 + np.exp(-logits[:, 0]))
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    return probs[:, 1] / probs.sum(axis=1)


def scores(w: BertWeights, input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray,
           hook: GemmHook | None = None) -> np.ndarray:
    """float64 ranker scores [batch]. A row with no real token scores as if its first-token state were zeros."""
    hidden = encode(w, np.asarray(input_ids), np.asarray(input_mask), np.asarray(segment_ids), hook)
    first = np.stack([h[0] if len(h) else np.zeros(w.config.hidden_size) for h in hidden])
    return head_scores(w, first)
