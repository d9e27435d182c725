"""The TensorFlow side of the serving contract: the signature's input specs, built from model_dir's names."""

from __future__ import annotations

import tensorflow as tf

from bertserve.model_dir import INPUT_NAMES

INPUT_SIGNATURE = [tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES]
