"""Shared helpers of the export tests (a module, not conftest, so test files import it by a unique name)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from bertserve import custom_ops
from bertserve.export.weights import BertConfig, BertWeights

TINY_CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=40, type_vocab_size=2)
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


needs_fused_ops = pytest.mark.skipif(not custom_ops.library_loads(),
                                     reason="bertserve.custom_ops is not built (make ops)")
VARIANTS = [pytest.param(("fused", p), marks=needs_fused_ops, id=f"fused-{p}") for p in ("fp32", "fp16")] + [
    pytest.param(("stock", p), id=f"stock-{p}") for p in ("fp32", "fp16")]
TOLERANCE = {"fp32": 1e-5, "fp16": 5e-3}


def padded_inputs(lengths: list[int], seq: int, config: BertConfig, seed: int = 0,
                  garbage_padding: bool = False) -> dict[str, np.ndarray]:
    """Rows of the given real lengths padded to seq; with garbage_padding the padded ids/segments are nonsense
    (out-of-range values included), which no variant may read."""
    rng = np.random.default_rng(seed)
    lengths_arr = np.asarray(lengths)[:, None]
    positions = np.arange(seq)[None, :]
    mask = (positions < lengths_arr).astype(np.int32)
    real_ids = rng.integers(5, config.vocab_size, size=(len(lengths), max(lengths + [1])))
    real_segments = (np.arange(real_ids.shape[1])[None, :] >= lengths_arr // 2).astype(np.int32)
    ids = np.zeros((len(lengths), seq), np.int32)
    segments = np.zeros((len(lengths), seq), np.int32)
    width = min(seq, real_ids.shape[1])
    ids[:, :width] = real_ids[:, :width]
    segments[:, :width] = real_segments[:, :width]
    if garbage_padding:
        ids = np.where(mask == 1, ids, rng.integers(-50, config.vocab_size + 50, size=ids.shape)).astype(np.int32)
        segments = np.where(mask == 1, segments, rng.integers(-3, 5, size=ids.shape)).astype(np.int32)
    else:
        ids, segments = ids * mask, segments * mask
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def google_variables(w: BertWeights) -> dict[str, np.ndarray]:
    """Google BERT run_classifier variable names, written out independently of the loader's naming tables."""
    out = {
        "bert/embeddings/word_embeddings": w["word_embeddings"],
        "bert/embeddings/position_embeddings": w["position_embeddings"],
        "bert/embeddings/token_type_embeddings": w["token_type_embeddings"],
        "bert/embeddings/LayerNorm/gamma": w["embeddings_ln_gamma"],
        "bert/embeddings/LayerNorm/beta": w["embeddings_ln_beta"],
        "bert/pooler/dense/kernel": w["pooler_kernel"],
        "bert/pooler/dense/bias": w["pooler_bias"],
        "output_weights": w["classifier_kernel"].T,
        "output_bias": w["classifier_bias"],
    }
    per_layer = {
        "attention/self/query/kernel": "query_kernel", "attention/self/query/bias": "query_bias",
        "attention/self/key/kernel": "key_kernel", "attention/self/key/bias": "key_bias",
        "attention/self/value/kernel": "value_kernel", "attention/self/value/bias": "value_bias",
        "attention/output/dense/kernel": "attention_output_kernel",
        "attention/output/dense/bias": "attention_output_bias",
        "attention/output/LayerNorm/gamma": "attention_ln_gamma",
        "attention/output/LayerNorm/beta": "attention_ln_beta",
        "intermediate/dense/kernel": "intermediate_kernel", "intermediate/dense/bias": "intermediate_bias",
        "output/dense/kernel": "output_kernel", "output/dense/bias": "output_bias",
        "output/LayerNorm/gamma": "output_ln_gamma", "output/LayerNorm/beta": "output_ln_beta",
    }
    for layer in range(w.config.num_hidden_layers):
        for suffix, name in per_layer.items():
            out[f"bert/encoder/layer_{layer}/{suffix}"] = w[name][layer]
    return out


def write_google_checkpoint(directory: str, variables: dict[str, np.ndarray], bert_config: dict) -> str:
    """A TF1 checkpoint written the way Google BERT's run_classifier writes one (tf.compat.v1 Saver)."""
    os.makedirs(directory, exist_ok=True)
    with tf.Graph().as_default():
        tf_vars = [tf.compat.v1.get_variable(name, initializer=tf.constant(value)) for name, value in variables.items()]
        saver = tf.compat.v1.train.Saver(tf_vars)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            prefix = saver.save(session, os.path.join(directory, "model.ckpt"), global_step=1000)
    with open(os.path.join(directory, "bert_config.json"), "w") as f:
        json.dump(bert_config, f)
    return prefix


def google_bert_config(config=TINY_CONFIG, **overrides) -> dict:
    fields = {"vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
              "num_hidden_layers": config.num_hidden_layers, "num_attention_heads": config.num_attention_heads,
              "intermediate_size": config.intermediate_size, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
              "attention_probs_dropout_prob": 0.1, "max_position_embeddings": config.max_position_embeddings,
              "type_vocab_size": config.type_vocab_size, "initializer_range": 0.02}
    return {**fields, **overrides}
