"""Client-side padding: pad id 0, mask 0, segments, fixed vs bucketed lengths."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.client.padding import pad, padded_length
from bertserve.client.tokenization import EncodedPairs, TruncationStats


def _encoded(lengths: list[int]) -> EncodedPairs:
    ids = [[101] + list(range(1000, 1000 + n - 2)) + [102] for n in lengths]
    return EncodedPairs(ids=ids, first_segment_len=[max(2, n // 2) for n in lengths], truncation=TruncationStats())


def test_fixed_padding_pads_every_request_to_max_len():
    batch = pad(_encoded([5, 9]), max_len=32)
    assert batch.input_ids.shape == batch.input_mask.shape == batch.segment_ids.shape == (2, 32)
    assert batch.input_ids.dtype == np.int32
    assert batch.input_mask[0].tolist() == [1] * 5 + [0] * 27
    assert batch.input_ids[0, 5:].tolist() == [0] * 27
    assert batch.segment_ids[1].tolist() == [0] * 4 + [1] * 5 + [0] * 23
    assert batch.input_ids[1, :9].tolist() == [101, *range(1000, 1007), 102]


@pytest.mark.parametrize("longest,expected", [(3, 8), (8, 8), (9, 16), (16, 16), (17, 32), (32, 32)])
def test_bucketed_padding_picks_the_smallest_bucket(longest, expected):
    assert padded_length(longest, 32, "bucketed") == expected
    assert pad(_encoded([3, longest]), 32, "bucketed").input_ids.shape == (2, expected)


def test_buckets_never_exceed_max_len():
    assert padded_length(20, 24, "bucketed") == 24


def test_bad_padding_inputs_are_named():
    with pytest.raises(ValueError, match="unknown padding mode 'ragged'"):
        pad(_encoded([5]), 32, "ragged")
    with pytest.raises(ValueError, match="more than max_len 8"):
        pad(_encoded([12]), 8)
