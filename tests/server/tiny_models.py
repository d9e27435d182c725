"""Tiny SavedModels with the bertserve signature contract, built from stock TF ops for the server tests.

serving_default: int32 input_ids / input_mask / segment_ids [batch, seq] -> float32 scores [batch].
A second signature, `scores_and_logits`, has two outputs (output_filter and multi-output REST responses).
`work` adds that many 128x128 matmuls per call, so a test can make the model slow without a sleep op.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

VOCAB, HIDDEN, MAX_POSITIONS, TYPE_VOCAB = 64, 16, 32, 2

_TOKEN_SPECS = [tf.TensorSpec([None, None], tf.int32, name=n) for n in ("input_ids", "input_mask", "segment_ids")]


class TinyRanker(tf.Module):
    def __init__(self, seed: int, work: int = 0):
        super().__init__()
        rng = np.random.default_rng(seed)

        def var(shape, name):
            return tf.Variable((0.5 * rng.standard_normal(shape)).astype(np.float32), name=name)

        self.word_embeddings = var((VOCAB, HIDDEN), "word_embeddings")
        self.position_embeddings = var((MAX_POSITIONS, HIDDEN), "position_embeddings")
        self.token_type_embeddings = var((TYPE_VOCAB, HIDDEN), "token_type_embeddings")
        self.dense_kernel = var((HIDDEN, HIDDEN), "dense_kernel")
        self.classifier_kernel = var((HIDDEN, 1), "classifier_kernel")
        self.classifier_bias = var((1,), "classifier_bias")
        self.work_matrix = tf.Variable(np.eye(128, dtype=np.float32) * 0.5, name="work_matrix")
        self.work = work

    def _logits(self, input_ids, input_mask, segment_ids):
        seq = tf.shape(input_ids)[1]
        x = (tf.gather(self.word_embeddings, input_ids) + self.position_embeddings[tf.newaxis, :seq]
             + tf.gather(self.token_type_embeddings, segment_ids))
        mask = tf.cast(input_mask, tf.float32)
        attention = tf.einsum("bsh,bth->bst", x, x) / HIDDEN ** 0.5 + (1.0 - mask[:, tf.newaxis, :]) * -1e4
        hidden = tf.tanh(tf.einsum("bst,bth->bsh", tf.nn.softmax(attention), x) @ self.dense_kernel)
        pooled = tf.reduce_sum(hidden * mask[..., tf.newaxis], 1) / tf.maximum(tf.reduce_sum(mask, 1, keepdims=True), 1.0)
        logits = (pooled @ self.classifier_kernel + self.classifier_bias)[:, 0]
        if self.work:
            busy = tf.while_loop(lambda i, m: i < self.work, lambda i, m: (i + 1, tf.tanh(m @ self.work_matrix)),
                                 (tf.constant(0), tf.ones([128, 128])))[1]
            logits += 0.0 * tf.reduce_sum(busy)
        return logits

    @tf.function(input_signature=_TOKEN_SPECS)
    def serve(self, input_ids, input_mask, segment_ids):
        return {"scores": tf.sigmoid(self._logits(input_ids, input_mask, segment_ids))}

    @tf.function(input_signature=_TOKEN_SPECS)
    def scores_and_logits(self, input_ids, input_mask, segment_ids):
        logits = self._logits(input_ids, input_mask, segment_ids)
        return {"scores": tf.sigmoid(logits), "logits": logits}


def build_tiny_ranker(base_path: str, version: int, seed: int | None = None, work: int = 0,
                      warmup_requests: int = 0) -> str:
    """Writes <base_path>/<version>/ as a SavedModel; optional warmup records in assets.extra."""
    module = TinyRanker(seed=version if seed is None else seed, work=work)
    path = os.path.join(base_path, str(version))
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve,
                                                  "scores_and_logits": module.scores_and_logits})
    if warmup_requests:
        write_warmup(path, [token_inputs(2, 8, seed=i) for i in range(warmup_requests)])
    return path


def token_inputs(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Valid BERT-style inputs: real tokens first, then padding (mask 0, id 0)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, seq + 1, size=batch)
    mask = (np.arange(seq)[np.newaxis, :] < lengths[:, np.newaxis]).astype(np.int32)
    ids = rng.integers(1, VOCAB, size=(batch, seq)).astype(np.int32) * mask
    segments = ((np.arange(seq)[np.newaxis, :] >= lengths[:, np.newaxis] // 2) * mask).astype(np.int32)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def predict_request(model: str, inputs: dict[str, np.ndarray], signature: str = "",
                    version: int | None = None, label: str = "") -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if signature:
        request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if label:
        request.model_spec.version_label = label
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return request


def write_warmup(version_path: str, requests: list[dict[str, np.ndarray]]) -> None:
    os.makedirs(os.path.join(version_path, "assets.extra"), exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(version_path, "assets.extra", "tf_serving_warmup_requests")) as writer:
        for inputs in requests:
            entry = prediction_log_pb2.PredictionLog()
            entry.predict_log.request.CopyFrom(predict_request("warmup", inputs))
            writer.write(entry.SerializeToString())


def direct_scores(version_path: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """What the SavedModel itself answers, called in this process without the server."""
    loaded = tf.saved_model.load(version_path)
    return loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})["scores"].numpy()


def tensor(proto: tensor_pb2.TensorProto) -> np.ndarray:
    return tf.make_ndarray(proto)
