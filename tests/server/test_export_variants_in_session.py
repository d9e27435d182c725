"""Every SavedModel variant the export writes (stock and fused, fp32 and fp16) loads into the server's Session
path, replays its own warmup records there and answers what the SavedModel's function answers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from bertserve import custom_ops
from bertserve.export.graph import build_ranker_module
from bertserve.export.saved import warmup_inputs, write_version
from bertserve.export.weights import BertConfig, BertWeights
from bertserve.model_dir import TokenizerSettings
from bertserve.server.servable import LoadedVersion
from bertserve.server.warmup import replay_warmup

CONFIG = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=40)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("variant", ["stock", "fused"])
def test_export_variant_serves_through_the_session(tmp_path, variant, precision):
    if variant == "fused" and not custom_ops.library_loads():
        pytest.skip("op library not built")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(CONFIG.vocab_size)), encoding="utf-8")
    module = build_ranker_module(BertWeights.random(CONFIG, seed=2), variant=variant, precision=precision)
    write_version(module, CONFIG, str(tmp_path), "model", 1, TokenizerSettings(str(vocab), True, 16))
    path = os.path.join(tmp_path, "model", "1")
    version = LoadedVersion("model", 1, path, {"serve"})
    assert replay_warmup(version, 1) > 0
    inputs = warmup_inputs(CONFIG, 3, 16, seed=1)
    signature = version.signature("")
    signature.check_inputs(inputs)
    function = tf.saved_model.load(path).signatures["serving_default"]
    expected = function(**{name: tf.constant(value) for name, value in inputs.items()})["scores"].numpy()
    np.testing.assert_array_equal(signature.run(inputs)["scores"], expected)
    version.release_model()
