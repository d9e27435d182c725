"""Writes one TF Serving model version: <base>/<model>/<version>/ = SavedModel + assets.extra/.

The folder's layout, file names and tokenizer JSON are the contract in bertserve/model_dir.py. The warmup file holds
PredictionLog(predict_log.request) records for a few batch sizes at max_seq_length, so TF Serving runs every shape
once at load time and the first real request is not slow; or, given the served allowed_batch_sizes and pair lengths,
one record per (batch size, token bucket) the GPU op can meet (export/bucket_warmup.py).

The version is written under a hidden sibling directory and renamed into place, so a server polling <base>/<model>
never sees a half-written version.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import NamedTuple, Sequence

import numpy as np

import tensorflow as tf
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

from bertserve.export.bucket_warmup import bucket_lengths
from bertserve.export.graph import RankerModule
from bertserve.export.samples import inputs_of_lengths, mixed_length_inputs
from bertserve.export.weights import BertConfig
from bertserve.model_dir import SIGNATURE_NAME, TokenizerSettings, warmup_path

# One request alone, then every allowed_batch_sizes entry of serving_config/batching_parameters.txt: the batcher pads
# a batch to one of those, and the GPU op plans its GEMMs and captures a CUDA graph on a batch size's first call.
WARMUP_BATCH_SIZES = (1, 8, 16, 32, 64)
warmup_inputs = mixed_length_inputs  # what one warmup request carries: (config, batch_size, seq_length, seed)


def check_vocab(vocab_file: str, config: BertConfig) -> int:
    """Number of vocabulary entries; refuses a vocabulary with ids the embedding table does not have."""
    with open(vocab_file, encoding="utf-8") as f:
        entries = sum(1 for _ in f)
    if entries > config.vocab_size:
        raise ValueError(f"{vocab_file} has {entries} entries but the model's word_embeddings has only "
                         f"{config.vocab_size} rows (vocab_size): wrong vocabulary for this model")
    return entries


class BucketWarmup(NamedTuple):
    """Warm every (batch size, token bucket) of these allowed_batch_sizes for pair lengths lo..hi."""
    allowed_batch_sizes: tuple[int, ...]
    lo: int
    hi: int


def warmup_batches(config: BertConfig, seq_length: int, buckets: BucketWarmup | None = None,
                   seed: int = 0) -> list[dict[str, np.ndarray]]:
    """The inputs of each warmup request: WARMUP_BATCH_SIZES at mixed lengths, or one per (size, bucket)."""
    if buckets is None:
        return [mixed_length_inputs(config, batch_size, seq_length) for batch_size in WARMUP_BATCH_SIZES]
    if buckets.hi > seq_length:
        raise ValueError(f"warmup pair lengths up to {buckets.hi} exceed max_seq_length {seq_length}")
    rng = np.random.default_rng(seed)
    return [inputs_of_lengths(config, lengths, seq_length, rng)
            for lengths in bucket_lengths(buckets.allowed_batch_sizes, buckets.lo, buckets.hi)]


def write_warmup_requests(path: str, model_name: str, batches: Sequence[dict[str, np.ndarray]]) -> int:
    """TF Serving's warmup format: a TFRecord of PredictionLog, one PredictRequest per batch; returns the count."""
    with tf.io.TFRecordWriter(path) as writer:
        for inputs in batches:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=SIGNATURE_NAME))
            for name, value in inputs.items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=tf.int32))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return len(batches)


def read_warmup_requests(path: str) -> list[predict_pb2.PredictRequest]:
    """The PredictRequests of a warmup file (what TF Serving replays)."""
    requests = []
    for record in tf.data.TFRecordDataset(path):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        requests.append(log.predict_log.request)
    return requests


def version_dir(base: str, model_name: str, version: int) -> str:
    return os.path.join(base, model_name, str(version))


def write_version(module: RankerModule, config: BertConfig, base: str, model_name: str, version: int,
                  tokenizer: TokenizerSettings, overwrite: bool = False, warmup: BucketWarmup | None = None) -> str:
    """Saves module as <base>/<model_name>/<version>/ with assets.extra/; returns that directory. warmup: the
    served batching's buckets to warm (default: a few batch sizes)."""
    if version <= 0:
        raise ValueError(f"version must be a positive integer (TF Serving's version directories), got {version}")
    if tokenizer.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"max_seq_length {tokenizer.max_seq_length} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    check_vocab(tokenizer.vocab_file, config)
    batches = warmup_batches(config, tokenizer.max_seq_length, warmup)  # refuses a bad warmup before writing
    target = version_dir(base, model_name, version)
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(f"{target} already exists (pass overwrite to replace it, or pick a new version)")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{version}.partial-", dir=os.path.dirname(target))
    os.chmod(staging, 0o755)  # mkdtemp makes it private; a server running as another user must read it
    try:
        tf.saved_model.save(module, staging, signatures={SIGNATURE_NAME: module.serving_default})
        tokenizer.write(staging, config.vocab_size)
        write_warmup_requests(warmup_path(staging), model_name, batches)
        if os.path.exists(target):
            shutil.rmtree(target)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def directory_size(path: str) -> int:
    """Bytes under path (the SavedModel size the report quotes)."""
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)

