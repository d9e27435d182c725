"""SavedModel layout: TF Serving's version folders, warmup records, tokenizer assets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from bertserve.export import graph, saved, validate
from bertserve.model_dir import TokenizerSettings
from bertserve.server.config_files import read_batching_options

from export_testing import TINY_CONFIG, VARIANTS

SHIPPED_BATCHING = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "serving_config", "batching_parameters.txt")


def tokenizer(vocab: str, max_seq_length: int = 16) -> TokenizerSettings:
    return TokenizerSettings(vocab_file=vocab, do_lower_case=False, max_seq_length=max_seq_length)


@pytest.fixture(scope="module")
def stock_version(tmp_path_factory, tiny_weights, tiny_vocab) -> str:
    base = tmp_path_factory.mktemp("models")
    module = graph.build_ranker_module(tiny_weights, "stock", "fp32")
    return saved.write_version(module, tiny_weights.config, str(base), "tiny", 3, tokenizer(tiny_vocab))


def test_layout_and_tokenizer_json(stock_version, tiny_vocab):
    assert stock_version.endswith(os.path.join("tiny", "3"))
    assert sorted(os.listdir(os.path.dirname(stock_version))) == ["3"], "no staging folder is left behind"
    extra = os.path.join(stock_version, "assets.extra")
    assert os.path.isfile(os.path.join(stock_version, "saved_model.pb"))
    assert sorted(os.listdir(extra)) == ["bertserve_tokenizer.json", "tf_serving_warmup_requests", "vocab.txt"]
    with open(os.path.join(extra, "bertserve_tokenizer.json")) as f:
        assert json.load(f) == {"vocab_file": "vocab.txt", "do_lower_case": False, "max_seq_length": 16,
                                "tokenize_chinese_chars": True, "vocab_size": TINY_CONFIG.vocab_size}
    with open(os.path.join(extra, "vocab.txt")) as copy, open(tiny_vocab) as original:
        assert copy.read() == original.read()


def test_warmup_records_parse_as_prediction_logs_and_run(stock_version):
    path = os.path.join(stock_version, "assets.extra", "tf_serving_warmup_requests")
    logs = [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    assert [log.WhichOneof("log_type") for log in logs] == ["predict_log"] * len(saved.WARMUP_BATCH_SIZES)
    signature = tf.saved_model.load(stock_version).signatures["serving_default"]
    batch_sizes = []
    for log in logs:
        request = log.predict_log.request
        assert (request.model_spec.name, request.model_spec.signature_name) == ("tiny", "serving_default")
        inputs = {name: tf.make_ndarray(request.inputs[name]) for name in ("input_ids", "input_mask", "segment_ids")}
        assert {v.dtype for v in inputs.values()} == {np.dtype(np.int32)}
        assert {v.shape[1] for v in inputs.values()} == {16}
        scores = signature(**{k: tf.constant(v) for k, v in inputs.items()})["scores"].numpy()
        assert ((scores > 0) & (scores < 1)).all()
        batch_sizes.append(inputs["input_ids"].shape[0])
    assert tuple(batch_sizes) == saved.WARMUP_BATCH_SIZES
    assert len(saved.read_warmup_requests(path)) == len(logs)


def test_saved_model_cli_lists_the_signature(stock_version):
    result = subprocess.run([sys.executable, "-m", "tensorflow.python.tools.saved_model_cli", "show", "--all",
                             "--dir", stock_version], capture_output=True, text=True, check=True)
    signature = result.stdout[result.stdout.index("signature_def['serving_default']"):]
    for name in ("inputs['input_ids']", "inputs['input_mask']", "inputs['segment_ids']", "outputs['scores']"):
        assert name in signature
    assert signature.count("dtype: DT_INT32") == 3 and "dtype: DT_FLOAT" in signature


def saved_model_nodes(version_dir: str) -> list:
    """Every NodeDef in the SavedModel's graph and function library."""
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel.FromString(open(os.path.join(version_dir, "saved_model.pb"), "rb").read())
    graph_def = model.meta_graphs[0].graph_def
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_saves_loads_and_validates(tmp_path, tiny_weights, tiny_vocab, variant):
    name, precision = variant
    module = graph.build_ranker_module(tiny_weights, name, precision)
    target = saved.write_version(module, tiny_weights.config, str(tmp_path), "tiny", 1, tokenizer(tiny_vocab))
    (row,) = validate.validate_export(tiny_weights, target, name, precision, seq_length=16)
    assert row.ok and row.rows == validate.SAMPLE_ROWS
    nodes = saved_model_nodes(target)
    custom = {n.op for n in nodes if n.op.startswith("Bert")}
    if name == "stock":  # loadable by an unmodified tensorflow_model_server
        assert not custom
    else:  # the encoder itself returns the [CLS] rows, which BertRankerHead scores
        assert custom == {"BertEmbedding", "BertEncoder", "BertRankerHead"}
        encoders = [n for n in nodes if n.op == "BertEncoder"]
        assert encoders and all(n.attr["first_token_only"].b for n in encoders)
        stock_head = {n.op for n in nodes} & {"MatMul", "Tanh", "Sigmoid", "Softmax"}
        assert not stock_head, f"the fused graph still runs stock head ops: {stock_head}"


def test_version_rules(tmp_path, tiny_weights, tiny_vocab):
    module = graph.build_ranker_module(tiny_weights, "stock", "fp32")
    with pytest.raises(ValueError, match="version must be a positive integer"):
        saved.write_version(module, tiny_weights.config, str(tmp_path), "tiny", 0, tokenizer(tiny_vocab))
    with pytest.raises(ValueError, match="max_seq_length 41 exceeds the model's max_position_embeddings 40"):
        saved.write_version(module, tiny_weights.config, str(tmp_path), "tiny", 1, tokenizer(tiny_vocab, 41))
    big_vocab = tmp_path / "big_vocab.txt"
    big_vocab.write_text("\n".join(f"t{i}" for i in range(TINY_CONFIG.vocab_size + 1)) + "\n")
    with pytest.raises(ValueError, match=r"has 121 entries but the model's word_embeddings has only 120 rows"):
        saved.write_version(module, tiny_weights.config, str(tmp_path), "tiny", 1, tokenizer(str(big_vocab)))
    saved.write_version(module, tiny_weights.config, str(tmp_path), "tiny", 1, tokenizer(tiny_vocab))
    with pytest.raises(FileExistsError, match="already exists"):
        saved.write_version(module, tiny_weights.config, str(tmp_path), "tiny", 1, tokenizer(tiny_vocab))


def test_warmup_covers_every_batch_size_the_shipped_batching_config_runs():
    """The batcher pads a batch to an allowed size; each of those must be warmed up (the GPU op captures a CUDA
    graph on a batch size's first call), and so must a request alone."""
    options = read_batching_options(SHIPPED_BATCHING)
    assert options.allowed_batch_sizes, "the shipped batching config pads to allowed_batch_sizes"
    assert set(options.allowed_batch_sizes) | {1} <= set(saved.WARMUP_BATCH_SIZES)
