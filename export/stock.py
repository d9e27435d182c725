"""The BERT ranker in standard TensorFlow ops only: what an unmodified tensorflow_model_server can load.

Used three ways: the `stock` SavedModel variant, the graph the FP16 conversion pass rewrites (fp16.py), and the
forward pass of fine-tuning (training.py), so serving computes exactly what was trained.

Padding is handled by masking, not removal: padded positions are computed, but their keys get a -10000
attention bias (exp underflows to exactly 0 in fp32 and fp16) and their token/segment ids are zeroed before the
lookups, so no padded value can change a real output. GELU uses erf (not Erfc) so tf2onnx can convert it.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import tensorflow as tf

from bertserve.export.weights import BertConfig

MASKED_ATTENTION_BIAS = -10000.0

Dropout = Callable[[tf.Tensor], tf.Tensor]


def _no_dropout(x: tf.Tensor) -> tf.Tensor:
    return x


def gelu(x: tf.Tensor) -> tf.Tensor:
    """GELU in BERT's exact erf form."""
    return 0.5 * x * (1.0 + tf.math.erf(x * (1.0 / math.sqrt(2.0))))


def layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, eps: float) -> tf.Tensor:
    """LayerNorm over the last axis. Written out (Mean, SquaredDifference, Rsqrt) so the FP16 pass can keep the
    statistics in fp32 by op type."""
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    variance = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + eps) * gamma + beta


def check_inputs(config: BertConfig, input_ids: tf.Tensor, input_mask: tf.Tensor,
                 segment_ids: tf.Tensor) -> list[tf.Operation]:
    """Asserts with messages naming the input: the checks the fused ops make, so both variants fail alike."""
    mask_ok = tf.reduce_all((input_mask == 0) | (input_mask == 1))
    no_gaps = tf.reduce_all(input_mask[:, 1:] <= input_mask[:, :-1])
    real = input_mask == 1
    ids_ok = tf.reduce_all(~real | ((input_ids >= 0) & (input_ids < config.vocab_size)))
    segments_ok = tf.reduce_all(~real | ((segment_ids >= 0) & (segment_ids < config.type_vocab_size)))
    seq = tf.shape(input_ids)[1]
    return [
        tf.debugging.assert_equal(tf.shape(input_ids), tf.shape(input_mask),
                                  message="input_mask must have the shape of input_ids"),
        tf.debugging.assert_equal(tf.shape(input_ids), tf.shape(segment_ids),
                                  message="segment_ids must have the shape of input_ids"),
        tf.debugging.assert_less_equal(seq, config.max_position_embeddings,
                                       message=f"sequence length exceeds max_position_embeddings "
                                               f"{config.max_position_embeddings}"),
        tf.debugging.Assert(mask_ok, ["input_mask values must be 0 or 1"]),
        tf.debugging.Assert(no_gaps, ["input_mask must be 1 for a prefix of each row and 0 after it"]),
        tf.debugging.Assert(ids_ok, [f"input_ids out of range [0, {config.vocab_size}) on a real position"]),
        tf.debugging.Assert(segments_ok,
                            [f"segment_ids out of range [0, {config.type_vocab_size}) on a real position"]),
    ]


def encoder_layer(x: tf.Tensor, w: Mapping[str, tf.Tensor], layer: int, mask_bias: tf.Tensor,
                  config: BertConfig, dropout: Dropout) -> tf.Tensor:
    """One post-LN BERT layer on [batch, seq, hidden]; mask_bias [batch, 1, 1, seq] hides padded keys."""
    batch, seq = tf.shape(x)[0], tf.shape(x)[1]
    heads, d, hidden = config.num_attention_heads, config.head_size, config.hidden_size

    def dense(t: tf.Tensor, name: str) -> tf.Tensor:
        return tf.matmul(t, w[f"{name}_kernel"][layer]) + w[f"{name}_bias"][layer]

    def split_heads(t: tf.Tensor) -> tf.Tensor:
        return tf.transpose(tf.reshape(t, [batch, seq, heads, d]), [0, 2, 1, 3])

    q, k, v = (split_heads(dense(x, part)) for part in ("query", "key", "value"))
    logits = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(d)) + mask_bias
    probs = dropout(tf.nn.softmax(logits, axis=-1))
    context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [batch, seq, hidden])
    x = layer_norm(dropout(dense(context, "attention_output")) + x, w["attention_ln_gamma"][layer],
                   w["attention_ln_beta"][layer], config.layer_norm_eps)
    ffn = dense(gelu(dense(x, "intermediate")), "output")
    return layer_norm(dropout(ffn) + x, w["output_ln_gamma"][layer], w["output_ln_beta"][layer],
                      config.layer_norm_eps)


def first_token_states(w: Mapping[str, tf.Tensor], config: BertConfig, input_ids: tf.Tensor,
                       input_mask: tf.Tensor, segment_ids: tf.Tensor, dropout: Dropout = _no_dropout) -> tf.Tensor:
    """Final [CLS] states [batch, hidden]; zeros for a row with no real token (the fused ops' contract)."""
    with tf.control_dependencies(check_inputs(config, input_ids, input_mask, segment_ids)):
        input_mask = tf.identity(input_mask)
    seq = tf.shape(input_ids)[1]
    x = (tf.gather(w["word_embeddings"], input_ids * input_mask)
         + w["position_embeddings"][tf.newaxis, :seq]
         + tf.gather(w["token_type_embeddings"], segment_ids * input_mask))
    x = dropout(layer_norm(x, w["embeddings_ln_gamma"], w["embeddings_ln_beta"], config.layer_norm_eps))
    real = tf.cast(input_mask, x.dtype)
    mask_bias = ((1.0 - real) * MASKED_ATTENTION_BIAS)[:, tf.newaxis, tf.newaxis, :]
    for layer in range(config.num_hidden_layers):
        x = encoder_layer(x, w, layer, mask_bias, config, dropout)
    return x[:, 0] * real[:, :1]


def head_logits(w: Mapping[str, tf.Tensor], first: tf.Tensor, dropout: Dropout = _no_dropout) -> tf.Tensor:
    """Pooler (dense + tanh) and classifier: [batch, hidden] -> [batch, num_labels]."""
    pooled = dropout(tf.tanh(tf.matmul(first, w["pooler_kernel"]) + w["pooler_bias"]))
    return tf.matmul(pooled, w["classifier_kernel"]) + w["classifier_bias"]


def logits_to_scores(logits: tf.Tensor) -> tf.Tensor:
    """The `scores` contract: sigmoid of a 1-label head, softmax probability of label 1 for a 2-label head."""
    if logits.shape[-1] == 1:
        return tf.sigmoid(logits[:, 0])
    return tf.nn.softmax(logits, axis=-1)[:, 1]


def ranker_scores(w: Mapping[str, tf.Tensor], config: BertConfig, input_ids: tf.Tensor, input_mask: tf.Tensor,
                  segment_ids: tf.Tensor) -> tf.Tensor:
    """Scores [batch] float32 from int32 [batch, seq] inputs, weights keyed by BertWeights names."""
    logits = head_logits(w, first_token_states(w, config, input_ids, input_mask, segment_ids))
    return tf.cast(logits_to_scores(logits), tf.float32)
