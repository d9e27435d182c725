"""Runs one op library's BertEmbedding -> BertEncoder -> BertGatherFirstToken, and BertEncoder with
first_token_only -> BertRankerHead, on fixed inputs; saves the outputs.

Run as a script in a fresh process (an op library registers its ops once per process), with
BERTSERVE_OPS_LIBRARY naming the .so that bertserve.custom_ops must load:

    BERTSERVE_OPS_LIBRARY=<lib.so> python op_outputs.py <out.npz>

Besides the outputs, the .npz records which _bert_ops.so files the process actually mapped, so the caller can
check that the variable was honoured.
"""

from __future__ import annotations

import sys

import numpy as np

# Small shapes with both supported head sizes; mixed lengths including full, 1 and an empty row.
CASES = {
    "h32": dict(hidden_size=64, num_attention_heads=2, intermediate_size=128),
    "h64": dict(hidden_size=128, num_attention_heads=2, intermediate_size=256),
}
LENGTHS = (16, 7, 1, 0, 12)
SEQ = 16
DTYPES = {"float32": np.float32, "float16": np.float16}


def case_inputs(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """input_ids, segment_ids, input_mask [batch, SEQ]; padded positions hold random ids too."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(SEQ)[None, :] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = rng.integers(0, 50, size=mask.shape, dtype=np.int32)
    segments = (np.arange(SEQ)[None, :] >= np.array(LENGTHS)[:, None] // 2).astype(np.int32)
    return ids, segments, mask


def run_case(name: str, dtype: str) -> dict[str, np.ndarray]:
    import tensorflow as tf

    from bertserve import custom_ops as ops
    from bertserve.export.graph import fused_arrays
    from bertserve.export.weights import BertConfig, BertWeights

    config = BertConfig(vocab_size=50, num_hidden_layers=2, max_position_embeddings=SEQ, **CASES[name])
    w = {k: tf.constant(v.astype(DTYPES[dtype])) for k, v in fused_arrays(BertWeights.random(config, seed=1)).items()}
    ids, segments, mask = case_inputs(seed=2)
    hidden, cu_seqlens = ops.bert_embedding(
        ids, segments, mask, w["word_embeddings"], w["position_embeddings"], w["token_type_embeddings"],
        w["embeddings_ln_gamma"], w["embeddings_ln_beta"], layer_norm_epsilon=config.layer_norm_eps)
    encoder_args = dict({k: w[k] for k in ops.ENCODER_WEIGHT_NAMES}, num_heads=config.num_attention_heads,
                        layer_norm_epsilon=config.layer_norm_eps)
    encoded = ops.bert_encoder(hidden, cu_seqlens, **encoder_args)
    first = ops.bert_gather_first_token(encoded, cu_seqlens)
    first_only = ops.bert_encoder(hidden, cu_seqlens, **encoder_args, first_token_only=True)
    scores = ops.bert_ranker_head(first_only, **{k: w[k] for k in ops.RANKER_HEAD_WEIGHT_NAMES})
    prefix = f"{name}/{dtype}/"
    return {prefix + "embedding": hidden.numpy(), prefix + "cu_seqlens": cu_seqlens.numpy(),
            prefix + "encoder": encoded.numpy(), prefix + "first_token": first.numpy(),
            prefix + "first_token_only": first_only.numpy(), prefix + "ranker_head": scores.numpy()}


def mapped_op_libraries() -> np.ndarray:
    """Paths of every _bert_ops.so mapped into this process."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if line.rstrip().endswith("_bert_ops.so")}
    return np.array(sorted(paths))


def main(out_path: str) -> None:
    outputs = {}
    for name in CASES:
        for dtype in DTYPES:
            outputs.update(run_case(name, dtype))
    np.savez(out_path, mapped_libraries=mapped_op_libraries(), **outputs)


if __name__ == "__main__":
    main(sys.argv[1])
