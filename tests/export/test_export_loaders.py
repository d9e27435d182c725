"""Loaders: every source format round-trips to the same BertWeights; bad checkpoints are refused by name."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

from bertserve.export import loaders, torch_pickle
from bertserve.export.weights import BertWeights, expected_shapes

from export_testing import TINY_CONFIG, google_bert_config, google_variables, write_google_checkpoint


def assert_same_weights(a: BertWeights, b: BertWeights) -> None:
    assert a.config == b.config
    for name in expected_shapes(a.config):
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_google_checkpoint_round_trip_skips_training_bookkeeping(tmp_path, tiny_weights):
    variables = google_variables(tiny_weights)
    variables["bert/embeddings/word_embeddings/adam_m"] = np.zeros_like(tiny_weights["word_embeddings"])
    variables["global_step"] = np.array(1000, np.int64)
    prefix = write_google_checkpoint(str(tmp_path / "ckpt"), variables, google_bert_config())
    assert_same_weights(loaders.load_google_checkpoint(str(tmp_path / "ckpt")), tiny_weights)
    assert_same_weights(loaders.load_google_checkpoint(prefix), tiny_weights)
    assert loaders.detect_format(str(tmp_path / "ckpt")) == "google"
    assert_same_weights(loaders.load_any(str(tmp_path / "ckpt")), tiny_weights)


@pytest.mark.parametrize("change, expected", [
    ("drop", "missing variables: bert/encoder/layer_1/output/LayerNorm/beta"),
    ("extra", "unknown variables (not part of a BERT ranker with 2 layers): bert/encoder/layer_2/output/dense/bias"),
    ("shape", "variable bert/encoder/layer_0/intermediate/dense/kernel has shape (64, 32), expected (32, 64)"),
    ("no_head", "missing variable output_weights"),
])
def test_google_checkpoint_errors_name_the_variable(tmp_path, tiny_weights, change, expected):
    variables = google_variables(tiny_weights)
    if change == "drop":
        del variables["bert/encoder/layer_1/output/LayerNorm/beta"]
    elif change == "extra":
        variables["bert/encoder/layer_2/output/dense/bias"] = np.zeros(32, np.float32)
    elif change == "shape":
        name = "bert/encoder/layer_0/intermediate/dense/kernel"
        variables[name] = np.ascontiguousarray(variables[name].T)
    else:
        del variables["output_weights"], variables["output_bias"]
    write_google_checkpoint(str(tmp_path), variables, google_bert_config())
    with pytest.raises(loaders.WeightsFormatError) as error:
        loaders.load_google_checkpoint(str(tmp_path))
    assert expected in str(error.value)


def test_google_checkpoint_unsupported_activation_is_named(tmp_path, tiny_weights):
    write_google_checkpoint(str(tmp_path), google_variables(tiny_weights), google_bert_config(hidden_act="relu"))
    with pytest.raises(loaders.WeightsFormatError, match=r"hidden_act 'relu' is not supported"):
        loaders.load_google_checkpoint(str(tmp_path))


def tiny_hf_model(num_labels: int, **config_overrides):
    import torch
    import transformers

    torch.manual_seed(0)
    c = TINY_CONFIG
    config = transformers.BertConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings, type_vocab_size=c.type_vocab_size,
        num_labels=num_labels, **config_overrides)
    return transformers.BertForSequenceClassification(config).eval()


@pytest.mark.parametrize("num_labels", [1, 2])
def test_hf_safetensors_and_pytorch_bin_give_the_same_weights(tmp_path, num_labels):
    import torch

    model = tiny_hf_model(num_labels)
    model.save_pretrained(tmp_path / "st")
    (tmp_path / "bin").mkdir()
    model.config.to_json_file(tmp_path / "bin" / "config.json")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    from_safetensors = loaders.load_hf_directory(str(tmp_path / "st"))
    assert from_safetensors.config.num_labels == num_labels
    assert_same_weights(from_safetensors, loaders.load_hf_directory(str(tmp_path / "bin")))
    state = model.state_dict()
    np.testing.assert_array_equal(from_safetensors["query_kernel"][1],
                                  state["bert.encoder.layer.1.attention.self.query.weight"].numpy().T)
    np.testing.assert_array_equal(from_safetensors["classifier_kernel"], state["classifier.weight"].numpy().T)


def test_hf_state_dict_is_what_transformers_loads(tmp_path, tiny_weights):
    import torch

    model = tiny_hf_model(1)
    state = loaders.hf_state_dict(tiny_weights)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    assert not unexpected and all("position_ids" in name for name in missing)
    model.save_pretrained(tmp_path)
    assert_same_weights(loaders.load_hf_directory(str(tmp_path)), tiny_weights)


def test_hf_refuses_a_bert_model_without_classifier(minilm_dir):
    with pytest.raises(loaders.WeightsFormatError, match=r"missing variable classifier\.weight \(BertModel"):
        loaders.load_hf_directory(minilm_dir)


def test_hf_unsupported_activation_is_named(tmp_path):
    tiny_hf_model(1, hidden_act="gelu_new").save_pretrained(tmp_path)
    with pytest.raises(loaders.WeightsFormatError, match=r"hidden_act 'gelu_new' is not supported"):
        loaders.load_hf_directory(str(tmp_path))


def test_hf_shape_mismatch_names_the_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file

    tiny_hf_model(1).save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["bert.pooler.dense.bias"] = np.zeros(7, np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(loaders.WeightsFormatError, match=r"variable bert\.pooler\.dense\.bias has shape \(7,\)"):
        loaders.load_hf_directory(str(tmp_path))


def test_seeded_classifier_spreads_scores_and_is_deterministic(minilm_dir, minilm_weights):
    from bertserve.export import reference
    from bertserve.export.samples import mixed_length_inputs

    again = loaders.load_hf_encoder_as_ranker(minilm_dir, seed=0)
    np.testing.assert_array_equal(again["classifier_kernel"], minilm_weights["classifier_kernel"])
    other = loaders.load_hf_encoder_as_ranker(minilm_dir, seed=1)
    assert not np.array_equal(other["classifier_kernel"], minilm_weights["classifier_kernel"])
    scores = reference.scores(minilm_weights, **mixed_length_inputs(minilm_weights.config, 16, 32, seed=123))
    assert scores.min() < 0.25 and scores.max() > 0.75, scores


def test_training_checkpoint_round_trip_and_errors(tmp_path, tiny_weights):
    from bertserve.train import training

    rng = np.random.default_rng(0)
    mask = (np.arange(10)[None, :] < rng.integers(3, 11, size=(24, 1))).astype(np.int32)
    train = {"input_ids": rng.integers(5, 120, size=(24, 10)).astype(np.int32) * mask, "input_mask": mask,
             "segment_ids": np.zeros((24, 10), np.int32), "labels": rng.integers(0, 2, size=24).astype(np.int32)}
    out = training.train_ranker(tiny_weights, train, out_dir=str(tmp_path / "run"), steps=3, batch_size=8,
                                learning_rate=1e-3, progress=False)
    assert loaders.detect_format(out) == "training"
    trained = loaders.load_any(out)
    assert trained.config == tiny_weights.config
    assert not np.array_equal(trained["classifier_kernel"], tiny_weights["classifier_kernel"])
    assert json.load(open(os.path.join(out, loaders.TRAINING_CONFIG_FILE)))["step"] == 3

    with pytest.raises(ValueError, match=r"labels: expected 24 values in \{0, 1\}"):
        training.train_ranker(tiny_weights, {**train, "labels": train["labels"] + 1}, out_dir=str(tmp_path / "x"),
                              steps=1, progress=False)
    config_path = os.path.join(out, loaders.TRAINING_CONFIG_FILE)
    fields = json.load(open(config_path))
    fields["config"]["num_hidden_layers"] = 3
    json.dump(fields, open(config_path, "w"))
    with pytest.raises(loaders.WeightsFormatError, match=r"variable weights/query_kernel has shape \(2, 32, 32\)"):
        loaders.load_training_checkpoint(out)
    fields["config"] = dataclasses.asdict(TINY_CONFIG)
    json.dump(fields, open(config_path, "w"))
    assert_same_weights(loaders.load_training_checkpoint(out), trained)


def test_unrecognised_source_is_explained(tmp_path):
    with pytest.raises(loaders.WeightsFormatError, match=r"unrecognised model format"):
        loaders.load_any(str(tmp_path))


def test_torch_pickle_refuses_code(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(os.system))
    with pytest.raises(pickle.UnpicklingError, match=r"refers to (posix|os)\.system"):
        torch_pickle.load_state_dict(str(path))
