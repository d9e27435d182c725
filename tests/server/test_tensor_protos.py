"""TensorProto <-> NumPy in the server (server/tensors.py) against TensorFlow's own converters: every dtype a
request or response can carry, typed fields and tensor_content, TensorFlow's fill rule, and the size checks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from bertserve.server.errors import ServingError
from bertserve.server.tensors import MAX_EXPANSION_BYTES, fill_tensor_proto, proto_to_ndarray

ARRAYS = [
    np.arange(6, dtype=np.float32).reshape(2, 3) / 3, np.arange(4, dtype=np.float64) / 7,
    np.array([[1.5, -2.25]], np.float16), np.array([0.5, 3.0], ml_dtypes.bfloat16),
    np.array([[-7, 8]], np.int32), np.array([-3, 4], np.int16), np.array([-128, 127], np.int8),
    np.array([0, 255], np.uint8), np.array([65535], np.uint16), np.array([-(1 << 40)], np.int64),
    np.array([1 << 31], np.uint32), np.array([1 << 63], np.uint64), np.array([True, False]),
    np.array([1 + 2j], np.complex64), np.array([[3 - 4j]], np.complex128),
    np.array([b"a", b"\xff\x00"], dtype=object), np.float32(2.5),
]


def _info(dtype: int) -> meta_graph_pb2.TensorInfo:
    return meta_graph_pb2.TensorInfo(name="x:0", dtype=dtype)


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: str(np.asarray(a).dtype))
@pytest.mark.parametrize("tensor_content", [False, True])
def test_outputs_decode_with_tensorflow_and_requests_decode_like_it(array, tensor_content):
    array = np.asarray(array)
    proto = tensor_pb2.TensorProto()
    fill_tensor_proto(proto, array, tensor_content)
    if array.dtype != object and not tensor_content:
        assert not proto.tensor_content  # the typed fields, as Tensor::AsProtoField
    np.testing.assert_array_equal(tf.make_ndarray(proto), array)
    request = tf.make_tensor_proto(array)  # what a Python client sends
    decoded = proto_to_ndarray("x", _info(request.dtype), request)
    assert decoded.shape == array.shape and decoded.dtype == (array.dtype if array.dtype != object else object)
    np.testing.assert_array_equal(decoded, array)


def test_fewer_values_than_the_shape_repeat_the_last_as_tensorflow_fills():
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=5)])
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, tensor_shape=shape, int_val=[4, 9])
    np.testing.assert_array_equal(proto_to_ndarray("x", _info(types_pb2.DT_INT32), proto), [4, 9, 9, 9, 9])
    empty = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape)
    np.testing.assert_array_equal(proto_to_ndarray("x", _info(types_pb2.DT_FLOAT), empty), np.zeros(5))


@pytest.mark.parametrize("dims, values, text", [
    ([MAX_EXPANSION_BYTES // 4 + 2], [1.0], "may leave at most"),
    ([1 << 27], [], "more than the 67108864 allowed"),
    ([1 << 30, 0], [], "counting the dimensions of an empty tensor"),
    ([2], [1.0, 2.0, 3.0], "tensor parsing error: x"),
    ([-1, 2], [1.0], "unknown or negative dimension"),
])
def test_declared_sizes_are_checked_before_decoding(dims, values, text):
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims])
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape, float_val=values)
    with pytest.raises(ServingError, match=text):
        proto_to_ndarray("x", _info(types_pb2.DT_FLOAT), proto)


def test_the_signature_dtype_is_checked_first():
    proto = tf.make_tensor_proto(np.ones(3, np.complex128))
    with pytest.raises(ServingError, match=r"Expects arg\[x\] to be int32 but complex128 is provided"):
        proto_to_ndarray("x", _info(types_pb2.DT_INT32), proto)
    # A reference-typed input (DT_FLOAT_REF) takes float values.
    decoded = proto_to_ndarray("x", _info(types_pb2.DT_FLOAT_REF), tf.make_tensor_proto(np.ones(2, np.float32)))
    np.testing.assert_array_equal(decoded, [1.0, 1.0])
