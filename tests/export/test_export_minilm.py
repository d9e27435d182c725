"""Real weights: the packaged MiniLM-L6-H384 as a BertForSequenceClassification (seeded classifier, saved with
transformers), exported as every variant and compared with Hugging Face transformers on PyTorch CPU."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from bertserve.export import graph, loaders, saved, validate
from bertserve.model_dir import TokenizerSettings

from export_testing import VARIANTS, needs_fused_ops

SEQ = 32
HF_TOLERANCE = {"fp32": 1e-4, "fp16": 5e-3}
PAIRS = [
    ("hi there", "Hi! Nice to hear from you. How's your day going?"),
    ("hi there", "The train leaves from platform four."),
    ("I can't decide what to cook tonight", "How about a quick vegetable stir fry with rice?"),
    ("It's pouring rain and I forgot my umbrella", "Oh no, maybe wait under a shop awning until it eases off."),
    ("good morning", "Good morning! Did you sleep well?"),
    ("what should I watch this weekend", "A short mystery series is perfect for a weekend binge, and there are "
                                         "plenty of great ones to choose from if you like twists."),
    ("ok", "ok"),
    ("my ankle hurts after running", "Put some ice on your ankle and rest it for a day or two."),
]


@pytest.fixture(scope="module")
def hf_ranker(tmp_path_factory, minilm_dir, minilm_weights):
    """(directory, torch model): MiniLM + our seeded classifier as a transformers BertForSequenceClassification."""
    import torch
    import transformers

    model = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=1).eval()
    with torch.no_grad():
        model.classifier.weight.copy_(torch.from_numpy(minilm_weights["classifier_kernel"].T))
        model.classifier.bias.copy_(torch.from_numpy(minilm_weights["classifier_bias"]))
    directory = tmp_path_factory.mktemp("minilm_ranker")
    model.save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(os.path.join(minilm_dir, name), directory / name)
    return str(directory), model


@pytest.fixture(scope="module")
def pair_inputs(minilm_dir) -> dict[str, np.ndarray]:
    """Real text pairs tokenized as [CLS] query [SEP] reply [SEP] and padded to SEQ."""
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(os.path.join(minilm_dir, "vocab.txt"), lowercase=True)
    tokenizer.enable_truncation(SEQ)
    tokenizer.enable_padding(length=SEQ)
    encoded = tokenizer.encode_batch(PAIRS)
    inputs = {"input_ids": [e.ids for e in encoded], "input_mask": [e.attention_mask for e in encoded],
              "segment_ids": [e.type_ids for e in encoded]}
    return {k: np.asarray(v, np.int32) for k, v in inputs.items()}


@pytest.fixture(scope="module")
def hf_scores(hf_ranker, pair_inputs) -> np.ndarray:
    import torch

    _, model = hf_ranker
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(pair_inputs["input_ids"]).long(),
                       attention_mask=torch.from_numpy(pair_inputs["input_mask"]).long(),
                       token_type_ids=torch.from_numpy(pair_inputs["segment_ids"]).long()).logits
    return torch.sigmoid(logits[:, 0]).numpy()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, hf_ranker):
    """(variant, precision) -> version dir, exported from the transformers directory on first use."""
    base = tmp_path_factory.mktemp("minilm_models")
    directory, _ = hf_ranker
    weights = loaders.load_any(directory)
    tokenizer = TokenizerSettings(os.path.join(directory, "vocab.txt"), True, SEQ)
    cache: dict[tuple[str, str], str] = {}

    def get(variant: str, precision: str) -> str:
        if (variant, precision) not in cache:
            module = graph.build_ranker_module(weights, variant, precision)
            version = len(cache) + 1
            cache[(variant, precision)] = saved.write_version(module, weights.config, str(base),
                                                              f"minilm_{variant}_{precision}", version, tokenizer)
        return cache[(variant, precision)]

    return get


def test_transformers_directory_loads_to_the_same_weights(hf_ranker, minilm_weights):
    weights = loaders.load_hf_directory(hf_ranker[0])
    assert weights.config == minilm_weights.config
    for name, value in minilm_weights.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)


def test_scores_spread_over_zero_to_one(hf_scores):
    assert hf_scores.min() < 0.3 and hf_scores.max() > 0.7, hf_scores


@pytest.mark.parametrize("variant", VARIANTS)
def test_exported_scores_match_transformers(exported, pair_inputs, hf_scores, variant):
    version_dir = exported(*variant)
    scores = validate.saved_model_scores(version_dir, pair_inputs, variant[0])
    diff = float(np.max(np.abs(scores - hf_scores)))
    print(f"\n{variant[0]} {variant[1]}: max |score - transformers| = {diff:.2e}")
    assert diff <= HF_TOLERANCE[variant[1]]


@pytest.mark.parametrize("variant", VARIANTS)
def test_exported_scores_match_reference(exported, hf_ranker, variant):
    weights = loaders.load_hf_directory(hf_ranker[0])
    (row,) = validate.validate_export(weights, exported(*variant), variant[0], variant[1], seq_length=SEQ)
    print(f"\n{variant[0]} {variant[1]}: max |score - reference| = {row.max_abs_diff:.2e}")
    assert row.ok


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.values[0][1] == "fp16"])
def test_fp16_version_is_half_the_size(exported, variant):
    name = variant[0]
    variables = {p: saved.directory_size(os.path.join(exported(name, p), "variables")) for p in ("fp32", "fp16")}
    ratio = variables["fp16"] / variables["fp32"]
    print(f"\n{name}: variables fp32 {variables['fp32'] / 2**20:.1f} MiB, fp16 {variables['fp16'] / 2**20:.1f} MiB")
    assert 0.49 <= ratio <= 0.52, ratio


@needs_fused_ops
def test_padding_free_fused_and_masked_stock_agree(exported, pair_inputs):
    fused = validate.saved_model_scores(exported("fused", "fp32"), pair_inputs, "fused")
    stock = validate.saved_model_scores(exported("stock", "fp32"), pair_inputs, "stock")
    assert np.max(np.abs(fused - stock)) <= 1e-5
