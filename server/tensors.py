"""TensorProto and REST JSON <-> NumPy, checked against the signature before anything is allocated.

A TensorProto declares its shape apart from the values it carries: TensorFlow fills a tensor that carries fewer
values with its last value (or zeros), and an empty tensor ([2^30, 0]) may declare huge other dimensions that
the graph then builds outputs from. A few hundred bytes could so stand for gigabytes. Every input is therefore
checked first against the signature's dtype, then its declared size against what it carries: a tensor may
declare at most MAX_EXPANSION_BYTES more than it carries, and at most MAX_TENSOR_ELEMENTS elements, counting an
empty tensor's other dimensions. Only then is it decoded, with NumPy (no TensorFlow converters on the hot path).

A gRPC front-end process hands Predict inputs over already taken apart (server/cc/predict_codec.h): a RawTensor
holds a TensorProto's dtype, declared shape and the bytes of its tensor_content or typed field, and goes through
the same checks and the same decoding as the TensorProto would.

Outputs are encoded as TF Serving encodes them: the typed fields (float_val, int_val, ...: Tensor::AsProtoField)
unless --enable_serialization_as_tensor_content asks for tensor_content.
"""

from __future__ import annotations

import base64
import math
from typing import Mapping, NamedTuple

import ml_dtypes
import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from bertserve.server.errors import invalid_argument

MAX_TENSOR_ELEMENTS = 1 << 26
MAX_EXPANSION_BYTES = 1 << 20
MAX_RANK = 254  # TensorFlow's TensorShape limit
# What one element of a string tensor costs at least once decoded (an object pointer), for the expansion rule.
STRING_ELEMENT_BYTES = 8


class _Codec:
    """How one dtype travels in a TensorProto: its NumPy dtype and its typed field (and values per element)."""

    def __init__(self, np_dtype: np.dtype | None, field: str, per_element: int = 1, via: np.dtype | None = None):
        self.np_dtype, self.field, self.per_element = np_dtype, field, per_element
        self.via = via  # the dtype the typed field holds when it differs (half_val holds float16 bits as ints)

    @property
    def itemsize(self) -> int:
        return STRING_ELEMENT_BYTES if self.np_dtype is None else self.np_dtype.itemsize


_STRING = types_pb2.DT_STRING  # a module constant: the enum wrapper's attribute lookup is slow on hot paths
_CODECS: dict[int, _Codec] = {
    types_pb2.DT_FLOAT: _Codec(np.dtype(np.float32), "float_val"),
    types_pb2.DT_DOUBLE: _Codec(np.dtype(np.float64), "double_val"),
    types_pb2.DT_HALF: _Codec(np.dtype(np.float16), "half_val", via=np.dtype(np.uint16)),
    types_pb2.DT_BFLOAT16: _Codec(np.dtype(ml_dtypes.bfloat16), "half_val", via=np.dtype(np.uint16)),
    types_pb2.DT_INT32: _Codec(np.dtype(np.int32), "int_val"),
    types_pb2.DT_INT16: _Codec(np.dtype(np.int16), "int_val"),
    types_pb2.DT_INT8: _Codec(np.dtype(np.int8), "int_val"),
    types_pb2.DT_UINT8: _Codec(np.dtype(np.uint8), "int_val"),
    types_pb2.DT_UINT16: _Codec(np.dtype(np.uint16), "int_val"),
    types_pb2.DT_INT64: _Codec(np.dtype(np.int64), "int64_val"),
    types_pb2.DT_UINT32: _Codec(np.dtype(np.uint32), "uint32_val"),
    types_pb2.DT_UINT64: _Codec(np.dtype(np.uint64), "uint64_val"),
    types_pb2.DT_BOOL: _Codec(np.dtype(np.bool_), "bool_val"),
    types_pb2.DT_COMPLEX64: _Codec(np.dtype(np.complex64), "scomplex_val", per_element=2, via=np.dtype(np.float32)),
    types_pb2.DT_COMPLEX128: _Codec(np.dtype(np.complex128), "dcomplex_val", per_element=2,
                                    via=np.dtype(np.float64)),
    _STRING: _Codec(None, "string_val"),
}
# The dtypes whose typed-field values a front end hands over as raw bytes: the field holds the dtype itself.
RAW_VALUE_DTYPES = frozenset({types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_INT32, types_pb2.DT_INT64})
_ENUM_BY_NUMPY: dict[np.dtype, int] = {codec.np_dtype: enum for enum, codec in _CODECS.items()
                                       if codec.np_dtype is not None}
_REF_OFFSET = 100  # DT_FLOAT_REF == DT_FLOAT + 100: a reference-typed tensor carries values of its base type


def dtype_name(dtype_enum: int) -> str:
    """TensorFlow's DataTypeString ("float", "int32", "string"), as its error messages name dtypes."""
    try:
        return types_pb2.DataType.Name(dtype_enum)[len("DT_"):].lower()
    except ValueError:
        return f"unknown dtype {dtype_enum}"


def base_dtype(dtype_enum: int) -> int:
    return dtype_enum - _REF_OFFSET if dtype_enum > _REF_OFFSET else dtype_enum


class RawTensor(NamedTuple):
    """A request tensor as a front end took it apart: its values are `data`, the bytes of its tensor_content
    (`in_content`) or of its typed field's values (float_val, double_val, int_val or int64_val, little-endian)."""
    dtype: int
    dims: list[int]
    data: memoryview
    in_content: bool


def _declared_dims(alias: str, shape: tensor_shape_pb2.TensorShapeProto) -> list[int]:
    return _checked_dims(alias, [d.size for d in shape.dim], shape.unknown_rank)


def _checked_dims(alias: str, dims: list[int], unknown_rank: bool = False) -> list[int]:
    if unknown_rank or (dims and min(dims) < 0):
        raise invalid_argument(f"input tensor '{alias}' has an unknown or negative dimension: {dims}")
    if len(dims) > MAX_RANK:
        raise invalid_argument(f"input tensor '{alias}' has rank {len(dims)}, more than {MAX_RANK}")
    return dims


def _check_size(alias: str, dims: list[int], carried: int, itemsize: int) -> int:
    """Refuses a declared shape that stands for much more than the tensor carries; returns its element count.

    `carried`: elements the request actually holds. An empty tensor counts its non-zero dimensions, since the
    graph may build outputs from them ([2^30, 0] ids give [2^30] scores)."""
    count = math.prod(dims)
    nominal = count if count else math.prod(d or 1 for d in dims)
    if nominal > MAX_TENSOR_ELEMENTS:
        raise invalid_argument(f"input tensor '{alias}' declares shape {dims}: {nominal} elements (counting the "
                               f"dimensions of an empty tensor), more than the {MAX_TENSOR_ELEMENTS} allowed")
    if carried < nominal and (nominal - carried) * itemsize > MAX_EXPANSION_BYTES:
        raise invalid_argument(f"input tensor '{alias}' declares shape {dims} ({nominal} elements) but carries "
                               f"{carried} values; a tensor may leave at most {MAX_EXPANSION_BYTES} bytes to be "
                               f"filled in")
    return count


def check_dtype(alias: str, info: meta_graph_pb2.TensorInfo, dtype_enum: int) -> None:
    """The request's dtype must be the signature's (checked before decoding: dtypes set what decoding costs)."""
    expected = base_dtype(info.dtype)
    if dtype_enum != expected:
        raise invalid_argument(f"Expects arg[{alias}] to be {dtype_name(expected)} but {dtype_name(dtype_enum)} "
                               f"is provided")


def proto_to_ndarray(alias: str, info: meta_graph_pb2.TensorInfo, proto: tensor_pb2.TensorProto) -> np.ndarray:
    """Decodes one request tensor for a signature input: dtype, then size, then values. Errors name the input."""
    codec = _input_codec(alias, info, proto.dtype)
    dims = _declared_dims(alias, proto.tensor_shape)
    content = proto.tensor_content  # each read of the field copies its bytes
    if content:
        return _from_content(alias, proto.dtype, codec, dims, content)
    field = getattr(proto, codec.field)
    carried, extra = divmod(len(field), codec.per_element)
    count = _typed_count(alias, dims, carried, extra, codec)
    if codec.np_dtype is None:
        values = np.empty(carried, dtype=object)
        values[:] = list(field)
    else:
        values = _typed_values(alias, field, codec)
    return _filled(values, count, codec).reshape(dims)


def raw_to_ndarray(alias: str, info: meta_graph_pb2.TensorInfo, tensor: RawTensor) -> np.ndarray:
    """proto_to_ndarray for a tensor a front end took apart: the same checks, errors and result."""
    codec = _input_codec(alias, info, tensor.dtype)
    dims = _checked_dims(alias, tensor.dims)
    if tensor.in_content:
        return _from_content(alias, tensor.dtype, codec, dims, tensor.data)
    if tensor.dtype not in RAW_VALUE_DTYPES:
        raise invalid_argument(f"input tensor '{alias}': dtype {dtype_name(tensor.dtype)} cannot come as raw values")
    carried, extra = divmod(len(tensor.data), codec.itemsize)
    count = _typed_count(alias, dims, carried, extra, codec)
    return _filled(np.frombuffer(tensor.data, dtype=codec.np_dtype), count, codec).reshape(dims)


def _typed_count(alias: str, dims: list[int], carried: int, extra: int, codec: _Codec) -> int:
    """The element count of a tensor carrying `carried` typed values (and `extra` left over), checked before
    anything is decoded."""
    count = _check_size(alias, dims, carried, codec.itemsize)
    if extra or carried > count:
        raise invalid_argument(f"tensor parsing error: {alias} ({carried} values for shape {dims})")
    return count


def _input_codec(alias: str, info: meta_graph_pb2.TensorInfo, dtype_enum: int) -> _Codec:
    if dtype_enum != info.dtype:  # the common case (equal) costs one comparison; check_dtype covers ref types
        check_dtype(alias, info, dtype_enum)
    codec = _CODECS.get(dtype_enum)
    if codec is None:
        raise invalid_argument(f"input tensor '{alias}': dtype {dtype_name(dtype_enum)} is not supported")
    return codec


def _from_content(alias: str, dtype_enum: int, codec: _Codec, dims: list[int], content) -> np.ndarray:
    if codec.np_dtype is None:
        raise invalid_argument(f"input tensor '{alias}': string tensors must carry their values in string_val")
    itemsize = codec.itemsize
    count = _check_size(alias, dims, len(content) // itemsize, itemsize)
    if len(content) != count * itemsize:
        raise invalid_argument(f"input tensor '{alias}': tensor_content holds {len(content)} bytes, "
                               f"shape {dims} of {dtype_name(dtype_enum)} needs {count * itemsize}")
    return np.frombuffer(content, dtype=codec.np_dtype).reshape(dims)


def _filled(values: np.ndarray, count: int, codec: _Codec) -> np.ndarray:
    """TensorFlow's Tensor::FromProto: a tensor carrying fewer values than its shape repeats the last one, or
    zeros (empty strings) if it carries none."""
    carried = len(values)
    if carried >= count:
        return values
    fill = values[-1] if carried else (b"" if codec.np_dtype is None else 0)
    return np.concatenate([values, np.full(count - carried, fill, dtype=values.dtype)])


def _typed_values(alias: str, field, codec: _Codec) -> np.ndarray:
    """A typed field's values as the codec's dtype; ints wrap to narrower types as TensorFlow's casts do."""
    try:
        if codec.field == "int_val":
            return np.array(field, dtype=np.int64).astype(codec.np_dtype)
        values = np.array(field, dtype=codec.via or codec.np_dtype)
    except (OverflowError, ValueError) as exc:
        raise invalid_argument(f"tensor parsing error: {alias} ({exc})") from exc
    return values.view(codec.np_dtype) if codec.via is not None else values


def decode_inputs(signature, tensors: Mapping[str, tensor_pb2.TensorProto | RawTensor]) -> dict[str, np.ndarray]:
    """A request's inputs (signature defaults filling absent ones), names checked before anything is decoded."""
    signature.check_input_names(list(tensors))
    decoded = {}
    for alias, info in signature.inputs.items():
        tensor = tensors.get(alias)  # one map lookup: each builds a message wrapper
        if tensor is None:
            decoded[alias] = proto_to_ndarray(alias, info, signature.defaults[alias])
        elif type(tensor) is RawTensor:
            decoded[alias] = raw_to_ndarray(alias, info, tensor)
        else:
            decoded[alias] = proto_to_ndarray(alias, info, tensor)
    return decoded


def dtype_enum_of(array: np.ndarray) -> int | None:
    """The TensorFlow dtype an array is returned as (strings and objects as DT_STRING); None if there is none."""
    return _STRING if array.dtype.kind in "OSU" else _ENUM_BY_NUMPY.get(array.dtype)


def fill_tensor_proto(proto: tensor_pb2.TensorProto, array: np.ndarray, as_tensor_content: bool = False) -> None:
    """An output as TF Serving returns it, written into an empty TensorProto in place (a response's map entry, so no
    copy of the values): typed fields (Tensor::AsProtoField), or tensor_content on request."""
    array = np.asarray(array)
    enum = dtype_enum_of(array)
    if enum is None:
        raise invalid_argument(f"output dtype {array.dtype} cannot be returned")
    codec = _CODECS[enum]
    proto.dtype = enum
    proto.tensor_shape.SetInParent()  # a scalar's empty shape is still set, as Tensor::AsProtoField sets it
    dims = proto.tensor_shape.dim
    for size in array.shape:
        dims.add(size=size)
    flat = array.ravel()
    if enum == _STRING:
        proto.string_val.extend(value if isinstance(value, bytes) else str(value).encode() for value in flat)
    elif as_tensor_content:
        proto.tensor_content = np.ascontiguousarray(flat).tobytes()
    elif codec.via is not None:
        getattr(proto, codec.field).extend(flat.view(codec.via).tolist())
    else:
        getattr(proto, codec.field).extend(flat.tolist())


def json_to_ndarray(name: str, value: object, dtype_enum: int) -> np.ndarray:
    """A REST value (nested lists of numbers, or of strings / {"b64": ...} for DT_STRING) as an array of the
    signature's dtype, refusing lossy conversions."""
    dtype_enum = base_dtype(dtype_enum)
    if dtype_enum == _STRING:
        return _json_strings(name, value)
    codec = _CODECS.get(dtype_enum)
    if codec is None or codec.np_dtype is None or codec.per_element != 1:
        raise invalid_argument(f"input '{name}': dtype {dtype_name(dtype_enum)} is not supported over REST here")
    np_dtype = codec.np_dtype
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


def is_b64_value(value: object) -> bool:
    """{"b64": "..."}: one binary string in TF Serving's REST JSON, not an object of named inputs."""
    return isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str)


def _json_strings(name: str, value: object) -> np.ndarray:
    """Strings as UTF-8 bytes, {"b64": "..."} objects as their decoded bytes (TF Serving's REST encoding)."""
    def leaf(item: object) -> bytes:
        if isinstance(item, str):
            return item.encode("utf-8")
        if is_b64_value(item):
            try:
                return base64.b64decode(item["b64"], validate=True)
            except ValueError as exc:
                raise invalid_argument(f"JSON Value: {item} not formatted correctly for base64 data") from exc
        raise invalid_argument(f"input '{name}' expects strings (or {{\"b64\": ...}} objects), got "
                               f"{type(item).__name__}")

    def shape_of(item: object) -> list[int]:
        return [len(item), *shape_of(item[0])] if isinstance(item, list) and item else (
            [0] if isinstance(item, list) else [])

    dims = shape_of(value)
    flat: list[bytes] = []

    def walk(item: object, depth: int) -> None:
        if depth == len(dims):
            flat.append(leaf(item))
            return
        if not isinstance(item, list) or len(item) != dims[depth]:
            raise invalid_argument(f"input '{name}' is not a rectangular list of strings")
        for child in item:
            walk(child, depth + 1)

    walk(value, 0)
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array.reshape(dims)


def json_value(alias: str, array: np.ndarray) -> object:
    """An output as REST JSON: numbers as lists; strings as UTF-8 text, or {"b64": ...} where the alias ends in
    "_bytes" or the bytes are not UTF-8 (TF Serving's rule)."""
    if array.dtype != object and array.dtype.kind not in "SU":
        return array.tolist()

    def text(value: bytes) -> object:
        if not alias.endswith("_bytes"):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return {"b64": base64.b64encode(value).decode("ascii")}

    return np.vectorize(text, otypes=[object])(array).tolist() if array.size else array.tolist()
