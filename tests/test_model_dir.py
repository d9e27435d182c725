"""The model-version folder contract (bertserve.model_dir): what the export writes is what clients read."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bertserve.model_dir import (ASSETS_EXTRA, TOKENIZER_FILE, VOCAB_FILE, TokenizerSettings, tokenizer_path,
                                 warmup_path)


@pytest.fixture
def vocab(tmp_path) -> str:
    path = tmp_path / "source" / "my_vocab.txt"
    path.parent.mkdir()
    path.write_text("[PAD]\n[CLS]\n[SEP]\nhello\n", encoding="utf-8")
    return str(path)


def test_written_settings_read_back_from_every_accepted_path(tmp_path, vocab):
    version = tmp_path / "chitchat" / "1"
    written = TokenizerSettings(vocab_file=vocab, do_lower_case=False, max_seq_length=24)
    written.write(str(version), vocab_size=30)
    extra = version / ASSETS_EXTRA
    assert sorted(os.listdir(extra)) == sorted([TOKENIZER_FILE, VOCAB_FILE])
    assert (extra / VOCAB_FILE).read_text(encoding="utf-8") == open(vocab, encoding="utf-8").read()
    assert json.loads((extra / TOKENIZER_FILE).read_text()) == {
        "vocab_file": VOCAB_FILE, "do_lower_case": False, "max_seq_length": 24, "tokenize_chinese_chars": True,
        "vocab_size": 30}
    expected = TokenizerSettings(vocab_file=str(extra / VOCAB_FILE), do_lower_case=False, max_seq_length=24)
    for path in (version, extra, extra / TOKENIZER_FILE):
        assert TokenizerSettings.from_model_dir(str(path)) == expected
    assert tokenizer_path(str(version)) == str(extra / TOKENIZER_FILE)
    assert os.path.dirname(warmup_path(str(version))) == str(extra)


def test_missing_or_incomplete_settings_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=TOKENIZER_FILE):
        TokenizerSettings.from_model_dir(str(tmp_path))
    (tmp_path / TOKENIZER_FILE).write_text(json.dumps({"do_lower_case": True}))
    with pytest.raises(ValueError, match="missing 'vocab_file'"):
        TokenizerSettings.from_model_dir(str(tmp_path))


def test_the_contract_imports_no_tensorflow():
    """Clients and tools read the folder without TensorFlow."""
    code = "import sys, bertserve.model_dir; sys.exit('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
