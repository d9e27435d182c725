"""Shared helpers of the export tests (a module, not conftest, so test files import it by a unique name)."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.export.weights import BertConfig

TINY_CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=40, type_vocab_size=2)
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def fused_ops_available() -> bool:
    """True when bertserve.custom_ops loads (its .so is built and exposes the fused op wrappers)."""
    try:
        from bertserve import custom_ops
    except Exception:  # noqa: BLE001  (any load failure means "not built here")
        return False
    return all(hasattr(custom_ops, name) for name in ("bert_embedding", "bert_encoder", "bert_gather_first_token"))


needs_fused_ops = pytest.mark.skipif(not fused_ops_available(),
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
