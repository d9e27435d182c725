"""Graph builders on a tiny BERT: every variant against the float64 reference, padding invariance, the FP16
pass's fp32 islands, and bad inputs that name the problem."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from bertserve.export import fp16, graph, reference
from bertserve.export.weights import BertWeights

from export_testing import TINY_CONFIG, TOLERANCE, VARIANTS, padded_inputs


def run(module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return module.serving_default(**{k: tf.constant(v) for k, v in inputs.items()})["scores"].numpy()


@pytest.fixture(scope="module")
def modules(tiny_weights):
    """(variant, precision) -> module, built once per variant the tests ask for."""
    cache = {}

    def get(variant: str, precision: str, weights: BertWeights = tiny_weights):
        key = (variant, precision, id(weights))
        if key not in cache:
            cache[key] = graph.build_ranker_module(weights, variant, precision)
        return cache[key]

    return get


@pytest.mark.parametrize("variant", VARIANTS)
def test_matches_reference_on_mixed_lengths(modules, tiny_weights, variant):
    inputs = padded_inputs([16, 1, 7, 12, 3, 16], seq=16, config=TINY_CONFIG)
    scores = run(modules(*variant), inputs)
    expected = reference.scores(tiny_weights, **inputs)
    assert scores.dtype == np.float32 and scores.shape == (6,)
    assert np.max(np.abs(scores - expected)) <= TOLERANCE[variant[1]]


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_never_changes_real_outputs(modules, variant):
    lengths = [9, 1, 5, 9, 2]
    short = padded_inputs(lengths, seq=9, config=TINY_CONFIG, seed=3)
    long = padded_inputs(lengths, seq=30, config=TINY_CONFIG, seed=3, garbage_padding=True)
    np.testing.assert_array_equal(short["input_ids"], long["input_ids"][:, :9] * long["input_mask"][:, :9])
    module = modules(*variant)
    scores_short, scores_long = run(module, short), run(module, long)
    if variant[0] == "fused":  # padded positions are never computed: bitwise the same
        np.testing.assert_array_equal(scores_short, scores_long)
    else:  # masked keys add exactly zero; only GEMM blocking for another seq length may round differently
        assert np.max(np.abs(scores_short - scores_long)) <= {"fp32": 1e-6, "fp16": 1e-3}[variant[1]]


@pytest.mark.parametrize("variant", VARIANTS)
def test_row_without_real_tokens_scores_from_head_biases(modules, tiny_weights, variant):
    inputs = padded_inputs([0, 4], seq=6, config=TINY_CONFIG)
    expected = reference.head_scores(tiny_weights, np.zeros((1, TINY_CONFIG.hidden_size)))[0]
    assert abs(run(modules(*variant), inputs)[0] - expected) <= TOLERANCE[variant[1]]


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_label_head_scores_softmax_of_label_one(modules, variant):
    weights = BertWeights.random(dataclasses.replace(TINY_CONFIG, num_labels=2), seed=4, scale=0.2)
    inputs = padded_inputs([5, 11, 2], seq=11, config=TINY_CONFIG)
    scores = run(modules(*variant, weights=weights), inputs)
    assert np.max(np.abs(scores - reference.scores(weights, **inputs))) <= TOLERANCE[variant[1]]


def test_fp16_pass_keeps_sensitive_ops_in_fp32(tiny_weights):
    converted = fp16.convert_stock_ranker(tiny_weights)
    dtype_of = {n.name: n.attr["T"].type for n in converted.graph_def.node if "T" in n.attr}
    ops = {n.name: n.op for n in converted.graph_def.node}
    by_op: dict[str, set[int]] = {}
    for name, dtype in dtype_of.items():
        by_op.setdefault(ops[name], set()).add(dtype)
    for op in fp16.KEEP_FP32_OPS:
        assert by_op[op] == {fp16.FP32}, op
    for op in ("MatMul", "BatchMatMulV2", "Erf", "Tanh"):
        assert by_op[op] == {fp16.HALF}, op
    gathers = [n for n in converted.graph_def.node if n.op == "GatherV2"]
    assert gathers and all(n.attr["Tparams"].type == fp16.HALF for n in gathers)
    fp32_weights = {n for n, v in converted.weights.items() if v.dtype == np.float32}
    assert fp32_weights == {"embeddings_ln_gamma", "embeddings_ln_beta"}, fp32_weights
    casts = [n for n in converted.graph_def.node if n.op == "Cast" and n.name.endswith(("/to_fp16", "/to_fp32"))]
    assert casts, "the pass inserts casts at the fp32 islands' borders"


def test_fp16_stock_module_stores_half_weights(modules):
    module = modules("stock", "fp16")
    assert module.weights["word_embeddings"].dtype == tf.float16
    assert module.weights["intermediate_kernel"].dtype == tf.float16
    half_bytes = sum(v.numpy().nbytes for v in module.weights.values())
    assert half_bytes <= 0.51 * sum(v.numpy().nbytes for v in modules("stock", "fp32").weights.values())


def test_stock_gelu_is_erf_not_erfc(tiny_weights):
    graph_def, _ = fp16.stock_graph_def(tiny_weights)
    ops = {n.op for n in graph_def.node}
    assert "Erf" in ops and "Erfc" not in ops


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("change, message", [
    ("id_out_of_range", "input_ids"),
    ("segment_out_of_range", "segment_ids"),
    ("mask_gap", "input_mask"),
    ("too_long", "40"),  # max_position_embeddings
])
def test_bad_inputs_fail_with_a_message_naming_them(modules, variant, change, message):
    seq = 41 if change == "too_long" else 8
    inputs = padded_inputs([6, 8], seq=seq, config=TINY_CONFIG)
    if change == "id_out_of_range":
        inputs["input_ids"][1, 2] = TINY_CONFIG.vocab_size
    elif change == "segment_out_of_range":
        inputs["segment_ids"][0, 1] = 2
    elif change == "mask_gap":
        inputs["input_mask"][0, 2] = 0
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        run(modules(*variant), inputs)
