"""`bertserve export` end to end: each source format to a validated version in one command, and its errors."""

from __future__ import annotations

import os
import shutil

import pytest

from bertserve.export import cli, validate

from export_testing import TINY_CONFIG, needs_fused_ops


def export(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err



def test_google_checkpoint_to_stock_version_with_onnx(capsys, tmp_path, google_dir):
    code, out, err = export(capsys, google_dir, str(tmp_path), "--model", "ranker", "--version", "2",
                            "--variant", "stock", "--precision", "fp32", "--onnx", "--validate",
                            "--max_seq_length", "24")
    assert code == 0, err
    assert f"wrote {tmp_path / 'ranker' / '2'}" in out
    assert f"wrote {tmp_path / 'ranker' / 'onnx' / '2' / 'model.onnx'}" in out
    table = out[out.index("target"):].splitlines()
    assert table[1].startswith("saved_model (stock)") and table[1].endswith("ok")
    assert table[2].startswith("onnx (stock)") and table[2].endswith("ok")
    assert "export: 100%" in err  # the progress bar


@needs_fused_ops
def test_training_directory_to_fused_fp16_in_one_command(capsys, tmp_path, tiny_weights, tiny_vocab):
    import numpy as np

    from bertserve.train import training

    mask = np.ones((8, 6), np.int32)
    train = {"input_ids": np.arange(48, dtype=np.int32).reshape(8, 6) + 5, "input_mask": mask,
             "segment_ids": np.zeros_like(mask), "labels": np.arange(8, dtype=np.int32) % 2}
    run = training.train_ranker(tiny_weights, train, out_dir=str(tmp_path / "run"), steps=2, batch_size=4,
                                progress=False, vocab_file=tiny_vocab, do_lower_case=False)
    code, out, err = export(capsys, run, str(tmp_path / "models"), "--model", "ranker", "--version", "1",
                            "--variant", "fused", "--precision", "fp16", "--validate")
    assert code == 0, err
    assert "saved_model (fused)          fp16" in out
    with open(tmp_path / "models" / "ranker" / "1" / "assets.extra" / "bertserve_tokenizer.json") as f:
        assert '"do_lower_case": false' in f.read()


def test_bert_model_without_head_needs_an_explicit_seed(capsys, tmp_path, tiny_vocab):
    import transformers

    c = TINY_CONFIG
    encoder = transformers.BertModel(transformers.BertConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings))
    encoder.save_pretrained(tmp_path / "encoder")
    shutil.copy(tiny_vocab, tmp_path / "encoder" / "vocab.txt")
    args = [str(tmp_path / "encoder"), str(tmp_path / "models"), "--model", "m", "--version", "1",
            "--variant", "stock"]
    code, _, err = export(capsys, *args)
    assert code == 2 and "missing variable classifier.weight (BertModel without a classification head)" in err
    code, out, err = export(capsys, *args, "--init_classifier_seed", "3", "--validate")
    assert code == 0, err
    assert "1 label(s)" in out


def test_errors_are_reported_not_raised(capsys, tmp_path, google_dir, monkeypatch):
    code, _, err = export(capsys, str(tmp_path / "nowhere"), str(tmp_path), "--model", "m", "--version", "1")
    assert code == 2 and "no vocabulary" in err
    code, _, err = export(capsys, google_dir, str(tmp_path), "--model", "m", "--version", "1",
                          "--vocab", os.path.join(google_dir, "vocab.txt"), "--variant", "stock",
                          "--max_seq_length", "64")
    assert code == 2 and "max_seq_length 64 exceeds the model's max_position_embeddings 40" in err
    monkeypatch.setitem(validate.TOLERANCES, "fp32", 0.0)
    code, out, err = export(capsys, google_dir, str(tmp_path), "--model", "m", "--version", "1",
                            "--variant", "stock", "--validate")
    assert code == 1 and "validation FAILED" in err and "differs from the reference by" in err


def test_example_fine_tunes_minilm_and_exports_it(capsys, tmp_path):
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "finetune_minilm_ranker.py")
    spec = importlib.util.spec_from_file_location("finetune_minilm_ranker", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--max_seconds", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'models' / 'chitchat' / '1'}" in out and "saved_model (stock)" in out
    assert os.path.isfile(tmp_path / "train" / "vocab.txt")
