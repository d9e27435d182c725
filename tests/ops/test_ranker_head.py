"""BertRankerHead: the pooler and classifier as one op, against the float64 reference head and the stock-op head
it replaces in the fused SavedModels; bad inputs get InvalidArgument naming the input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from ops_testing import FP32_TOLERANCE, assert_close, small_config

from bertserve import custom_ops as ops
from bertserve.export import reference, stock
from bertserve.export.weights import BertWeights

HIDDEN = 64


def head_weights(num_labels: int, hidden: int = HIDDEN) -> BertWeights:
    """Random weights large enough that tanh saturates for some columns and scores spread over (0, 1)."""
    config = dataclasses.replace(small_config(hidden=hidden, heads=2, layers=1), num_labels=num_labels)
    return BertWeights.random(config, seed=num_labels, scale=2.0 / np.sqrt(hidden))


def first_tokens(batch: int, hidden: int = HIDDEN) -> np.ndarray:
    """LayerNorm-scale states, a row of zeros among them (a row without tokens)."""
    first = np.random.default_rng(batch).standard_normal((batch, hidden)).astype(np.float32)
    first[batch // 2:batch // 2 + 1] = 0.0
    return first


def head_inputs(w: BertWeights, dtype) -> dict[str, np.ndarray]:
    return {name: w[name].astype(dtype) for name in ops.RANKER_HEAD_WEIGHT_NAMES}


def stock_scores(head: dict[str, np.ndarray], first: np.ndarray) -> np.ndarray:
    """The head as fused SavedModels ran it before BertRankerHead: stock ops on fp32 casts (on the CPU, where no
    TF32 rounds the MatMuls, so that on a GPU machine too it is a float32 reference)."""
    with tf.device("/CPU:0"):
        as_fp32 = {name: tf.cast(value, tf.float32) for name, value in head.items()}
        return stock.logits_to_scores(stock.head_logits(as_fp32, tf.cast(first, tf.float32))).numpy()


@pytest.mark.parametrize("hidden", [HIDDEN, 768])
@pytest.mark.parametrize("batch", [0, 1, 7, 33])
@pytest.mark.parametrize("num_labels", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_scores_match_reference_and_stock_head(dtype, num_labels, batch, hidden):
    w = head_weights(num_labels, hidden)
    head = head_inputs(w, dtype)
    first = first_tokens(batch, hidden).astype(dtype)
    scores = ops.bert_ranker_head(first, **head)
    assert scores.dtype == tf.float32 and scores.shape == (batch,)
    # The reference on the op's own (for fp16, rounded) inputs: the op computes in fp32 whatever it stores, so
    # even fp16 models get fp32 accuracy from here on.
    rounded = dataclasses.replace(w, arrays={**w.arrays, **{k: v.astype(np.float64) for k, v in head.items()}})
    expected = reference.head_scores(rounded, first.astype(np.float64))
    assert_close(scores.numpy(), expected, FP32_TOLERANCE)
    assert_close(scores.numpy(), stock_scores(head, first).astype(np.float64), FP32_TOLERANCE)
    if batch > 1:
        assert np.ptp(expected) > 0.05, "the weights should spread the scores, or the test shows little"


def test_shape_function_gives_batch():
    w = head_weights(2)
    head = head_inputs(w, np.float32)
    traced = tf.function(lambda first: ops.bert_ranker_head(first, **head)).get_concrete_function(
        tf.TensorSpec([5, HIDDEN], tf.float32))
    assert traced.structured_outputs.shape.as_list() == [5]


def misshapen_cases() -> list[tuple[str, dict[str, np.ndarray], str]]:
    """(case id, the inputs overridden, a pattern the error must match: it names the input)."""
    f32 = np.float32
    h = HIDDEN
    return [
        ("first_tokens rank 1", {"first_tokens": np.zeros([h], f32)}, "first_tokens"),
        ("first_tokens rank 3", {"first_tokens": np.zeros([2, 1, h], f32)}, "first_tokens"),
        ("pooler_kernel rank 1", {"pooler_kernel": np.zeros([h], f32)}, "pooler_kernel"),
        ("pooler_kernel H mismatch", {"pooler_kernel": np.zeros([h, h + 1], f32)}, "pooler_kernel"),
        ("pooler_bias rank 2", {"pooler_bias": np.zeros([1, h], f32)}, "pooler_bias"),
        ("pooler_bias H mismatch", {"pooler_bias": np.zeros([h - 1], f32)}, "pooler_bias"),
        ("classifier_kernel H mismatch", {"classifier_kernel": np.zeros([h + 1, 1], f32)}, "classifier_kernel"),
        ("classifier_kernel rank 1", {"classifier_kernel": np.zeros([h], f32)}, "classifier_kernel"),
        ("3 labels", {"classifier_kernel": np.zeros([h, 3], f32), "classifier_bias": np.zeros([3], f32)},
         "classifier_kernel has 3 labels"),
        ("classifier_bias labels mismatch", {"classifier_bias": np.zeros([2], f32)}, "classifier_bias"),
    ]


def call_inputs(overrides: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = {"first_tokens": first_tokens(3), **head_inputs(head_weights(1), np.float32)}
    return {**inputs, **overrides}


@pytest.mark.parametrize("overrides,message", [c[1:] for c in misshapen_cases()],
                         ids=[c[0] for c in misshapen_cases()])
def test_misshapen_input_is_invalid_argument_naming_it(overrides, message):
    inputs = call_inputs(overrides)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):  # the kernel's check (eager)
        ops.bert_ranker_head(**inputs)
    specs = {name: tf.TensorSpec(value.shape, tf.float32) for name, value in inputs.items()}
    with pytest.raises(ValueError, match=message):  # the shape function's, when a graph is built
        tf.function(lambda **kw: ops.bert_ranker_head(**kw)).get_concrete_function(**specs)


@pytest.mark.parametrize("half_input", ["pooler_kernel", "classifier_bias"])
def test_fp16_fp32_mix_is_refused_naming_the_input(half_input):
    inputs = call_inputs({})
    inputs[half_input] = inputs[half_input].astype(np.float16)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{half_input} is float16 but first_tokens is float32"):
        ops.bert_ranker_head(**{name: tf.constant(value) for name, value in inputs.items()})


def test_saved_model_with_the_stock_head_still_serves(tmp_path):
    """A fused SavedModel exported before BertRankerHead (its head in stock ops on fp32 casts) loads and scores as
    the new graph does."""
    from ops_testing import op_weights, random_batch

    config = dataclasses.replace(small_config(hidden=HIDDEN, heads=2, layers=2), num_labels=2)
    w = BertWeights.random(config, seed=3)
    embedding, encoder = op_weights(w)
    head = head_inputs(w, np.float32)

    class OldFusedRanker(tf.Module):
        def __init__(self):
            super().__init__()
            self.embedding = [tf.Variable(v) for v in embedding]
            self.encoder = {name: tf.Variable(v) for name, v in encoder.items()}
            self.head = {name: tf.Variable(v) for name, v in head.items()}

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)] * 3)
        def scores(self, ids, mask, segments):
            hidden, cu_seqlens = ops.bert_embedding(ids, segments, mask, *self.embedding)
            first = ops.bert_encoder(hidden, cu_seqlens, **self.encoder, num_heads=config.num_attention_heads,
                                     first_token_only=True)
            return stock.logits_to_scores(stock.head_logits(self.head, first))

    tf.saved_model.save(OldFusedRanker(), str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    ids, mask, segments = random_batch(np.random.default_rng(4), [5, 0, 9, 1], 9, config)
    old = loaded.scores(ids, mask, segments).numpy()
    assert_close(old, reference.scores(w, ids, mask, segments), FP32_TOLERANCE)
    hidden, cu_seqlens = ops.bert_embedding(ids, segments, mask, *embedding)
    first = ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=config.num_attention_heads,
                             first_token_only=True)
    assert_close(ops.bert_ranker_head(first, **head).numpy(), old.astype(np.float64), FP32_TOLERANCE)
