"""What a served benchmark run stands on: the exported model version (with a warmup file for every batch shape the
GPU op can meet), and TF Serving's three config files (models, batching, monitoring), written into a work folder.

Models: the chit-chat ranker (6 x 768, random weights from gpu_rig/reference.py's seed), the real MiniLM-L6 ranker
(the carried fp16 file, bench/gpu/prepare_carry.py) and, for runs on a CPU machine, a tiny ranker of the same
signature. Every version is the fused export, written by export/saved.py as `bertserve export` writes it.
"""

from __future__ import annotations

import os
from typing import Sequence

from bertserve.export.saved import BucketWarmup, warmup_batches, write_warmup_requests
from bertserve.export.weights import BertConfig, BertWeights
from bertserve.loadtest.loadgen import RequestShape
from bertserve.loadtest.server_process import write_model_config
from bertserve.loadtest.tuner import BatchingCandidate
from bertserve.model_dir import warmup_path

MODEL_SOURCES = ("chitchat", "minilm", "tiny")
# A ranker small enough for a 2-core machine, with BERT's vocabulary size (the load generator's default ids).
TINY_CONFIG = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, max_position_embeddings=64)
# The committed monitoring config: Prometheus on the REST port, where the batch-size histograms are read.
MONITORING_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))),
                                 "serving_config", "monitoring.config")


def source_weights(source: str, carry: str) -> BertWeights:
    from bertserve.gpu_rig import reference

    if source == "chitchat":
        return reference.chitchat_weights()
    if source == "minilm":
        return reference.minilm_weights(carry)
    if source == "tiny":
        return BertWeights.random(TINY_CONFIG, seed=0)
    raise ValueError(f"model source {source!r} is not one of {MODEL_SOURCES}")


def export_version(source: str, precision: str, base: str, carry: str) -> tuple[str, BertConfig]:
    """The fused SavedModel of that source and precision under base (gpu_rig/reference.py's export); returns its
    version folder and config."""
    from bertserve.gpu_rig.reference import export_fused

    weights = source_weights(source, carry)
    os.makedirs(base, exist_ok=True)
    return export_fused(weights, precision, base), weights.config


def warm_every_bucket(version_dir: str, config: BertConfig, shape: RequestShape, allowed: Sequence[int]) -> int:
    """Replaces the export's warmup file with one request per (allowed batch size, token bucket) that pairs of the
    load's lengths can make, as `bertserve export --warmup_batching_parameters` writes it; returns the count."""
    buckets = BucketWarmup(tuple(allowed), min(shape.lengths), min(max(shape.lengths), shape.max_len))
    return write_warmup_requests(warmup_path(version_dir), "warmup", warmup_batches(config, shape.max_len, buckets))


def write_config_files(folder: str, names: Sequence[str], base_path: str,
                       batching: BatchingCandidate) -> dict[str, str]:
    """models.config (every name served from base_path) and batching_parameters.txt in folder, with the committed
    monitoring.config."""
    os.makedirs(folder, exist_ok=True)
    paths = {"models": write_model_config(os.path.join(folder, "models.config"), {n: base_path for n in names}),
             "batching": os.path.join(folder, "batching_parameters.txt"), "monitoring": MONITORING_CONFIG}
    with open(paths["batching"], "w", encoding="utf-8") as f:
        f.write(batching.to_text())
    return paths
