"""BertWeights -> a tf.Module whose `serving_default` is the bertserve ranker signature.

    serving_default(input_ids, input_mask, segment_ids: int32 [batch, seq]) -> {"scores": float32 [batch]}

Variants (every one has that same signature, so a client never knows which it hit):
- fused fp32 / fp16: bertserve.custom_ops (BertEmbedding -> BertEncoder with first_token_only, padding-free: the
  last layer runs past its QKV GEMM on the [CLS] tokens alone, all that the pooler reads) -> BertRankerHead
  (pooler and classifier in one op, computed in fp32: the CUDA core's fused head on GPU). fp16 stores every
  weight as half (the model is half the size on disk) and runs the ops' half kernels. SavedModels exported
  before BertRankerHead ran the head as stock ops; they load and serve unchanged.
- fused bf16 (CPU): the fused fp32 graph, weights stored fp32, with gemm_operands="bfloat16" on BertEncoder: its
  weight GEMMs round operands to bf16 and sum in fp32 (half the weight bytes read per call); LayerNorm, softmax,
  residuals and GELU stay fp32, and so does BertRankerHead (bf16 in the pooler alone moved MiniLM's scores by up
  to 4.7e-3 for 1.4 % of the weight bytes). The attr, not bf16 weights, is the request: the op packs its own bf16
  copy, and the GPU kernel refuses it. No stock bf16.
- stock fp32: standard TF ops only (stock.py); padding handled by masking.
- stock fp16: the stock fp32 graph rewritten by the FP16 conversion pass (fp16.py); weights stored half except
  the few the pass keeps in fp32.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from bertserve.export import fp16, stock
from bertserve.export.signature import INPUT_SIGNATURE
from bertserve.export.weights import BertWeights
from bertserve.model_dir import OUTPUT_NAME

VARIANTS = ("fused", "stock")
PRECISIONS = ("fp32", "fp16", "bf16")

# Stored weight dtype and the fused ops' gemm_operands attr per precision.
_DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": np.float32}
_GEMM_OPERANDS = {"fp32": "float", "fp16": "float", "bf16": "bfloat16"}


class RankerModule(tf.Module):
    """Holds the weights as variables (saved under variables/) and the serving function."""

    def __init__(self, weights: dict[str, np.ndarray], serve: Callable, variant: str, precision: str):
        super().__init__(name="bertserve_ranker")
        self.weights = {name: tf.Variable(value, trainable=False, name=name) for name, value in weights.items()}
        self.variant = variant
        self.precision = precision
        self.serving_default = tf.function(lambda input_ids, input_mask, segment_ids: {
            OUTPUT_NAME: serve(self.weights, input_ids, input_mask, segment_ids)}, input_signature=INPUT_SIGNATURE)


def fused_arrays(weights: BertWeights) -> dict[str, np.ndarray]:
    """BertWeights -> the fused ops' weight inputs: q/k/v fused into qkv_kernel [L, H, 3H] and qkv_bias [L, 3H]."""
    arrays = {name: value for name, value in weights.items()
              if not name.startswith(("query_", "key_", "value_"))}
    for kind in ("kernel", "bias"):
        arrays[f"qkv_{kind}"] = np.concatenate(
            [weights[f"{part}_{kind}"] for part in ("query", "key", "value")], axis=-1)
    return arrays


def _fused_serve(weights: BertWeights, first_token_only: bool, gemm_operands: str) -> Callable:
    from bertserve import custom_ops as ops

    ops.load_op_library()  # fail here, naming the missing library, rather than inside tracing at save time
    config = weights.config
    encoder_inputs = list(ops.ENCODER_WEIGHT_NAMES)

    def serve(w, input_ids, input_mask, segment_ids):
        hidden, cu_seqlens = ops.bert_embedding(
            input_ids, segment_ids, input_mask, w["word_embeddings"], w["position_embeddings"],
            w["token_type_embeddings"], w["embeddings_ln_gamma"], w["embeddings_ln_beta"],
            layer_norm_epsilon=config.layer_norm_eps)
        encoded = ops.bert_encoder(hidden, cu_seqlens, **{name: w[name] for name in encoder_inputs},
                                   num_heads=config.num_attention_heads, layer_norm_epsilon=config.layer_norm_eps,
                                   first_token_only=first_token_only, gemm_operands=gemm_operands)
        first = encoded if first_token_only else ops.bert_gather_first_token(encoded, cu_seqlens)
        return ops.bert_ranker_head(first, **{name: w[name] for name in ops.RANKER_HEAD_WEIGHT_NAMES})

    return serve


def _stock_serve(weights: BertWeights) -> Callable:
    return lambda w, *inputs: stock.ranker_scores(w, weights.config, *inputs)


def build_ranker_module(weights: BertWeights, variant: str = "fused", precision: str = "fp32",
                        first_token_only: bool = True) -> RankerModule:
    """The ranker as a tf.Module ready for tf.saved_model.save (see module docstring for the variants).
    first_token_only=False (fused only) runs every layer on every token, then BertGatherFirstToken: the graph
    as exported before the attr, which benchmarks time beside it."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
    if variant == "fused":
        arrays = {name: value.astype(_DTYPES[precision]) for name, value in fused_arrays(weights).items()}
        return RankerModule(arrays, _fused_serve(weights, first_token_only, _GEMM_OPERANDS[precision]), variant,
                            precision)
    if precision == "bf16":
        raise ValueError("precision bf16 is the fused variant's (bf16 GEMM operands in the CPU ops); the stock "
                         "variant has fp32 and fp16")
    if precision == "fp32":
        return RankerModule(dict(weights.items()), _stock_serve(weights), variant, precision)
    converted = fp16.convert_stock_ranker(weights)
    return RankerModule(converted.weights, converted.serve, variant, precision)

