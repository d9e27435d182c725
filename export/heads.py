"""A seeded classifier head for an encoder that has none (e.g. the sentence-transformers MiniLM BertModel).

A random head of the usual initializer scale gives scores that all sit near 0.5, which makes a poor stand-in for
a ranker in tests and demos. Here the head's direction is random (seeded) and its scale and bias are calibrated
on seeded probe sequences so the logit has mean 0 and standard deviation `logit_std` there: scores spread over
0..1 while the model stays deterministic for a given seed.
"""

from __future__ import annotations

import numpy as np

from bertserve.export import reference
from bertserve.export.samples import mixed_length_inputs
from bertserve.export.weights import BertConfig, BertWeights

PROBE_ROWS = 16
PROBE_LENGTH = 16


def with_seeded_classifier(config: BertConfig, encoder_arrays: dict[str, np.ndarray], seed: int,
                           logit_std: float = 2.0) -> BertWeights:
    """BertWeights from encoder + pooler arrays plus a calibrated, seeded classifier (1 or 2 labels)."""
    hidden, labels = config.hidden_size, config.num_labels
    zero_head = {"classifier_kernel": np.zeros((hidden, labels), np.float32),
                 "classifier_bias": np.zeros((labels,), np.float32)}
    weights = BertWeights(config, {**encoder_arrays, **zero_head})
    probes = mixed_length_inputs(config, PROBE_ROWS, min(PROBE_LENGTH, config.max_position_embeddings), seed)
    first = np.stack([h[0] for h in reference.encode(weights, **probes)])
    pooled = np.tanh(first @ weights["pooler_kernel"].astype(np.float64) + weights["pooler_bias"])
    direction = np.random.default_rng(seed).standard_normal(hidden)
    projected = pooled @ direction
    scale = logit_std / max(float(projected.std()), 1e-6)
    kernel = np.zeros((hidden, labels))
    bias = np.zeros((labels,))
    kernel[:, labels - 1] = direction * scale  # 2 labels: label 0's logit stays 0, so softmax[:, 1] = sigmoid
    bias[labels - 1] = -float(projected.mean()) * scale
    weights.arrays["classifier_kernel"] = kernel.astype(np.float32)
    weights.arrays["classifier_bias"] = bias.astype(np.float32)
    return weights
