"""BertEncoder with first_token_only: each row's first token [B, H], its last layer past the QKV GEMM run on the
first tokens alone; the same as BertGatherFirstToken of the full output, zeros for rows without tokens."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ops_testing import FP16_TOLERANCE, FP32_TOLERANCE, assert_close, op_weights, random_batch, small_config

from bertserve import custom_ops as ops
from bertserve.export import reference
from bertserve.export.weights import BertWeights

# Both paths compute in float; a half output may differ by the rounding of its last bit.
PATH_TOLERANCE = {np.float32: 1e-5, np.float16: 2.0 ** -10}

LENGTHS = {
    "mixed": [0, 5, 1, 16, 0, 3, 1, 9],
    "more_rows_than_tokens": [0, 1, 0, 0, 2, 0, 0, 1, 0, 0],
}


def encode_both_ways(weights: BertWeights, lengths, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first_token_only output, gather of the full output, cu_seqlens) of one random batch."""
    embedding, encoder = op_weights(weights, dtype)
    ids, mask, segments = random_batch(np.random.default_rng(len(lengths)), lengths, 16, weights.config)
    hidden, cu_seqlens = ops.bert_embedding(ids, segments, mask, *embedding)
    before = hidden.numpy()
    kwargs = dict(encoder, num_heads=weights.config.num_attention_heads)
    first = ops.bert_encoder(hidden, cu_seqlens, **kwargs, first_token_only=True).numpy()
    np.testing.assert_array_equal(hidden.numpy(), before)  # the input, held here, is never scratch
    gathered = ops.bert_gather_first_token(ops.bert_encoder(hidden, cu_seqlens, **kwargs), cu_seqlens).numpy()
    return first, gathered, cu_seqlens.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("lengths", LENGTHS.values(), ids=LENGTHS.keys())
@pytest.mark.parametrize("hidden,heads", [(64, 2), (128, 4)])
def test_equals_gather_of_full_output(hidden, heads, lengths, dtype):
    weights = BertWeights.random(small_config(hidden, heads), seed=hidden + heads)
    first, gathered, cu_seqlens = encode_both_ways(weights, lengths, dtype)
    assert first.dtype == dtype and first.shape == (len(lengths), hidden)
    empty = np.diff(cu_seqlens) == 0
    np.testing.assert_array_equal(first[empty], 0)
    assert_close(first, gathered.astype(np.float64), PATH_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matches_reference_first_tokens(dtype):
    weights = BertWeights.random(small_config(hidden=64, heads=2, layers=3), seed=21)
    lengths = LENGTHS["mixed"]
    embedding, encoder = op_weights(weights, dtype)
    ids, mask, segments = random_batch(np.random.default_rng(22), lengths, 16, weights.config)
    hidden, cu_seqlens = ops.bert_embedding(ids, segments, mask, *embedding)
    first = ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=2, first_token_only=True).numpy()
    expected = np.stack([rows[0] if len(rows) else np.zeros(64) for rows in
                         reference.encode(weights, ids, mask, segments)])
    assert_close(first, expected, FP32_TOLERANCE if dtype == np.float32 else FP16_TOLERANCE)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("batch", [3, 0])
def test_no_tokens_gives_zero_rows(batch, dtype):
    _, encoder = op_weights(BertWeights.random(small_config(), seed=23), dtype)
    hidden = np.zeros((0, 64), dtype)
    first = ops.bert_encoder(hidden, np.zeros(batch + 1, np.int32), **encoder, num_heads=2, first_token_only=True)
    assert first.dtype == dtype
    np.testing.assert_array_equal(first.numpy(), np.zeros((batch, 64)))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_empty_stack_gives_the_input_first_tokens(dtype):
    _, encoder = op_weights(BertWeights.random(small_config(), seed=24), dtype)
    no_layers = {name: value[:0] for name, value in encoder.items()}
    hidden = np.random.default_rng(25).standard_normal((5, 64)).astype(dtype)
    cu_seqlens = np.array([0, 2, 2, 5], np.int32)
    first = ops.bert_encoder(hidden, cu_seqlens, **no_layers, num_heads=2, first_token_only=True).numpy()
    np.testing.assert_array_equal(first, ops.bert_gather_first_token(hidden, cu_seqlens).numpy())


def test_graph_written_before_the_attr_keeps_every_token():
    """A BertEncoder NodeDef without first_token_only (as in SavedModels exported before it existed) still
    loads and returns every token [N, H]: the attr's default."""
    _, encoder = op_weights(BertWeights.random(small_config(), seed=26))

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([None], tf.int32)])
    def run(hidden, cu_seqlens):
        return ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=2)

    graph_def = run.get_concrete_function().graph.as_graph_def()
    (node,) = [n for n in graph_def.node if n.op == "BertEncoder"]
    del node.attr["first_token_only"]
    hidden = np.random.default_rng(27).standard_normal((5, 64)).astype(np.float32)
    cu_seqlens = np.array([0, 2, 2, 5], np.int32)
    imported = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(
        graph_def, input_map={"hidden:0": tf.constant(hidden), "cu_seqlens:0": tf.constant(cu_seqlens)},
        return_elements=[node.name + ":0"]), [])
    (output,) = imported()
    np.testing.assert_array_equal(output.numpy(), run(hidden, cu_seqlens).numpy())
