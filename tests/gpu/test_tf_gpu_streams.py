"""The encoder's CUDA graphs run in order with TensorFlow's stream. The core captures them on a stream of its own and
replays them onto the stream TensorFlow hands the kernel, staging each call's tokens into the graph's arena before the
replay and copying the output out after it. Were the replay not ordered with TensorFlow's stream, a call would read
the arena before its tokens arrived (the previous call's tokens: another input's output) or the stock op after the
encoder would read its output before it was written.

The graph here is the embedding, the encoder (every token's output) and a stock TF op consuming that output right
after it; several threads run it at once on inputs of one shape (one graph, one arena), each input with its own
expected output. Every call must give its own input's output bit for bit, and the stock op must have seen exactly
that output (squaring an fp16 value in float32 is exact, so the check is bitwise)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tf_gpu_testing import carried, device_name, needs_device, on_gpu, reference_dir, run_threads

from bertserve import custom_ops as ops
from bertserve.export.graph import fused_arrays
from bertserve.export.samples import FIRST_ORDINARY_TOKEN
from bertserve.export.signature import INPUT_SIGNATURE

pytestmark = needs_device

THREADS, INPUTS, BATCH = 8, 4, 32


def encoder_then_stock_op():
    """A tf.function on the test device: the fused embedding and encoder, then tf.square of the encoder's output."""
    weights = carried.variant_weights(reference_dir(), "chitchat", "fp16")
    config = weights.config
    with tf.device(device_name()):
        w = {name: tf.Variable(value.astype(np.float16), trainable=False) for name, value in
             fused_arrays(weights).items()}

    @tf.function(input_signature=INPUT_SIGNATURE)
    def run(input_ids, input_mask, segment_ids):
        with tf.device(device_name()):
            hidden, cu_seqlens = ops.bert_embedding(
                input_ids, segment_ids, input_mask, w["word_embeddings"], w["position_embeddings"],
                w["token_type_embeddings"], w["embeddings_ln_gamma"], w["embeddings_ln_beta"],
                layer_norm_epsilon=config.layer_norm_eps)
            output = ops.bert_encoder(hidden, cu_seqlens, **{name: w[name] for name in ops.ENCODER_WEIGHT_NAMES},
                                      num_heads=config.num_attention_heads, layer_norm_epsilon=config.layer_norm_eps)
            return output, tf.square(tf.cast(output, tf.float32))

    return run, w


def same_shape_inputs(pool: dict[str, np.ndarray], vocab_size: int) -> list[dict[str, tf.Tensor]]:
    """INPUTS batches of the same real lengths (one token bucket: one graph and arena) and different ids."""
    rows = carried.batch_rows(len(pool["input_ids"]), BATCH, seed=3)
    base = carried.take(pool, rows)
    rng = np.random.default_rng(5)
    batches = []
    for _ in range(INPUTS):
        ids = rng.integers(FIRST_ORDINARY_TOKEN, vocab_size, base["input_ids"].shape).astype(np.int32)
        batches.append({**base, "input_ids": ids * base["input_mask"]})
    return [{name: tf.constant(value) for name, value in batch.items()} for batch in batches]


def test_stock_op_after_encoder_sees_its_finished_output_under_load(tf_pool):
    ops.load_op_library()
    run, _ = encoder_then_stock_op()
    inputs = same_shape_inputs(tf_pool, carried.variant_weights(reference_dir(), "chitchat", "fp16").config.vocab_size)
    expected = [run(**batch)[0].numpy() for batch in inputs]
    assert all(not np.array_equal(expected[0], e) for e in expected[1:]), "the inputs must give different outputs"
    repeats = 100 if on_gpu() else 3
    wrong_output, wrong_consumer = [0] * THREADS, [0] * THREADS

    def work(index: int) -> None:
        for call in range(repeats):
            k = (index + call) % INPUTS
            output, squared = (t.numpy() for t in run(**inputs[k]))
            wrong_output[index] += not np.array_equal(output, expected[k])
            wrong_consumer[index] += not np.array_equal(squared, np.square(output.astype(np.float32)))

    run_threads(work, THREADS)
    print(f"{THREADS} threads x {repeats} calls of {INPUTS} inputs of one shape ({BATCH} rows, "
          f"{expected[0].shape[0]} tokens): {sum(wrong_output)} outputs not their input's, {sum(wrong_consumer)} "
          f"stock-op results not of the output")
    assert sum(wrong_output) == 0 and sum(wrong_consumer) == 0
