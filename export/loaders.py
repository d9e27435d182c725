"""Loaders: every supported training output -> one BertWeights.

Three sources, each mapped name by name onto BertWeights (see `expected_shapes`):

- Google BERT TF checkpoint: bert_config.json + model.ckpt-* with the original variable names
  (bert/embeddings/..., bert/encoder/layer_N/..., bert/pooler/dense/..., run_classifier's output_weights
  [num_labels, hidden] and output_bias). Adam slots, global_step and the pre-training heads (cls/...) are
  training bookkeeping and skipped; any other variable is an error.
- Hugging Face BertForSequenceClassification directory: config.json + model.safetensors (or pytorch_model.bin,
  read without torch by `torch_pickle`). A BertModel directory has no classifier and is refused;
  `load_hf_encoder_as_ranker` is the explicit way to put a seeded classifier on one.
- bertserve training checkpoint (`bertserve.train.training`): bertserve_ranker.json + a tf.train.Checkpoint
  whose variables are `weights/<BertWeights name>`.

Errors name the offending variable: unknown, missing, wrong shape, unsupported activation.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np

from bertserve.export import heads
from bertserve.export.weights import BertConfig, BertWeights, expected_shapes

TRAINING_CONFIG_FILE = "bertserve_ranker.json"
TRAINING_VARIABLE_PREFIX = "weights/"
TRAINING_VARIABLE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"

_LAYER = "{layer}"


@dataclasses.dataclass(frozen=True)
class _Naming:
    """How one source format names each BertWeights array: our name -> (source name, stored transposed)."""

    names: dict[str, tuple[str, bool]]
    ignored: re.Pattern[str]  # source variables that are training bookkeeping, not model weights


# BertWeights name prefix -> module path inside Google's "bert/" scope; HF uses the same path with dots.
_MODULE_PATHS = {
    "word_embeddings": "embeddings/word_embeddings",
    "position_embeddings": "embeddings/position_embeddings",
    "token_type_embeddings": "embeddings/token_type_embeddings",
    "embeddings_ln": "embeddings/LayerNorm",
    **{part: f"encoder/layer_{_LAYER}/attention/self/{part}" for part in ("query", "key", "value")},
    "attention_output": f"encoder/layer_{_LAYER}/attention/output/dense",
    "attention_ln": f"encoder/layer_{_LAYER}/attention/output/LayerNorm",
    "intermediate": f"encoder/layer_{_LAYER}/intermediate/dense",
    "output": f"encoder/layer_{_LAYER}/output/dense",
    "output_ln": f"encoder/layer_{_LAYER}/output/LayerNorm",
    "pooler": "pooler/dense",
}
# BertWeights name suffix -> (Google variable suffix, HF tensor suffix, HF stores it transposed as [out, in]).
_PARAM_SUFFIXES = {"kernel": ("kernel", "weight", True), "bias": ("bias", "bias", False),
                   "gamma": ("gamma", "weight", False), "beta": ("beta", "bias", False)}


def _encoder_naming(style: str) -> dict[str, tuple[str, bool]]:
    """Names of the encoder + pooler arrays in the "google" or "hf" style."""
    names = {}
    for name in expected_shapes(BertConfig(vocab_size=1)):
        module, _, param = name.rpartition("_")
        if name in _MODULE_PATHS:  # an embedding table: no parameter suffix in Google's names
            module, param = name, ""
        if module not in _MODULE_PATHS:
            continue
        google_suffix, hf_suffix, transposed = _PARAM_SUFFIXES.get(param, ("", "weight", False))
        path = f"bert/{_MODULE_PATHS[module]}"
        if style == "google":
            names[name] = (f"{path}/{google_suffix}".rstrip("/"), False)
        else:
            names[name] = (f"{path.replace('layer_', 'layer.').replace('/', '.')}.{hf_suffix}", transposed)
    return names


_GOOGLE = _Naming(
    names={**_encoder_naming("google"),
           "classifier_kernel": ("output_weights", True),  # run_classifier stores it [num_labels, hidden]
           "classifier_bias": ("output_bias", False)},
    ignored=re.compile(r"(.*/adam_[mv]|global_step|cls/.*|.*/Adam(_1)?|beta[12]_power)$"),
)
_HF = _Naming(
    names={**_encoder_naming("hf"),
           "classifier_kernel": ("classifier.weight", True),  # torch Linear stores [out, in]
           "classifier_bias": ("classifier.bias", False)},
    ignored=re.compile(r"bert\.embeddings\.position_ids"),
)

_HEAD = ("classifier_kernel", "classifier_bias")


class WeightsFormatError(ValueError):
    """A checkpoint that cannot become a BertWeights; the message names the variable or field."""


def _source_names(naming: _Naming, name: str, num_layers: int) -> list[str]:
    source, _ = naming.names[name]
    if _LAYER in source:
        return [source.format(layer=i) for i in range(num_layers)]
    return [source]


def _assemble(config: BertConfig, tensors: dict[str, np.ndarray], naming: _Naming, origin: str,
              skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Maps source tensors onto BertWeights arrays, checking every name and shape; `skip` lists arrays not read."""
    arrays: dict[str, np.ndarray] = {}
    used: set[str] = set()
    missing: list[str] = []
    for name, shape in expected_shapes(config).items():
        if name in skip:
            continue
        sources = _source_names(naming, name, config.num_hidden_layers)
        template, transposed = naming.names[name]
        per_layer = _LAYER in template
        per_source_shape = shape[1:] if per_layer else shape
        parts = []
        for source in sources:
            if source not in tensors:
                missing.append(source)
                continue
            value = np.asarray(tensors[source])
            value = value.T if transposed else value
            if tuple(value.shape) != tuple(per_source_shape):
                stored = tuple(value.T.shape) if transposed else tuple(value.shape)
                wanted = tuple(reversed(per_source_shape)) if transposed else tuple(per_source_shape)
                raise WeightsFormatError(f"{origin}: variable {source} has shape {stored}, expected {wanted} "
                                         f"for this config")
            parts.append(value)
            used.add(source)
        if len(parts) == len(sources):
            arrays[name] = np.stack(parts) if per_layer else parts[0]
    skipped = {source for name in skip for source in _source_names(naming, name, config.num_hidden_layers)}
    unknown = sorted(n for n in tensors if n not in used and n not in skipped and not naming.ignored.fullmatch(n))
    if missing:
        raise WeightsFormatError(f"{origin}: missing variables: {', '.join(missing)}")
    if unknown:
        raise WeightsFormatError(f"{origin}: unknown variables (not part of a BERT ranker with "
                                 f"{config.num_hidden_layers} layers): {', '.join(unknown)}")
    return arrays


def _make_config(fields: dict, origin: str, num_labels: int) -> BertConfig:
    """BertConfig from a bert_config.json / config.json; unsupported settings are named, not ignored."""
    if fields.get("position_embedding_type", "absolute") != "absolute":
        raise WeightsFormatError(f"{origin}: position_embedding_type {fields['position_embedding_type']!r} is "
                                 f"not supported (only 'absolute')")
    names = [f.name for f in dataclasses.fields(BertConfig) if f.name != "num_labels"]
    missing = [n for n in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size") if n not in fields]
    if missing:
        raise WeightsFormatError(f"{origin}: config is missing {', '.join(missing)}")
    config = BertConfig(**{n: fields[n] for n in names if n in fields}, num_labels=num_labels)
    try:
        config.validate()
    except ValueError as e:
        raise WeightsFormatError(f"{origin}: {e}") from None
    return config


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------- Google BERT checkpoint

def _google_checkpoint_prefix(path: str) -> str:
    """Accepts a checkpoint directory or a prefix like .../model.ckpt-1000."""
    import tensorflow as tf

    if os.path.isdir(path):
        prefix = tf.train.latest_checkpoint(path)
        if prefix is None:
            candidates = sorted(f[:-len(".index")] for f in os.listdir(path) if f.endswith(".index"))
            if not candidates:
                raise WeightsFormatError(f"{path}: no TensorFlow checkpoint (*.index) in this directory")
            prefix = os.path.join(path, candidates[-1])
        return prefix
    if os.path.exists(path + ".index"):
        return path
    raise WeightsFormatError(f"{path}: not a checkpoint directory or checkpoint prefix")


def load_google_checkpoint(path: str) -> BertWeights:
    """Google BERT (run_classifier) checkpoint: a directory with bert_config.json, or a model.ckpt-N prefix."""
    import tensorflow as tf

    prefix = _google_checkpoint_prefix(path)
    config_path = os.path.join(os.path.dirname(prefix), "bert_config.json")
    if not os.path.exists(config_path):
        raise WeightsFormatError(f"{path}: bert_config.json not found next to the checkpoint")
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    if "output_weights" not in tensors:
        raise WeightsFormatError(f"{prefix}: missing variable output_weights: a ranker checkpoint has "
                                 f"run_classifier's output_weights [num_labels, hidden] and output_bias")
    config = _make_config(_read_json(config_path), config_path, num_labels=int(tensors["output_weights"].shape[0]))
    return BertWeights(config, _assemble(config, tensors, _GOOGLE, prefix))


# ---------------------------------------------------------------- Hugging Face directory

def _read_hf_tensors(path: str) -> dict[str, np.ndarray]:
    """State dict of an HF directory, names normalised to BertForSequenceClassification's (bert.* prefix)."""
    safetensors_path = os.path.join(path, "model.safetensors")
    torch_path = os.path.join(path, "pytorch_model.bin")
    if os.path.exists(safetensors_path):
        from safetensors.numpy import load_file

        tensors = load_file(safetensors_path)
    elif os.path.exists(torch_path):
        from bertserve.export import torch_pickle

        tensors = torch_pickle.load_state_dict(torch_path)
    else:
        raise WeightsFormatError(f"{path}: neither model.safetensors nor pytorch_model.bin found")
    # A BertModel saves its tensors without the "bert." prefix.
    return {n if n.startswith(("bert.", "classifier.")) else f"bert.{n}": np.asarray(v, dtype=np.float32)
            for n, v in tensors.items()}


def _read_hf(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise WeightsFormatError(f"{path}: config.json not found")
    return _read_json(config_path), _read_hf_tensors(path)


def load_hf_directory(path: str) -> BertWeights:
    """Hugging Face BertForSequenceClassification directory (num_labels 1 or 2)."""
    fields, tensors = _read_hf(path)
    origin = os.path.join(path, "config.json")
    if "classifier.weight" not in tensors:
        architectures = ", ".join(fields.get("architectures") or ["unknown architecture"])
        raise WeightsFormatError(
            f"{path}: missing variable classifier.weight ({architectures} without a classification head). "
            f"Export needs a trained BertForSequenceClassification; to serve an untrained head on this encoder "
            f"use bertserve.export.loaders.load_hf_encoder_as_ranker or `bertserve export --init_classifier_seed`")
    config = _make_config(fields, origin, num_labels=int(tensors["classifier.weight"].shape[0]))
    return BertWeights(config, _assemble(config, tensors, _HF, path))


def load_hf_encoder_as_ranker(path: str, seed: int = 0, num_labels: int = 1) -> BertWeights:
    """A BertModel directory (e.g. the sentence-transformers MiniLM) plus a seeded random classifier.

    The classifier is calibrated (see heads.seeded_classifier) so scores spread over 0..1 instead of sitting at
    0.5: what tests and demos need from a ranker that was never fine-tuned. Existing classifier weights are
    ignored.
    """
    fields, tensors = _read_hf(path)
    config = _make_config(fields, os.path.join(path, "config.json"), num_labels=num_labels)
    arrays = _assemble(config, tensors, _HF, path, skip=_HEAD)
    return heads.with_seeded_classifier(config, arrays, seed)


def hf_state_dict(weights: BertWeights) -> dict[str, np.ndarray]:
    """The inverse of load_hf_directory: BertForSequenceClassification tensor names -> arrays in torch layout
    ([out, in] Linear weights), e.g. to build a transformers model from BertWeights."""
    state = {}
    for name, array in weights.items():
        source, transposed = _HF.names[name]
        for layer, value in (enumerate(array) if _LAYER in source else [(None, array)]):
            state[source.format(layer=layer)] = np.ascontiguousarray(value.T if transposed else value)
    return state


# ---------------------------------------------------------------- bertserve training checkpoint

def load_training_checkpoint(path: str) -> BertWeights:
    """Directory written by bertserve.train.training.train_ranker (or a checkpoint prefix inside it)."""
    import tensorflow as tf

    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = os.path.join(directory, TRAINING_CONFIG_FILE)
    if not os.path.exists(config_path):
        raise WeightsFormatError(f"{path}: {TRAINING_CONFIG_FILE} not found (not a bertserve training directory)")
    prefix = tf.train.latest_checkpoint(directory) if os.path.isdir(path) else path
    if prefix is None:
        raise WeightsFormatError(f"{path}: no checkpoint in this training directory")
    fields = _read_json(config_path)
    config = BertConfig(**fields["config"])
    reader = tf.train.load_checkpoint(prefix)
    tensors = {}
    for key in reader.get_variable_to_shape_map():
        if key.startswith(TRAINING_VARIABLE_PREFIX) and key.endswith(TRAINING_VARIABLE_SUFFIX):
            tensors[key[len(TRAINING_VARIABLE_PREFIX):-len(TRAINING_VARIABLE_SUFFIX)]] = reader.get_tensor(key)
    shapes = expected_shapes(config)
    missing = [f"{TRAINING_VARIABLE_PREFIX}{n}" for n in shapes if n not in tensors]
    unknown = [f"{TRAINING_VARIABLE_PREFIX}{n}" for n in tensors if n not in shapes]
    if missing or unknown:
        raise WeightsFormatError(f"{prefix}: " + "; ".join(
            part for part in (f"missing variables: {', '.join(missing)}" if missing else "",
                              f"unknown variables: {', '.join(unknown)}" if unknown else "") if part))
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise WeightsFormatError(f"{prefix}: variable {TRAINING_VARIABLE_PREFIX}{name} has shape "
                                     f"{tuple(tensors[name].shape)}, expected {shape}")
    return BertWeights(config, tensors)


# ---------------------------------------------------------------- detection

def detect_format(path: str) -> str:
    """'training' | 'hf' | 'google', from the files present; raises naming what was looked for."""
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    if os.path.exists(os.path.join(directory, TRAINING_CONFIG_FILE)):
        return "training"
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        return "hf"
    if os.path.exists(os.path.join(directory, "bert_config.json")):
        return "google"
    raise WeightsFormatError(f"{path}: unrecognised model format: expected {TRAINING_CONFIG_FILE} (bertserve "
                             f"training), config.json + model.safetensors (Hugging Face) or bert_config.json + "
                             f"model.ckpt-* (Google BERT)")


LOADERS = {
    "training": load_training_checkpoint,
    "hf": load_hf_directory,
    "google": load_google_checkpoint,
}


def load_any(path: str) -> BertWeights:
    """Loads whichever supported format `path` holds."""
    return LOADERS[detect_format(path)](path)
