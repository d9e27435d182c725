"""Models written by `bertserve.export` (stock and, when the op library is built, fused) serve through the server."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest
import tensorflow as tf

from bertserve import custom_ops
from bertserve.export.graph import build_ranker_module
from bertserve.export.saved import warmup_inputs, write_version
from bertserve.export.weights import BertConfig, BertWeights
from bertserve.loadtest.server_process import write_model_config
from bertserve.model_dir import TokenizerSettings
from tiny_models import predict_request, tensor

CONFIG = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=40)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[str, list[str]]:
    base = str(tmp_path_factory.mktemp("exported"))
    vocab = os.path.join(base, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as handle:
        handle.writelines(f"tok{i}\n" for i in range(CONFIG.vocab_size))
    weights = BertWeights.random(CONFIG, seed=2)
    variants = ["stock"] + (["fused"] if custom_ops.library_loads() else [])
    for variant in variants:
        write_version(build_ranker_module(weights, variant=variant), CONFIG, base, variant, 1,
                      TokenizerSettings(vocab, True, 16))
    return base, variants


def _config_file(tmp_path, base: str, variants: list[str]) -> str:
    path = write_model_config(str(tmp_path / "models.config"), {v: f"{base}/{v}" for v in variants})
    return f"--model_config_file={path}"


def test_exported_versions_serve_equal_to_direct_calls(exported, tmp_path, start_server):
    base, variants = exported
    server = start_server(_config_file(tmp_path, base, variants), "--enable_batching")
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


def test_missing_op_library_fails_only_the_fused_model(exported, tmp_path, start_server):
    """Without the op library stock models serve; a fused one cannot load, so a server configured with it exits
    at start (as tensorflow_model_server does when a model fails to load), naming the load error."""
    base, variants = exported
    env = {"BERTSERVE_OPS_LIBRARY": str(tmp_path / "missing" / "_bert_ops.so")}
    server = start_server(_config_file(tmp_path, base, ["stock"]), env=env)
    assert "fused ops not loaded" in server.log()
    inputs = warmup_inputs(CONFIG, 2, 16)
    assert server.predict.Predict(predict_request("stock", inputs), timeout=60).outputs["scores"].tensor_shape.dim
    if "fused" not in variants:
        pytest.skip("op library not built: no fused export to load")
    with_fused = start_server(_config_file(tmp_path, base, variants), "--max_num_load_retries=0", env=env,
                              ready=False)
    assert with_fused.proc.wait(180) == 1
    assert "Loading servable {name: fused version: 1} failed" in with_fused.log()
