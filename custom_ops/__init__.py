"""Python side of the fused BERT encoder ops (contract: custom_ops/README.md).

The op library `_bert_ops.so` next to this file (or the one named by $BERTSERVE_OPS_LIBRARY) is loaded on first
use, so importing the package stays cheap; call `load_op_library()` before loading a SavedModel that uses the ops
(loading registers them with TensorFlow, once per process).
"""

from __future__ import annotations

import functools
import os
import types
import warnings

LIBRARY_ENV = "BERTSERVE_OPS_LIBRARY"
LIBRARY_FILE = "_bert_ops.so"
# The TF GPU kernels of the same ops (`make gpu-ops`); optional, loaded after the ops are registered.
GPU_LIBRARY_FILE = "_bert_ops_gpu.so"
# The TensorFlow minor version the library is built against (pyproject.toml pins it); the C++ ABI of custom ops
# is only stable within one TensorFlow release.
SUPPORTED_TF_VERSION = "2.21"

# BertEncoder's 12 stacked weight inputs, in input order (each has a leading layer axis).
ENCODER_WEIGHT_NAMES = (
    "qkv_kernel", "qkv_bias",
    "attention_output_kernel", "attention_output_bias", "attention_ln_gamma", "attention_ln_beta",
    "intermediate_kernel", "intermediate_bias",
    "output_kernel", "output_bias", "output_ln_gamma", "output_ln_beta",
)

# BertRankerHead's weight inputs after first_tokens, in input order.
RANKER_HEAD_WEIGHT_NAMES = ("pooler_kernel", "pooler_bias", "classifier_kernel", "classifier_bias")


def library_path() -> str:
    """The op library this process loads: $BERTSERVE_OPS_LIBRARY if set, else the one built next to this file."""
    return os.environ.get(LIBRARY_ENV) or os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_FILE)


@functools.cache
def load_op_library() -> types.ModuleType:
    """Loads (once) and returns the op library, plus the GPU kernels beside it when built; raises
    FileNotFoundError naming the path and how to build it."""
    import tensorflow as tf

    path = library_path()
    if not os.path.exists(path):
        raise FileNotFoundError(f"fused BERT op library not found at {path}: build it with `make ops` "
                                f"(or `python setup.py build_ext --inplace`), or set ${LIBRARY_ENV}")
    if not tf.__version__.startswith(SUPPORTED_TF_VERSION + "."):
        warnings.warn(f"bertserve ops are built for TensorFlow {SUPPORTED_TF_VERSION}.x but TensorFlow "
                      f"{tf.__version__} is running; rebuild them against it if loading fails", stacklevel=2)
    library = tf.load_op_library(path)
    gpu_kernels = os.path.join(os.path.dirname(path), GPU_LIBRARY_FILE)
    if os.path.exists(gpu_kernels):
        tf.load_op_library(gpu_kernels)
    return library


def library_loads() -> bool:
    """True when the op library is built and loads here: what callers that can do without the fused ops (stock
    variants, tests, benches) ask, instead of each catching load_op_library's errors."""
    import tensorflow as tf

    try:
        load_op_library()
    except (OSError, tf.errors.OpError):  # FileNotFoundError (not built) is an OSError
        return False
    return True


def cpu_gemm_backend(operands: str = "float") -> str | None:
    """The CPU GEMM backend that packs weights in this process now, for float or bfloat16 operands (this CPU's
    choice, or $BERTSERVE_CPU_GEMM / $BERTSERVE_CPU_GEMM_BF16): the library's own answer, for tests and benches."""
    import ctypes

    load_op_library()  # its TensorFlow dependencies, before ctypes opens it
    symbol = {"float": "bertserve_cpu_gemm_backend", "bfloat16": "bertserve_cpu_gemm_bf16_backend"}[operands]
    query = getattr(ctypes.CDLL(library_path()), symbol)
    query.restype = ctypes.c_char_p
    name = query()
    return name.decode() if name is not None else None


def bert_embedding(input_ids, segment_ids, input_mask, word_embeddings, position_embeddings, token_type_embeddings,
                   layer_norm_gamma, layer_norm_beta, layer_norm_epsilon: float = 1e-12):
    """Word + position + token-type lookup and LayerNorm -> (hidden [N, H] packed, cu_seqlens [B + 1])."""
    return load_op_library().bert_embedding(
        input_ids=input_ids, segment_ids=segment_ids, input_mask=input_mask, word_embeddings=word_embeddings,
        position_embeddings=position_embeddings, token_type_embeddings=token_type_embeddings,
        layer_norm_gamma=layer_norm_gamma, layer_norm_beta=layer_norm_beta, layer_norm_epsilon=layer_norm_epsilon)


def bert_encoder(hidden, cu_seqlens, *, qkv_kernel, qkv_bias, attention_output_kernel, attention_output_bias,
                 attention_ln_gamma, attention_ln_beta, intermediate_kernel, intermediate_bias, output_kernel,
                 output_bias, output_ln_gamma, output_ln_beta, num_heads: int, layer_norm_epsilon: float = 1e-12,
                 first_token_only: bool = False, gemm_operands: str = "float"):
    """A stack of L BERT layers on packed tokens (weights stacked on a leading layer axis) -> [N, H]; with
    first_token_only, each row's first token [B, H] (zeros for a row without tokens), as bert_gather_first_token
    of the full output would give, at the cost of the last layer's QKV GEMM alone for the other tokens.
    gemm_operands="bfloat16": the weight GEMMs take bf16-rounded operands (float models, CPU only)."""
    return load_op_library().bert_encoder(
        hidden=hidden, cu_seqlens=cu_seqlens, qkv_kernel=qkv_kernel, qkv_bias=qkv_bias,
        attention_output_kernel=attention_output_kernel, attention_output_bias=attention_output_bias,
        attention_ln_gamma=attention_ln_gamma, attention_ln_beta=attention_ln_beta,
        intermediate_kernel=intermediate_kernel, intermediate_bias=intermediate_bias, output_kernel=output_kernel,
        output_bias=output_bias, output_ln_gamma=output_ln_gamma, output_ln_beta=output_ln_beta,
        num_heads=num_heads, layer_norm_epsilon=layer_norm_epsilon, first_token_only=first_token_only,
        gemm_operands=gemm_operands)


def bert_remove_padding(input, input_mask):  # noqa: A002 (the op's input name)
    """[B, S, H] -> (packed [N, H], cu_seqlens [B + 1])."""
    return load_op_library().bert_remove_padding(input=input, input_mask=input_mask)


def bert_rebuild_padding(input, input_mask):  # noqa: A002
    """Packed [N, H] -> [B, S, H], zeros on padded positions."""
    return load_op_library().bert_rebuild_padding(input=input, input_mask=input_mask)


def bert_gather_first_token(input, cu_seqlens):  # noqa: A002
    """First real token of each row -> [B, H]; zeros for a row with no real token."""
    return load_op_library().bert_gather_first_token(input=input, cu_seqlens=cu_seqlens)


def bert_ranker_head(first_tokens, *, pooler_kernel, pooler_bias, classifier_kernel, classifier_bias):
    """Pooler + classifier on first tokens [B, H], in float -> scores float32 [B]: sigmoid of a 1-label head, the
    softmax probability of label 1 for a 2-label head (stock.logits_to_scores of stock.head_logits)."""
    inputs = {"first_tokens": first_tokens, "pooler_kernel": pooler_kernel, "pooler_bias": pooler_bias,
              "classifier_kernel": classifier_kernel, "classifier_bias": classifier_bias}
    _check_one_type("BertRankerHead", inputs)
    return load_op_library().bert_ranker_head(**inputs)


def _check_one_type(op: str, inputs: dict) -> None:
    """Raises InvalidArgumentError naming the first input whose dtype differs from the first one's: the op's inputs
    share one type T, and TensorFlow's own eager error names an input by its index alone."""
    import tensorflow as tf

    typed = {name: tf.as_dtype(value.dtype) for name, value in inputs.items() if hasattr(value, "dtype")}
    if not typed:
        return
    (first_name, expected), *rest = typed.items()
    for name, dtype in rest:
        if dtype != expected:
            raise tf.errors.InvalidArgumentError(
                None, None, f"{op}: {name} is {dtype.name} but {first_name} is {expected.name}; all of them must be "
                            f"one type T (float32 or float16)")
