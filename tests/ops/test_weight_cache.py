"""The float encoder packs its GEMM weights once per set of weight buffers (custom_ops/README.md, CPU): a weight
variable assigned between calls must be repacked, and concurrent calls with different weights must not mix."""

from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf
from ops_testing import EMBEDDING_NAMES, FP32_TOLERANCE, assert_close, op_weights, random_batch, small_config

from bertserve import custom_ops as ops
from bertserve.export import reference
from bertserve.export.graph import fused_arrays
from bertserve.export.weights import BertWeights


def test_assigned_weight_variables_are_repacked():
    config = small_config()
    before, after = BertWeights.random(config, seed=11), BertWeights.random(config, seed=12)
    names = EMBEDDING_NAMES + ops.ENCODER_WEIGHT_NAMES
    variables = {name: tf.Variable(array) for name, array in fused_arrays(before).items() if name in names}

    @tf.function
    def encode(ids, mask, segments):
        eps = config.layer_norm_eps
        hidden, cu_seqlens = ops.bert_embedding(ids, segments, mask, *(variables[n] for n in EMBEDDING_NAMES),
                                                layer_norm_epsilon=eps)
        encoder = {n: variables[n] for n in ops.ENCODER_WEIGHT_NAMES}
        return ops.bert_encoder(hidden, cu_seqlens, **encoder, num_heads=config.num_attention_heads,
                                layer_norm_epsilon=eps)

    lengths = [7, 3, 12]
    ids, mask, segments = random_batch(np.random.default_rng(0), lengths, 12, config)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    for weights in (before, after, before):
        for name, array in fused_arrays(weights).items():
            if name in variables:
                variables[name].assign(array)
        hidden = encode(ids, mask, segments).numpy()
        for b, rows in enumerate(reference.encode(weights, ids, mask, segments)):
            assert_close(hidden[bounds[b]:bounds[b + 1]], rows, FP32_TOLERANCE)


def test_concurrent_calls_with_two_weight_sets_match_serial_calls():
    config = small_config(hidden=128, heads=4)
    weight_sets = [BertWeights.random(config, seed=s) for s in (21, 22)]
    encoder_inputs = [{n: tf.constant(a) for n, a in op_weights(w)[1].items()} for w in weight_sets]
    hidden = tf.constant(np.random.default_rng(1).standard_normal((37, config.hidden_size)).astype(np.float32))
    cu_seqlens = tf.constant([0, 20, 37], tf.int32)

    def encode(inputs):
        return ops.bert_encoder(hidden, cu_seqlens, **inputs, num_heads=config.num_attention_heads,
                                layer_norm_epsilon=config.layer_norm_eps).numpy()

    expected = [encode(inputs) for inputs in encoder_inputs]
    assert not np.array_equal(expected[0], expected[1])
    mismatches, errors = [], []

    def worker(index: int) -> None:
        try:
            for call in range(20):
                which = (index + call) % 2
                if not np.array_equal(encode(encoder_inputs[which]), expected[which]):
                    mismatches.append((index, call))
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert not mismatches, f"calls whose output differs from the serial call: {mismatches}"
