"""Seeded ranker inputs of mixed real lengths: for warmup requests, validation and head calibration alike."""

from __future__ import annotations

import numpy as np

from bertserve.export.weights import BertConfig
from bertserve.model_dir import INPUT_NAMES

FIRST_ORDINARY_TOKEN = 1000  # BERT vocabularies keep [PAD]/[unused*]/[CLS]/[SEP]/[MASK] below this id


def mixed_length_inputs(config: BertConfig, batch_size: int, seq_length: int,
                        seed: int = 0) -> dict[str, np.ndarray]:
    """int32 input_ids/input_mask/segment_ids [batch_size, seq_length], padded the way clients pad.

    Row 0 is full length and row 1 has one real token (the extremes); the others have random lengths.
    """
    rng = np.random.default_rng([seed, batch_size, seq_length])
    lengths = np.concatenate([[seq_length, 1], rng.integers(min(2, seq_length), seq_length + 1, size=batch_size)])
    return inputs_of_lengths(config, lengths[:batch_size], seq_length, rng)


def inputs_of_lengths(config: BertConfig, lengths: np.ndarray, seq_length: int,
                      rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Padded inputs whose rows have these real lengths. The second half of each row's real tokens is segment 1,
    like a (query, reply) pair. Ids avoid the special-token range."""
    positions = np.arange(seq_length)[None, :]
    mask = (positions < np.asarray(lengths)[:, None]).astype(np.int32)
    low = min(FIRST_ORDINARY_TOKEN, config.vocab_size // 2)
    ids = rng.integers(low, config.vocab_size, size=mask.shape).astype(np.int32) * mask
    two_segments = config.type_vocab_size > 1
    segments = ((positions >= (np.asarray(lengths)[:, None] + 1) // 2) & two_segments).astype(np.int32) * mask
    return dict(zip(INPUT_NAMES, (ids, mask, segments)))
