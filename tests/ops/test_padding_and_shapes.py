"""Padding removal / rebuild / first-token gather, and the registered shape functions."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ops_testing import op_weights, small_config

from bertserve import custom_ops as ops
from bertserve.export.weights import BertWeights


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_remove_then_rebuild_padding(dtype):
    rng = np.random.default_rng(0)
    lengths = np.array([3, 0, 5, 1])
    mask = (np.arange(5)[None, :] < lengths[:, None]).astype(np.int32)
    padded = rng.standard_normal((4, 5, 6)).astype(dtype)
    packed, cu_seqlens = ops.bert_remove_padding(padded, mask)
    np.testing.assert_array_equal(cu_seqlens, [0, 3, 3, 8, 9])
    np.testing.assert_array_equal(packed, padded[mask == 1])
    rebuilt = ops.bert_rebuild_padding(packed, mask).numpy()
    np.testing.assert_array_equal(rebuilt, np.where(mask[..., None] == 1, padded, 0))
    first = ops.bert_gather_first_token(packed, cu_seqlens).numpy()
    np.testing.assert_array_equal(first, np.where(lengths[:, None] > 0, padded[:, 0], 0))


def test_remove_padding_rejects_bad_mask():
    with pytest.raises(tf.errors.InvalidArgumentError, match="input_mask row 0 has a gap"):
        ops.bert_remove_padding(np.zeros((1, 3, 2), np.float32), np.array([[0, 1, 1]], np.int32))


def test_shape_functions_give_every_known_dim():
    config = small_config(hidden=64, heads=2, layers=3)
    embedding, encoder = op_weights(BertWeights.random(config, seed=0))
    shapes = {}

    @tf.function(input_signature=[tf.TensorSpec([4, 16], tf.int32)] * 3)
    def run(ids, mask, segments):
        hidden, cu_seqlens = ops.bert_embedding(ids, segments, mask, *embedding)
        encoded = ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=2)
        first = ops.bert_gather_first_token(encoded, cu_seqlens)
        first_only = ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=2, first_token_only=True)
        packed, cu2 = ops.bert_remove_padding(tf.zeros([4, 16, 8]), mask)
        rebuilt = ops.bert_rebuild_padding(packed, mask)
        shapes.update(hidden=hidden.shape, cu_seqlens=cu_seqlens.shape, encoded=encoded.shape, first=first.shape,
                      first_only=first_only.shape, packed=packed.shape, cu2=cu2.shape, rebuilt=rebuilt.shape)
        return first

    run.get_concrete_function()
    assert shapes == {"hidden": [None, 64], "cu_seqlens": [5], "encoded": [None, 64], "first": [4, 64],
                      "first_only": [4, 64], "packed": [None, 8], "cu2": [5], "rebuilt": [4, 16, 8]}


def test_first_token_only_shape_follows_cu_seqlens():
    _, encoder = op_weights(BertWeights.random(small_config(hidden=64, heads=2), seed=0))
    shapes = []

    for cu_seqlens_length in (7, None):
        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32),
                                      tf.TensorSpec([cu_seqlens_length], tf.int32)])
        def run(hidden, cu_seqlens):
            first = ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=2, first_token_only=True)
            shapes.append(first.shape)
            return first

        run.get_concrete_function()
    assert shapes == [[6, 64], [None, 64]]


def test_shape_function_rejects_mismatch_at_trace_time():
    config = small_config(hidden=64, heads=2, layers=3)
    _, encoder = op_weights(BertWeights.random(config, seed=0))
    encoder["intermediate_bias"] = encoder["intermediate_bias"][:, :100]

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([None], tf.int32)])
    def run(hidden, cu_seqlens):
        return ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=2)

    with pytest.raises(ValueError, match="intermediate_bias misshapen"):
        run.get_concrete_function()
