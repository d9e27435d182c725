"""One loaded model version: its SavedModel, signatures, input limits and in-flight request count."""

from __future__ import annotations

import glob
import json
import logging
import os
import threading
from typing import Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from bertserve.server.errors import failed_precondition, from_exception, invalid_argument
from bertserve.server.tensors import dtype_name

log = logging.getLogger("bertserve.server")

INIT_OP_SIGNATURE = "__saved_model_init_op"
DEFAULT_SIGNATURE = "serving_default"
# The bertserve signature contract: these inputs share one [batch, seq] shape.
TOKEN_INPUTS = ("input_ids", "input_mask", "segment_ids")


class InputLimits:
    """Value ranges the model's embeddings accept; None where the SavedModel does not tell."""

    def __init__(self, vocab_size: int | None, type_vocab_size: int | None, max_positions: int | None):
        self.vocab_size, self.type_vocab_size, self.max_positions = vocab_size, type_vocab_size, max_positions

    @classmethod
    def from_saved_model(cls, path: str) -> "InputLimits":
        """Prefers the exported tokenizer JSON in assets.extra, then the embedding variables' shapes."""
        found: dict[str, int] = {}
        for json_path in sorted(glob.glob(os.path.join(path, "assets.extra", "*.json"))):
            try:
                with open(json_path, encoding="utf-8") as handle:
                    data = json.load(handle)
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                for key in ("vocab_size", "type_vocab_size", "max_position_embeddings"):
                    if isinstance(data.get(key), int) and key not in found:
                        found[key] = data[key]
        variables = _variable_shapes(path)
        for key, suffix in (("vocab_size", "word_embeddings"), ("type_vocab_size", "token_type_embeddings"),
                            ("max_position_embeddings", "position_embeddings")):
            if key not in found:
                shape = next((s for n, s in variables.items() if _leaf_name(n) == suffix and len(s) == 2), None)
                if shape is not None:
                    found[key] = int(shape[0])
        return cls(found.get("vocab_size"), found.get("type_vocab_size"), found.get("max_position_embeddings"))

    def describe(self) -> str:
        return f"vocab={self.vocab_size} type_vocab={self.type_vocab_size} max_positions={self.max_positions}"


def _leaf_name(checkpoint_key: str) -> str:
    """'encoder/word_embeddings/.ATTRIBUTES/VARIABLE_VALUE' -> 'word_embeddings'."""
    return checkpoint_key.split("/.ATTRIBUTES", 1)[0].rsplit("/", 1)[-1]


def _variable_shapes(path: str) -> dict[str, list[int]]:
    prefix = os.path.join(path, "variables", "variables")
    if not tf.io.gfile.exists(prefix + ".index"):
        return {}
    try:
        return tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError):
        return {}


def _numpy_dtype_name(dtype: np.dtype) -> str:
    try:
        return tf.dtypes.as_dtype(dtype).name
    except TypeError:
        return str(dtype)


def read_meta_graph(path: str, tags: set[str]) -> meta_graph_pb2.MetaGraphDef:
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        saved_model.ParseFromString(handle.read())
    for meta_graph in saved_model.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == tags:
            return meta_graph
    raise ValueError(f"SavedModel at {path} has no MetaGraphDef with tags {sorted(tags)}")


class Signature:
    """A signature's contract (from the SignatureDef) plus the concrete function that runs it."""

    def __init__(self, key: str, signature_def: meta_graph_pb2.SignatureDef, function: Callable, limits: InputLimits):
        self.key, self.signature_def, self.function, self.limits = key, signature_def, function, limits
        self.inputs = dict(signature_def.inputs)
        self.outputs = dict(signature_def.outputs)
        self.tensor_names = {alias: info.name for alias, info in self.inputs.items()}

    def validate(self, inputs: dict[str, np.ndarray], output_filter: list[str]) -> int:
        """Checks names, dtypes, shapes and id ranges; returns the batch size. Raises ServingError."""
        missing = sorted(set(self.inputs) - set(inputs))
        extra = sorted(set(inputs) - set(self.inputs))
        if missing or extra:
            raise invalid_argument(
                f"Request inputs do not match required inputs for model `{self.key}`. "
                f"Send extra: {{{', '.join(extra)}}}. Missing but required: {{{', '.join(missing)}}}.")
        unknown_outputs = [name for name in output_filter if name not in self.outputs]
        if unknown_outputs:
            raise invalid_argument(f"output tensor alias not found in signature: {unknown_outputs[0]}. "
                                   f"Outputs expected to be in the set {{{','.join(sorted(self.outputs))}}}.")
        if len(set(output_filter)) != len(output_filter):
            raise invalid_argument(f"duplicate output tensor alias in output_filter: {list(output_filter)}")
        batch_sizes = set()
        for name, array in inputs.items():
            info = self.inputs[name]
            expected = tf.dtypes.as_dtype(info.dtype).as_numpy_dtype
            if array.dtype != expected:
                raise invalid_argument(f"Expects arg[{name}] to be {dtype_name(info.dtype)} but "
                                       f"{_numpy_dtype_name(array.dtype)} is provided")
            if not info.tensor_shape.unknown_rank:
                want = [d.size for d in info.tensor_shape.dim]
                if array.ndim != len(want) or any(w not in (-1, g) for w, g in zip(want, array.shape)):
                    raise invalid_argument(f"input '{name}' has shape {list(array.shape)}, the signature expects "
                                           f"{['?' if w == -1 else w for w in want]}")
            if array.ndim == 0:
                raise invalid_argument(f"input '{name}' is a scalar; inputs need a batch dimension")
            batch_sizes.add(array.shape[0])
        if len(batch_sizes) > 1:
            raise invalid_argument(f"input tensors must have equal 0th-dimension size, got "
                                   f"{ {n: int(a.shape[0]) for n, a in inputs.items()} }")
        self._check_token_inputs(inputs)
        return batch_sizes.pop() if batch_sizes else 0

    def _check_token_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        present = [n for n in TOKEN_INPUTS if n in inputs]
        shapes = {n: tuple(inputs[n].shape) for n in present}
        if len(set(shapes.values())) > 1:
            raise invalid_argument(f"input_ids, input_mask and segment_ids must share one [batch, seq] shape, "
                                   f"got {shapes}")
        limits = self.limits
        for name, high in (("input_ids", limits.vocab_size), ("segment_ids", limits.type_vocab_size),
                           ("input_mask", 2)):
            array = inputs.get(name)
            if array is None or high is None or array.size == 0 or array.dtype.kind not in "iu":
                continue
            low_value, high_value = int(array.min()), int(array.max())
            if low_value < 0 or high_value >= high:
                bad = low_value if low_value < 0 else high_value
                raise invalid_argument(f"{name} value {bad} is out of range [0, {high})")
        ids = inputs.get("input_ids")
        if ids is not None and ids.ndim == 2 and limits.max_positions is not None and ids.shape[1] > limits.max_positions:
            raise invalid_argument(f"sequence length {ids.shape[1]} exceeds the model's {limits.max_positions} positions")

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs the SavedModel signature; a TensorFlow failure keeps its status code."""
        try:
            outputs = self.function(**{name: tf.constant(value) for name, value in inputs.items()})
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status, never a crash
            raise from_exception(exc) from exc
        return {name: tensor.numpy() for name, tensor in outputs.items()}


class LoadedVersion:
    """A servable version: loaded once, shared by requests, unloaded when the last in-flight request ends."""

    def __init__(self, model_name: str, version: int, path: str, tags: set[str]):
        self.model_name, self.version, self.path = model_name, version, path
        self.meta_graph = read_meta_graph(path, tags)
        self._loaded = tf.saved_model.load(path, tags=sorted(tags))
        self.limits = InputLimits.from_saved_model(path)
        self.signatures: dict[str, Signature] = {}
        for key, signature_def in self.meta_graph.signature_def.items():
            if key == INIT_OP_SIGNATURE or key not in self._loaded.signatures:
                continue
            self.signatures[key] = Signature(key, signature_def, self._loaded.signatures[key], self.limits)
        self._in_flight = 0
        self._idle = threading.Condition()

    def signature(self, key: str) -> Signature:
        found = self.signatures.get(key or DEFAULT_SIGNATURE)
        if found is None:
            raise failed_precondition(f"Serving signature key \"{key or DEFAULT_SIGNATURE}\" not found.")
        return found

    def acquire(self) -> None:
        with self._idle:
            self._in_flight += 1

    def release(self) -> None:
        with self._idle:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.notify_all()

    def wait_idle(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0)

    def release_model(self) -> None:
        """Drops the only reference to the TF objects so their memory can go."""
        self.signatures.clear()
        self._loaded = None
