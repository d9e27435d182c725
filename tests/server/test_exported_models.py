"""Models written by `bertserve.export` (stock and, when the op library is built, fused) serve through the server."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest
import tensorflow as tf

from bertserve.export.graph import build_ranker_module
from bertserve.export.saved import TokenizerSettings, warmup_inputs, write_version
from bertserve.export.weights import BertConfig, BertWeights
from tiny_models import predict_request, tensor

CONFIG = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=40)


def _fused_available() -> bool:
    try:
        from bertserve import custom_ops
        custom_ops.load_op_library()
        return True
    except (ImportError, OSError, tf.errors.OpError):
        return False


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[str, list[str]]:
    base = str(tmp_path_factory.mktemp("exported"))
    vocab = os.path.join(base, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as handle:
        handle.writelines(f"tok{i}\n" for i in range(CONFIG.vocab_size))
    weights = BertWeights.random(CONFIG, seed=2)
    variants = ["stock"] + (["fused"] if _fused_available() else [])
    for variant in variants:
        write_version(build_ranker_module(weights, variant=variant), CONFIG, base, variant, 1,
                      TokenizerSettings(vocab, True, 16))
    return base, variants


def test_exported_versions_serve_equal_to_direct_calls(exported, tmp_path, start_server):
    base, variants = exported
    config = "model_config_list {" + "".join(
        f' config {{ name: "{v}" base_path: "{base}/{v}" }}' for v in variants) + " }"
    (tmp_path / "models.config").write_text(config)
    server = start_server(f"--model_config_file={tmp_path / 'models.config'}", "--enable_batching")
    inputs = warmup_inputs(CONFIG, 6, 16, seed=9)
    for variant in variants:
        reply = server.predict.Predict(predict_request(variant, inputs), timeout=60)
        loaded = tf.saved_model.load(os.path.join(base, variant, "1"))
        direct = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})["scores"]
        np.testing.assert_allclose(tensor(reply.outputs["scores"]), direct.numpy(), rtol=0, atol=1e-5)
        # The vocabulary size comes from the export's assets.extra/bertserve_tokenizer.json.
        bad = dict(inputs, input_ids=np.where(inputs["input_mask"] == 1, CONFIG.vocab_size, 0).astype(np.int32))
        with pytest.raises(grpc.RpcError) as info:
            server.predict.Predict(predict_request(variant, bad), timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "out of range [0, 50)" in info.value.details()
    if "fused" not in variants:
        pytest.skip("op library not built: only the stock export was served")
