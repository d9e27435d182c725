"""The token inputs of a bertserve signature, checked before a request joins a batch, by the fused op's own code.

A batch runs as one model call, so one request the model refuses fails every request batched with it. The
rules BertEmbedding applies (sequence length within the position table, mask values 0 or 1 with each row's real
positions first, ids and segment ids of real positions inside their tables; the stock export asserts the same)
are implemented once, in C++ (custom_ops/tf/bert_op_inputs.cc, CheckTokenInputs). The server calls that same
function through its C entry point in the op library, with the limits of the model version it serves, so it
refuses exactly what the op would, with the op's message, before the request can share a batch. A Predict that a
gRPC front-end process took apart comes with what that process measured of its token inputs (TokenRanges: the op's
mask check, compiled into it, and the ranges of ids and segment ids at real positions): a request within the
model's tables then passes on four comparisons, which took the event loop's CPU per 32-row Predict from 94-97 to
76-78 us (2-core EPYC); any other is scanned here.

The limits come from the SavedModel: the embedding tables' shapes in its variables (the fused op's weight
inputs), else the export's JSON in assets.extra, read through tf.io.gfile so any base path URI works.
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
from typing import Mapping, NamedTuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from bertserve.model_dir import ASSETS_EXTRA, INPUT_NAMES
from bertserve.server.errors import invalid_argument

log = logging.getLogger("bertserve.server")

_NO_LIMIT = (1 << 63) - 1
_MESSAGE_BYTES = 512
_INT32 = np.dtype(np.int32)


class TokenLimits:
    """Rows of the embedding tables a request may index; None where the SavedModel does not tell."""

    def __init__(self, vocab_size: int | None, type_vocab_size: int | None, max_positions: int | None):
        self.vocab_size, self.type_vocab_size, self.max_positions = vocab_size, type_vocab_size, max_positions

    @classmethod
    def from_saved_model(cls, path: str) -> "TokenLimits":
        """The embedding tables' rows from the variables' shapes (what the op indexes), else the export's JSON in
        assets.extra."""
        found: dict[str, int] = {}
        variables = _variable_shapes(path)
        for key, leaf in (("vocab_size", "word_embeddings"), ("type_vocab_size", "token_type_embeddings"),
                          ("max_position_embeddings", "position_embeddings")):
            shape = next((s for n, s in variables.items() if _leaf_name(n) == leaf and len(s) == 2), None)
            if shape is not None:
                found[key] = int(shape[0])
        for json_path in sorted(tf.io.gfile.glob(f"{path.rstrip('/')}/{ASSETS_EXTRA}/*.json")):
            try:
                with tf.io.gfile.GFile(json_path, "r") as handle:
                    data = json.loads(handle.read())
            except (tf.errors.OpError, ValueError):
                continue
            if isinstance(data, dict):
                for key in ("vocab_size", "type_vocab_size", "max_position_embeddings"):
                    if isinstance(data.get(key), int) and key not in found:
                        found[key] = data[key]
        return cls(found.get("vocab_size"), found.get("type_vocab_size"), found.get("max_position_embeddings"))

    def describe(self) -> str:
        return f"vocab={self.vocab_size} type_vocab={self.type_vocab_size} max_positions={self.max_positions}"


def _leaf_name(checkpoint_key: str) -> str:
    """'encoder/word_embeddings/.ATTRIBUTES/VARIABLE_VALUE' -> 'word_embeddings'."""
    return checkpoint_key.split("/.ATTRIBUTES", 1)[0].rsplit("/", 1)[-1]


def _variable_shapes(path: str) -> dict[str, list[int]]:
    prefix = f"{path.rstrip('/')}/variables/variables"
    try:
        if not tf.io.gfile.exists(prefix + ".index"):
            return {}
        return tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError):
        return {}


@functools.cache
def _native_check():
    """bertserve_check_token_inputs from the op library this process loaded; None without the library."""
    try:
        from bertserve import custom_ops

        custom_ops.load_op_library()
        # PyDLL keeps the GIL during the call: the check takes microseconds, while a CDLL call releases the GIL
        # and then waits to take it back from the batch threads, which stalls the event loop for far longer.
        function = ctypes.PyDLL(custom_ops.library_path()).bertserve_check_token_inputs
    except (ImportError, OSError, AttributeError, tf.errors.OpError) as exc:
        log.warning("token inputs are not checked before batching: the op library's check is unavailable (%s)",
                    exc)
        return None
    # Addresses as plain integers: ctypes' typed-pointer conversion costs more than the check itself.
    function.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 5 + [ctypes.c_char_p, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function


class TokenRanges(NamedTuple):
    """What a gRPC front end measured of a request's token inputs (server/cc/predict_codec.cc, with the op's own
    mask check compiled in): whether the mask passes, and the ids and segment ids at real positions as ranges
    (empty: 0, -1)."""
    mask_valid: bool
    id_min: int
    id_max: int
    segment_min: int
    segment_max: int


class TokenInputRules:
    """The op's rules for one signature that takes the bertserve token inputs, with its model's limits."""

    def __init__(self, limits: TokenLimits, check):
        self.limits, self._check = limits, check
        self._bounds = tuple(_NO_LIMIT if value is None else value
                             for value in (limits.vocab_size, limits.max_positions, limits.type_vocab_size))

    @classmethod
    def for_signature(cls, inputs: Mapping[str, meta_graph_pb2.TensorInfo],
                      limits: TokenLimits) -> "TokenInputRules | None":
        """Rules when the signature takes input_ids, input_mask and segment_ids as int32 (the bertserve contract),
        else None: other models' inputs mean something else."""
        if not all(name in inputs and inputs[name].dtype == types_pb2.DT_INT32 for name in INPUT_NAMES):
            return None
        check = _native_check()
        return None if check is None else cls(limits, check)

    def check(self, inputs: Mapping[str, np.ndarray], ranges: TokenRanges | None = None) -> None:
        """Raises INVALID_ARGUMENT with the op's message for a request the op would refuse. With the `ranges` a
        front end measured of these arrays, a request within the model's tables passes on four comparisons; any
        other is scanned here, which also finds the op's message for one it refuses."""
        arrays = [inputs.get(name) for name in INPUT_NAMES]
        if any(array is None for array in arrays):
            return  # the signature's input-name check answers this request
        ids, mask, segments = arrays
        if not (ids.ndim == 2 and ids.shape == mask.shape == segments.shape):
            shapes = {name: tuple(array.shape) for name, array in zip(INPUT_NAMES, arrays)}
            raise invalid_argument(f"input_ids, input_mask and segment_ids must share one [batch, seq] shape, "
                                   f"got {shapes}")
        if not (ids.dtype == mask.dtype == segments.dtype == _INT32):
            wrong = {name: str(array.dtype) for name, array in zip(INPUT_NAMES, arrays) if array.dtype != np.int32}
            raise invalid_argument(f"input_ids, input_mask and segment_ids must be int32, got {wrong}")
        vocab_size, max_positions, type_vocab_size = self._bounds
        if (ranges is not None and ranges.mask_valid and ids.shape[1] <= max_positions and ranges.id_min >= 0
                and ranges.id_max < vocab_size and ranges.segment_min >= 0 and ranges.segment_max < type_vocab_size):
            return
        ids, mask, segments = (np.ascontiguousarray(array) for array in arrays)
        batch, seq = ids.shape
        addresses = (_address(ids), _address(segments), _address(mask), batch, seq, *self._bounds)
        # No message buffer on the common path: only a refused request is checked again to get its message.
        if self._check(*addresses, None, 0):
            message = ctypes.create_string_buffer(_MESSAGE_BYTES)
            self._check(*addresses, message, _MESSAGE_BYTES)
            raise invalid_argument(message.value.decode("utf-8", errors="replace"))


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]
