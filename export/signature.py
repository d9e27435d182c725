"""The serving contract every exported variant shares (see DESIGN.md): names and types of inputs and outputs."""

from __future__ import annotations

import tensorflow as tf

SIGNATURE_NAME = "serving_default"
INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")
OUTPUT_NAME = "scores"
INPUT_SIGNATURE = [tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES]
