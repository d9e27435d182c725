"""Fine-tuning learns: a tiny ranker trained with train_ranker generalises to held-out rows, and what the
exported SavedModel serves is what was trained."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.export import graph, loaders, reference
from bertserve.export.weights import BertConfig, BertWeights
from bertserve.train import training

TINY_CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=40, type_vocab_size=2)


@pytest.fixture
def tiny_weights() -> BertWeights:
    return BertWeights.random(TINY_CONFIG, seed=1, scale=0.2)


def test_fine_tuning_learns_a_rule_that_holds_out(tmp_path, tiny_weights):
    rng = np.random.default_rng(0)
    rows, seq = 256, 10
    mask = (np.arange(seq)[None, :] < rng.integers(3, seq + 1, size=(rows, 1))).astype(np.int32)
    data = {"input_ids": rng.integers(5, TINY_CONFIG.vocab_size, size=(rows, seq)).astype(np.int32) * mask,
            "input_mask": mask, "segment_ids": np.zeros_like(mask),
            "labels": (mask.sum(axis=1) > 6).astype(np.int32)}  # the label is a property of the pair's length
    train = {k: v[:192] for k, v in data.items()}
    held_out = {k: v[192:] for k, v in data.items()}
    out = training.train_ranker(tiny_weights, train, out_dir=str(tmp_path), steps=60, batch_size=32,
                                learning_rate=1e-3, seed=0, progress=False)
    trained = loaders.load_training_checkpoint(out)
    inputs = {k: held_out[k] for k in ("input_ids", "input_mask", "segment_ids")}

    def accuracy(weights) -> float:
        return float(((reference.scores(weights, **inputs) > 0.5) == held_out["labels"]).mean())

    assert accuracy(tiny_weights) < 0.6
    assert accuracy(trained) >= 0.9
    served = graph.build_ranker_module(trained, "stock", "fp32").serving_default(**inputs)["scores"].numpy()
    assert np.max(np.abs(served - reference.scores(trained, **inputs))) <= 1e-5
