"""Bad inputs get InvalidArgument naming the problem (never a crash or an out-of-bounds read)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ops_testing import op_weights, random_batch, small_config

from bertserve import custom_ops as ops
from bertserve.export.weights import BertWeights

CONFIG = small_config(hidden=64, heads=2, layers=2, max_positions=8)


@pytest.fixture(scope="module")
def weights():
    return BertWeights.random(CONFIG, seed=0)


@pytest.fixture(scope="module")
def batch():
    return random_batch(np.random.default_rng(0), [3, 8], 8, CONFIG)


def embed(weights, ids, mask, segments, embedding=None):
    embedding = embedding or op_weights(weights)[0]
    return ops.bert_embedding(ids, segments, mask, *embedding)


def encode(weights, hidden, cu_seqlens, num_heads=CONFIG.num_attention_heads, **overrides):
    encoder = {**op_weights(weights)[1], **overrides}
    return ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=num_heads)


def with_value(array, index, value):
    out = array.copy()
    out[index] = value
    return out


@pytest.mark.parametrize("bad_id,message", [(CONFIG.vocab_size, r"input_ids\[1,2\] = 97 is out of range \[0, 97\)"),
                                            (-1, r"input_ids\[1,2\] = -1 is out of range")])
def test_input_id_out_of_range(weights, batch, bad_id, message):
    ids, mask, segments = batch
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        embed(weights, with_value(ids, (1, 2), bad_id), mask, segments)


@pytest.mark.parametrize("bad_segment", [CONFIG.type_vocab_size, -2])
def test_segment_id_out_of_range(weights, batch, bad_segment):
    ids, mask, segments = batch
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"segment_ids\[0,1\] = .* is out of range \[0, 3\)"):
        embed(weights, ids, mask, with_value(segments, (0, 1), bad_segment))


def test_sequence_longer_than_max_positions(weights):
    ids, mask, segments = random_batch(np.random.default_rng(1), [2], CONFIG.max_position_embeddings + 1, CONFIG)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sequence length 9 exceeds the max positions"):
        embed(weights, ids, mask, segments)


def test_mask_with_gap(weights, batch):
    ids, mask, segments = batch
    with pytest.raises(tf.errors.InvalidArgumentError, match="input_mask row 0 has a gap"):
        embed(weights, ids, with_value(mask, (0, 5), 1), segments)


@pytest.mark.parametrize("value", [2, -1])
def test_mask_value_not_0_or_1(weights, batch, value):
    ids, mask, segments = batch
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"input_mask\[1,4\] = .* must be 0 or 1"):
        embed(weights, ids, with_value(mask, (1, 4), value), segments)


def test_mask_shape_differs_from_ids(weights, batch):
    ids, mask, segments = batch
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="input_mask"):
        embed(weights, ids, mask[:, :4], segments)


def test_hidden_not_divisible_by_heads(weights, batch):
    hidden, cu_seqlens = embed(weights, *batch)
    with pytest.raises(tf.errors.InvalidArgumentError, match="hidden size 64 is not divisible by num_heads 3"):
        encode(weights, hidden, cu_seqlens, num_heads=3)


@pytest.mark.parametrize("name,shape", [("qkv_kernel", (2, 64, 191)), ("attention_output_bias", (2, 63)),
                                        ("output_kernel", (2, 127, 64)), ("intermediate_bias", (1, 128)),
                                        ("output_ln_beta", (2, 64, 1))])
def test_encoder_weight_shape_mismatch(weights, batch, name, shape):
    hidden, cu_seqlens = embed(weights, *batch)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=name):
        encode(weights, hidden, cu_seqlens, **{name: np.zeros(shape, np.float32)})


def test_embedding_weight_shape_mismatch(weights, batch):
    embedding = op_weights(weights)[0]
    embedding[1] = embedding[1][:, :32]
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="position_embeddings"):
        embed(weights, *batch, embedding=embedding)


def test_encoder_cu_seqlens_inconsistent_with_hidden(weights, batch):
    hidden, _ = embed(weights, *batch)
    with pytest.raises(tf.errors.InvalidArgumentError, match="cu_seqlens ends at 10 but the packed input has 11"):
        encode(weights, hidden, np.array([0, 3, 10], np.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="cu_seqlens decreases"):
        encode(weights, hidden, np.array([0, 5, 3, 11], np.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"cu_seqlens\[0\] = 1"):
        ops.bert_gather_first_token(hidden, np.array([1, 11], np.int32))


def test_wrong_dtypes(weights, batch):
    ids, mask, segments = (tf.constant(x) for x in batch)
    embedding = [tf.constant(w) for w in op_weights(weights)[0]]
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected to be a int32 tensor but is a float"):
        ops.bert_embedding(tf.cast(ids, tf.float32), segments, mask, *embedding)
    with pytest.raises(tf.errors.InvalidArgumentError, match="double"):
        ops.bert_embedding(ids, segments, mask, *[tf.cast(w, tf.float64) for w in embedding])
    hidden, cu_seqlens = embed(weights, *batch)
    mixed = {name: tf.constant(value, tf.float16) for name, value in op_weights(weights)[1].items()}
    with pytest.raises(tf.errors.InvalidArgumentError, match="half"):
        ops.bert_encoder(hidden, cu_seqlens, **mixed, num_heads=2)


def test_rebuild_padding_token_count_mismatch():
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="input has 4 packed tokens but input_mask has 3"):
        ops.bert_rebuild_padding(np.zeros((4, 8), np.float32), mask)


def test_errors_in_graph_mode_are_raised_at_run_time(weights, batch):
    ids, mask, segments = batch
    embedding = op_weights(weights)[0]

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)] * 3)
    def run(ids, mask, segments):
        return ops.bert_embedding(ids, segments, mask, *embedding)[0]

    assert run(ids, mask, segments).shape == (11, CONFIG.hidden_size)
    with pytest.raises(tf.errors.InvalidArgumentError, match="input_ids"):
        run(with_value(ids, (0, 0), 10_000), mask, segments)
