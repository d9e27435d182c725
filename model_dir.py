"""The model-version folder: the one contract between export (writer), server and client (readers).

    <base>/<model>/<version>/saved_model.pb, variables/
        signature SIGNATURE_NAME: INPUT_NAMES, int32 [batch, seq] -> OUTPUT_NAME, float32 [batch]
    <version>/assets.extra/tf_serving_warmup_requests    WARMUP_FILE: TFRecord of PredictionLog (TF Serving's)
    <version>/assets.extra/vocab.txt                     VOCAB_FILE: the WordPiece vocabulary of training
    <version>/assets.extra/bertserve_tokenizer.json      TOKENIZER_FILE: TokenizerSettings.to_json
        {"vocab_file": "vocab.txt", "do_lower_case": bool, "max_seq_length": int,
         "tokenize_chinese_chars": bool, "vocab_size": int}   (vocab_size: rows of the word embedding table)

TensorFlow-free on purpose: the client library reads it without importing TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

SIGNATURE_NAME = "serving_default"
INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")
OUTPUT_NAME = "scores"

ASSETS_EXTRA = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "bertserve_tokenizer.json"

# The pair length the chit-chat ranker is trained and served with: [CLS] query [SEP] reply [SEP] in 32 tokens.
DEFAULT_MAX_LEN = 32


def assets_extra(version_dir: str) -> str:
    return os.path.join(version_dir, ASSETS_EXTRA)


def warmup_path(version_dir: str) -> str:
    return os.path.join(version_dir, ASSETS_EXTRA, WARMUP_FILE)


def tokenizer_path(version_dir: str) -> str:
    return os.path.join(version_dir, ASSETS_EXTRA, TOKENIZER_FILE)


@dataclasses.dataclass(frozen=True)
class TokenizerSettings:
    """How clients must tokenize for a model: what the export writes and clients read, so a client cannot silently
    tokenize differently from training. vocab_file is a path (resolved against the JSON's folder when read)."""

    vocab_file: str
    do_lower_case: bool = True
    max_seq_length: int = DEFAULT_MAX_LEN
    tokenize_chinese_chars: bool = True

    def to_json(self, vocab_size: int) -> dict:
        """The JSON as written next to the copied vocabulary (vocab_file then names that copy)."""
        return {"vocab_file": VOCAB_FILE, "do_lower_case": self.do_lower_case, "max_seq_length": self.max_seq_length,
                "tokenize_chinese_chars": self.tokenize_chinese_chars, "vocab_size": vocab_size}

    def write(self, version_dir: str, vocab_size: int) -> None:
        """Copies the vocabulary into version_dir/assets.extra/ and writes the settings beside it."""
        extra = assets_extra(version_dir)
        os.makedirs(extra, exist_ok=True)
        shutil.copyfile(self.vocab_file, os.path.join(extra, VOCAB_FILE))
        with open(os.path.join(extra, TOKENIZER_FILE), "w", encoding="utf-8") as f:
            json.dump(self.to_json(vocab_size), f, indent=2)

    @classmethod
    def from_json(cls, path: str) -> "TokenizerSettings":
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if "vocab_file" not in raw:
            raise ValueError(f"{path}: missing 'vocab_file'")
        vocab = raw["vocab_file"]
        if not os.path.isabs(vocab):
            vocab = os.path.join(os.path.dirname(os.path.abspath(path)), vocab)
        return cls(vocab_file=vocab, do_lower_case=bool(raw.get("do_lower_case", True)),
                   max_seq_length=int(raw.get("max_seq_length", DEFAULT_MAX_LEN)),
                   tokenize_chinese_chars=bool(raw.get("tokenize_chinese_chars", True)))

    @classmethod
    def from_model_dir(cls, path: str) -> "TokenizerSettings":
        """Accepts a model version dir (<base>/<model>/<version>), its assets.extra/, or the JSON file itself."""
        candidates = [path, os.path.join(path, TOKENIZER_FILE), tokenizer_path(path)]
        for candidate in candidates:
            if os.path.isfile(candidate):
                return cls.from_json(candidate)
        raise FileNotFoundError(f"no {TOKENIZER_FILE} under {path} (looked in: {', '.join(candidates[1:])})")
