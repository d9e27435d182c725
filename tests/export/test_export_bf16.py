"""`bertserve export --precision bf16`: a fused SavedModel with fp32 weights whose BertEncoder asks for bf16 GEMM
operands, written, loaded and validated in one command; the stock variant has no bf16."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from bertserve.export import cli

from export_testing import needs_fused_ops


def fused_op_attrs(version_dir: str) -> dict[str, set[str]]:
    """The gemm_operands of every fused op node in the SavedModel's functions, by op name ("" where unset)."""
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(version_dir, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    attrs: dict[str, set[str]] = {}
    for function in saved.meta_graphs[0].graph_def.library.function:
        for node in function.node_def:
            if node.op.startswith("Bert"):
                attrs.setdefault(node.op, set()).add(node.attr["gemm_operands"].s.decode())
    return attrs


@needs_fused_ops
def test_fused_bf16_round_trip(capsys, tmp_path, google_dir):
    code = cli.main([google_dir, str(tmp_path), "--model", "ranker", "--version", "1", "--variant", "fused",
                     "--precision", "bf16", "--validate", "--max_seq_length", "24"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = out[out.index("target"):].splitlines()[1]
    assert row.startswith("saved_model (fused)          bf16") and row.endswith("ok")
    version_dir = str(tmp_path / "ranker" / "1")
    assert fused_op_attrs(version_dir)["BertEncoder"] == {"bfloat16"}
    assert fused_op_attrs(version_dir)["BertRankerHead"] == {""}  # the head has no such attr: fp32
    loaded = tf.saved_model.load(version_dir)
    assert {v.dtype for v in loaded.weights.values()} == {tf.float32}
    mask = np.ones((2, 24), np.int32)
    scores = loaded.signatures["serving_default"](input_ids=tf.constant(mask * 7), input_mask=tf.constant(mask),
                                                  segment_ids=tf.zeros_like(mask))["scores"]
    assert scores.shape == (2,)


def test_stock_bf16_is_refused(capsys, tmp_path, google_dir):
    code = cli.main([google_dir, str(tmp_path), "--model", "ranker", "--version", "1", "--variant", "stock",
                     "--precision", "bf16"])
    assert code == 2
    assert "precision bf16 is the fused variant's" in capsys.readouterr().err
