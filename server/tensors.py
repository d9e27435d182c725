"""TensorProto and REST JSON <-> NumPy, without TensorFlow's slow generic converters on the hot path."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

from bertserve.server.errors import invalid_argument

# Guards allocation from a hostile shape (TensorProto lets one value broadcast to any shape).
MAX_TENSOR_ELEMENTS = 1 << 26

_NUMERIC_DTYPES: dict[int, np.dtype] = {
    types_pb2.DT_FLOAT: np.dtype(np.float32),
    types_pb2.DT_DOUBLE: np.dtype(np.float64),
    types_pb2.DT_HALF: np.dtype(np.float16),
    types_pb2.DT_INT32: np.dtype(np.int32),
    types_pb2.DT_INT64: np.dtype(np.int64),
    types_pb2.DT_INT16: np.dtype(np.int16),
    types_pb2.DT_INT8: np.dtype(np.int8),
    types_pb2.DT_UINT8: np.dtype(np.uint8),
    types_pb2.DT_BOOL: np.dtype(np.bool_),
}


def dtype_name(dtype_enum: int) -> str:
    try:
        return tf.dtypes.as_dtype(dtype_enum).name
    except TypeError:
        return f"unknown dtype {dtype_enum}"


def proto_to_ndarray(name: str, proto: tensor_pb2.TensorProto) -> np.ndarray:
    """Decodes one request tensor; every malformed tensor becomes INVALID_ARGUMENT naming the input."""
    dims = [d.size for d in proto.tensor_shape.dim]
    if proto.tensor_shape.unknown_rank or any(d < 0 for d in dims):
        raise invalid_argument(f"input tensor '{name}' has an unknown or negative dimension: {dims}")
    count = math.prod(dims)
    if count > MAX_TENSOR_ELEMENTS:
        raise invalid_argument(f"input tensor '{name}' has {count} elements, more than the {MAX_TENSOR_ELEMENTS} allowed")
    np_dtype = _NUMERIC_DTYPES.get(proto.dtype)
    if np_dtype is not None and proto.tensor_content:
        if len(proto.tensor_content) != count * np_dtype.itemsize:
            raise invalid_argument(f"input tensor '{name}': tensor_content holds {len(proto.tensor_content)} bytes, "
                                   f"shape {dims} of {dtype_name(proto.dtype)} needs {count * np_dtype.itemsize}")
        return np.frombuffer(proto.tensor_content, dtype=np_dtype).reshape(dims)
    try:
        return tf.make_ndarray(proto)
    except Exception as exc:  # tensor_util raises TypeError/ValueError/KeyError on malformed protos
        raise invalid_argument(f"input tensor '{name}' cannot be parsed: {exc}") from exc


def ndarray_to_proto(array: np.ndarray) -> tensor_pb2.TensorProto:
    """Encodes a numeric output as tensor_content (what TF Serving itself returns)."""
    array = np.ascontiguousarray(array)
    for enum, np_dtype in _NUMERIC_DTYPES.items():
        if array.dtype == np_dtype:
            shape = tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in array.shape])
            return tensor_pb2.TensorProto(dtype=enum, tensor_shape=shape, tensor_content=array.tobytes())
    return tf.make_tensor_proto(array)


def json_to_ndarray(name: str, value: object, dtype_enum: int) -> np.ndarray:
    """A REST value (nested lists of numbers) as an array of the signature's dtype, refusing lossy conversions."""
    np_dtype = _NUMERIC_DTYPES.get(dtype_enum)
    if np_dtype is None:
        raise invalid_argument(f"input '{name}': dtype {dtype_name(dtype_enum)} is not supported over REST here")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise invalid_argument(f"input '{name}' is not a rectangular list of numbers: {exc}") from exc
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise invalid_argument(f"input '{name}' must be a rectangular list of numbers, got {array.dtype} values")
    if array.size > MAX_TENSOR_ELEMENTS:
        raise invalid_argument(f"input '{name}' has {array.size} elements, more than {MAX_TENSOR_ELEMENTS}")
    if np_dtype.kind in "iub":
        if array.dtype.kind == "f":
            raise invalid_argument(f"input '{name}' expects {np_dtype.name} values, got non-integer numbers")
        info = np.iinfo(np_dtype) if np_dtype.kind != "b" else None
        if info is not None and array.size and (array.min() < info.min or array.max() > info.max):
            raise invalid_argument(f"input '{name}' has values outside the {np_dtype.name} range")
    return array.astype(np_dtype, copy=False)
