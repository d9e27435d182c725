"""Client-side padding into the three int32 tensors of the ranker signature.

Why here and not in the server: TF Serving's pad_variable_length_inputs pads with a tensor's first element, which
for BERT is a real token id, not [PAD]. So every request arrives padded, with pad id 0 and mask 0.

Two modes:
- fixed (default): every request is padded to max_len. Required when the model is served with batching: TF
  Serving concatenates requests along the batch axis and fails a merged batch whose sequence lengths differ.
- bucketed: padded to the smallest of 8/16/32 (up to max_len) that fits the longest pair. Less work per request,
  but only right for a model served without batching, or with one model (one batching queue) per bucket.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Sequence

import numpy as np

from bertserve.client.tokenization import EncodedPairs
from bertserve.model_dir import INPUT_NAMES

PaddingMode = Literal["fixed", "bucketed"]
PADDING_MODES: tuple[str, ...] = ("fixed", "bucketed")
DEFAULT_BUCKETS = (8, 16, 32)
PAD_ID = 0


@dataclasses.dataclass
class PaddedBatch:
    """The signature's inputs, each int32 [batch, seq]."""

    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def as_inputs(self) -> dict[str, np.ndarray]:
        return dict(zip(INPUT_NAMES, (self.input_ids, self.input_mask, self.segment_ids)))


def padded_length(longest: int, max_len: int, mode: PaddingMode,
                  buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """Sequence length a batch is padded to."""
    if mode == "fixed":
        return max_len
    if mode != "bucketed":
        raise ValueError(f"unknown padding mode {mode!r} (choose from {', '.join(PADDING_MODES)})")
    for bucket in sorted(buckets):
        if longest <= bucket <= max_len:
            return bucket
    return max_len


def pad(encoded: EncodedPairs, max_len: int, mode: PaddingMode = "fixed",
        buckets: Sequence[int] = DEFAULT_BUCKETS) -> PaddedBatch:
    """Pads encoded pairs; real positions come first, padded positions have id 0, mask 0, segment 0."""
    longest = max((len(ids) for ids in encoded.ids), default=0)
    if longest > max_len:
        raise ValueError(f"a pair has {longest} tokens, more than max_len {max_len}")
    seq = padded_length(longest, max_len, mode, buckets)
    n = len(encoded.ids)
    input_ids = np.full((n, seq), PAD_ID, dtype=np.int32)
    input_mask = np.zeros((n, seq), dtype=np.int32)
    segment_ids = np.zeros((n, seq), dtype=np.int32)
    for row, (ids, first_len) in enumerate(zip(encoded.ids, encoded.first_segment_len)):
        input_ids[row, :len(ids)] = ids
        input_mask[row, :len(ids)] = 1
        segment_ids[row, first_len:len(ids)] = 1
    return PaddedBatch(input_ids, input_mask, segment_ids)
