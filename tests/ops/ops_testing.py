"""Shared helpers of the op tests: random batches, running the fused stack, comparing with the reference."""

from __future__ import annotations

import numpy as np

from bertserve import custom_ops as ops
from bertserve.export import reference
from bertserve.export.graph import fused_arrays
from bertserve.export.weights import BertConfig, BertWeights

FP32_TOLERANCE = 1e-4  # relative, against the float64 reference (the bar)
FP16_TOLERANCE = 1e-2

# Widths that fill no panel or vector of the GEMM backends exactly (72 columns, 216 for QKV, 600 for the FFN) and
# an FFN output GEMM deeper than the avx512 kernels' 512-row k-slice.
ODD_CONFIG = BertConfig(vocab_size=101, hidden_size=72, num_hidden_layers=2, num_attention_heads=3,
                        intermediate_size=600, max_position_embeddings=24, type_vocab_size=2)

EMBEDDING_NAMES = ("word_embeddings", "position_embeddings", "token_type_embeddings", "embeddings_ln_gamma",
                   "embeddings_ln_beta")


def cpu_has(flag: str) -> bool:
    """Whether /proc/cpuinfo lists this CPU flag (avx512f, avx512_bf16, ...)."""
    with open("/proc/cpuinfo") as f:
        return f" {flag}" in f.read()


def small_config(hidden: int = 64, heads: int = 2, layers: int = 2, max_positions: int = 40) -> BertConfig:
    return BertConfig(vocab_size=97, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=2 * hidden, max_position_embeddings=max_positions, type_vocab_size=3)


def random_batch(rng: np.random.Generator, lengths, seq: int, config: BertConfig) -> tuple[np.ndarray, ...]:
    """ids, mask, segment ids for rows of the given real lengths, padded to seq with random (valid) ids."""
    lengths = np.asarray(lengths)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(0, config.vocab_size, (len(lengths), seq)).astype(np.int32)
    segments = rng.integers(0, config.type_vocab_size, (len(lengths), seq)).astype(np.int32)
    return ids, mask, segments


def op_weights(weights: BertWeights, dtype=np.float32) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """(BertEmbedding weight inputs in order, BertEncoder weight inputs by name) as dtype."""
    arrays = fused_arrays(weights)
    embedding = [arrays[name].astype(dtype) for name in EMBEDDING_NAMES]
    encoder = {name: arrays[name].astype(dtype) for name in ops.ENCODER_WEIGHT_NAMES}
    return embedding, encoder


def run_fused(weights: BertWeights, ids, mask, segments, dtype=np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Embedding -> encoder stack -> first token; returns (packed hidden [N, H], cu_seqlens, first [B, H])."""
    embedding, encoder = op_weights(weights, dtype)
    eps = weights.config.layer_norm_eps
    hidden, cu_seqlens = ops.bert_embedding(ids, segments, mask, *embedding, layer_norm_epsilon=eps)
    hidden = ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=weights.config.num_attention_heads,
                              layer_norm_epsilon=eps)
    first = ops.bert_gather_first_token(hidden, cu_seqlens)
    return hidden.numpy(), cu_seqlens.numpy(), first.numpy()


def assert_close(actual: np.ndarray, expected: np.ndarray, rel: float) -> None:
    """Every element within rel of the reference, relative to the largest reference magnitude (LayerNorm outputs
    are O(1), so near-zero elements are not judged by their own tiny size)."""
    actual = np.asarray(actual, np.float64)
    assert actual.shape == expected.shape, f"shape {actual.shape} differs from the reference's {expected.shape}"
    if expected.size == 0:
        return
    scale = max(float(np.abs(expected).max()), 1e-30)
    worst = float(np.abs(actual - expected).max()) / scale
    assert worst <= rel, f"max error {worst:.3g} of the reference scale exceeds {rel:g}"


def check_against_reference(weights: BertWeights, lengths, seq: int, dtype=np.float32, seed: int = 0) -> None:
    """The packed output of embedding + encoder within the tolerance of dtype of the float64 reference, row by row,
    and the gathered first tokens equal to each row's first packed token."""
    ids, mask, segments = random_batch(np.random.default_rng(seed), lengths, seq, weights.config)
    hidden, cu_seqlens, first = run_fused(weights, ids, mask, segments, dtype)
    expected = reference.encode(weights, ids, mask, segments)
    np.testing.assert_array_equal(cu_seqlens, np.concatenate([[0], np.cumsum(lengths)]))
    tolerance = FP32_TOLERANCE if dtype == np.float32 else FP16_TOLERANCE
    assert hidden.dtype == dtype
    assert hidden.shape == (sum(lengths), weights.config.hidden_size)
    for b, rows in enumerate(expected):
        assert_close(hidden[cu_seqlens[b]:cu_seqlens[b + 1]], rows, tolerance)
        if len(rows):
            np.testing.assert_array_equal(first[b], hidden[cu_seqlens[b]])
