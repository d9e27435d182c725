"""The float64 NumPy BERT ranker: the ground truth that op tests and `--validate` compare against.

Written for clarity, not speed: every sequence is computed over its real length only (input_mask), so it
also defines what "padding never changes a real output" means.
"""

from __future__ import annotations

import math

import numpy as np
from threadpoolctl import threadpool_limits

from bertserve.export.weights import LAYER_ARRAY_NAMES, BertWeights

_erf = np.vectorize(math.erf, otypes=[np.float64])


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


def _encoder_layer(x: np.ndarray, g: dict[str, np.ndarray], heads: int, eps: float) -> np.ndarray:
    n, d = x.shape[0], x.shape[1] // heads

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(n, heads, d).transpose(1, 0, 2)

    q = split(x @ g["query_kernel"] + g["query_bias"])
    k = split(x @ g["key_kernel"] + g["key_bias"])
    v = split(x @ g["value_kernel"] + g["value_bias"])
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    context = (probs @ v).transpose(1, 0, 2).reshape(n, heads * d)
    attn = context @ g["attention_output_kernel"] + g["attention_output_bias"]
    x = layer_norm(attn + x, g["attention_ln_gamma"], g["attention_ln_beta"], eps)
    ffn = gelu(x @ g["intermediate_kernel"] + g["intermediate_bias"]) @ g["output_kernel"] + g["output_bias"]
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


def encode(w: BertWeights, input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray) -> list[np.ndarray]:
    """Final hidden states of every row's real tokens: a list of [len_b, hidden] float64 arrays.

    BLAS runs single-threaded here: one sequence's GEMMs are too small to gain from threads, and OpenBLAS'
    spinning workers would starve whatever shares the cores (measured 15x slower on a loaded 2-core machine).
    """
    c = w.config
    with threadpool_limits(limits=1, user_api="blas"):
        layers = [layer_params(w, layer) for layer in range(c.num_hidden_layers)]
        out = []
        for b, n in enumerate(sequence_lengths(input_mask)):
            if n == 0:
                out.append(np.zeros((0, c.hidden_size)))
                continue
            x = embed(w, input_ids[b, :n], segment_ids[b, :n])
            for g in layers:
                x = _encoder_layer(x, g, c.num_attention_heads, c.layer_norm_eps)
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


def scores(w: BertWeights, input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """float64 ranker scores [batch]. A row with no real token scores as if its first-token state were zeros."""
    hidden = encode(w, np.asarray(input_ids), np.asarray(input_mask), np.asarray(segment_ids))
    first = np.stack([h[0] if len(h) else np.zeros(w.config.hidden_size) for h in hidden])
    return head_scores(w, first)
