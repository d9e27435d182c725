"""ONNX export: a self-contained file (weights as initializers) that onnxruntime runs like the float64 reference."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx
import pytest

from bertserve.export import onnx_export, reference
from bertserve.export.weights import BertWeights
from bertserve.model_dir import INPUT_NAMES, OUTPUT_NAME

from export_testing import TINY_CONFIG, padded_inputs


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory, tiny_weights) -> str:
    base = tmp_path_factory.mktemp("models")
    return onnx_export.export_onnx(tiny_weights, onnx_export.onnx_path(str(base), "tiny", 1))


def test_path_is_beside_the_versions(tiny_onnx):
    assert tiny_onnx.endswith(os.path.join("tiny", "onnx", "1", "model.onnx"))


def test_weights_are_initializers_in_one_file(tiny_onnx, tiny_weights):
    model = onnx.load(tiny_onnx, load_external_data=False)
    assert [i.name for i in model.graph.input] == list(INPUT_NAMES)
    assert [o.name for o in model.graph.output] == [OUTPUT_NAME]
    stored = {t.name: t for t in model.graph.initializer}
    expected = onnx_export.initializer_arrays(tiny_weights)
    assert set(expected) <= set(stored)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    for name, value in expected.items():
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(stored[name]), value, err_msg=name)
    layer = TINY_CONFIG.num_hidden_layers - 1
    np.testing.assert_array_equal(expected[f"layer_{layer}_intermediate_kernel"],
                                  tiny_weights["intermediate_kernel"][layer])


def test_agrees_with_reference_and_ignores_padding(tiny_onnx, tiny_weights):
    ranker = onnx_export.OnnxRanker(tiny_onnx)
    lengths = [12, 1, 6, 9, 0]
    inputs = padded_inputs(lengths, seq=12, config=TINY_CONFIG)
    scores = ranker.scores(**inputs)
    assert np.max(np.abs(scores - reference.scores(tiny_weights, **inputs))) <= 1e-5
    padded = ranker.scores(**padded_inputs(lengths, seq=33, config=TINY_CONFIG, garbage_padding=True))
    assert np.max(np.abs(padded - scores)) <= 1e-6


def test_session_options_reach_the_session(tiny_onnx, tiny_weights):
    ranker = onnx_export.OnnxRanker(tiny_onnx, threads=1, session_config={"session.force_spinning_stop": "1"})
    options = ranker.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    inputs = padded_inputs([5, 3], seq=8, config=TINY_CONFIG)
    assert np.max(np.abs(ranker.scores(**inputs) - reference.scores(tiny_weights, **inputs))) <= 1e-5


def test_two_label_head_agrees_with_reference(tmp_path):
    weights = BertWeights.random(dataclasses.replace(TINY_CONFIG, num_labels=2, num_hidden_layers=1), seed=3,
                                 scale=0.2)
    ranker = onnx_export.OnnxRanker(onnx_export.export_onnx(weights, str(tmp_path / "model.onnx")))
    inputs = padded_inputs([7, 3, 1], seq=8, config=weights.config)
    assert np.max(np.abs(ranker.scores(**inputs) - reference.scores(weights, **inputs))) <= 1e-5
