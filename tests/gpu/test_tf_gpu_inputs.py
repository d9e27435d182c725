"""What the served variants do with their inputs on the test device: padded positions change no score (0.0), and bad
input answers InvalidArgument naming the input, with no crash and the model still serving afterwards."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_gpu_testing import VARIANTS, carried, max_abs, needs_device, op_message

pytestmark = needs_device

ROWS = np.arange(64)  # every length 0..32, then random lengths


def garbage_padding(inputs: dict[str, np.ndarray], vocab_size: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """The rows padded to seq, with ids and segments in padded positions that no op may read (out of range too)."""
    rng = np.random.default_rng(seed)
    rows, width = inputs["input_ids"].shape
    mask = np.zeros((rows, seq), np.int32)
    mask[:, :width] = inputs["input_mask"]
    out = {"input_mask": mask}
    for name, low, high in (("input_ids", -50, vocab_size + 50), ("segment_ids", -3, 5)):
        value = rng.integers(low, high, (rows, seq)).astype(np.int32)
        value[:, :width] = np.where(inputs["input_mask"] == 1, inputs[name], value[:, :width])
        out[name] = value
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_padded_positions_change_no_score(tf_served, tf_pool, variant):
    served = tf_served(*variant)
    inputs = carried.take(tf_pool, ROWS)
    clean = served.scores(inputs)
    changes = {f"seq {seq}, seed {seed}": max_abs(
        served.scores(garbage_padding(inputs, served.config.vocab_size, seq, seed)), clean)
        for seq, seed in ((carried.SEQ, 1), (carried.SEQ, 2), (carried.SEQ + 16, 3))}
    print(f"{served.model} {served.precision}: max abs score change from garbage in padded positions: {changes}")
    assert all(change == 0.0 for change in changes.values())


def with_value(inputs: dict[str, np.ndarray], name: str, index: tuple[int, int], value: int) -> dict[str, np.ndarray]:
    out = {k: v.copy() for k, v in inputs.items()}
    out[name][index] = value
    return out


def bad_inputs(inputs: dict[str, np.ndarray], config) -> dict[str, tuple[dict[str, np.ndarray], str]]:
    """Each bad request, by name -> (its inputs, the message TensorFlow must answer with). Pool row 32 has all 32
    positions real, so (32, 1) is a real position and (32, 0) is followed by real ones."""
    real = (32, 1)
    rows, seq = inputs["input_ids"].shape
    longer = {name: np.zeros((rows, config.max_position_embeddings + 1), np.int32) for name in inputs}
    return {
        "id >= vocab": (with_value(inputs, "input_ids", real, config.vocab_size),
                        rf"input_ids\[32,1\] = {config.vocab_size} is out of range \[0, {config.vocab_size}\)"),
        "negative id": (with_value(inputs, "input_ids", real, -1), r"input_ids\[32,1\] = -1 is out of range"),
        "segment >= type_vocab": (with_value(inputs, "segment_ids", real, config.type_vocab_size),
                                  rf"segment_ids\[32,1\] = {config.type_vocab_size} is out of range"),
        "negative segment": (with_value(inputs, "segment_ids", real, -1), r"segment_ids\[32,1\] = -1 is out of range"),
        "mask with a gap": (with_value(inputs, "input_mask", (32, 0), 0), r"input_mask row 32 has a gap"),
        "mask value 2": (with_value(inputs, "input_mask", real, 2), r"input_mask\[32,1\] = 2 .*must be 0 or 1"),
        "mask shorter than ids": ({**inputs, "input_mask": inputs["input_mask"][:, :seq - 1]},
                                  r"input_mask misshapen"),
        "segments of fewer rows": ({**inputs, "segment_ids": inputs["segment_ids"][:rows - 1]},
                                   r"segment_ids misshapen"),
        "longer than max positions": (longer, r"sequence length \d+ exceeds the max positions"),
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_input_answers_invalid_argument_naming_it(tf_served, tf_pool, variant):
    served = tf_served(*variant)
    inputs = carried.take(tf_pool, ROWS)
    assert inputs["input_mask"][32].sum() == carried.SEQ
    expected = served.scores(inputs)
    answers = {}
    for name, (bad, message) in bad_inputs(inputs, served.config).items():
        with pytest.raises(tf.errors.InvalidArgumentError, match=message) as raised:
            served.scores(bad)
        answers[name] = op_message(raised.value)[:160]
    for name, answer in answers.items():
        print(f"{served.model} {served.precision} {name}: InvalidArgument: {answer}")
    after = served.scores(inputs)
    print(f"{served.model} {served.precision}: scores after the bad requests differ by {max_abs(after, expected)}")
    assert np.array_equal(after, expected)
