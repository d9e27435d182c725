"""Reads a PyTorch `pytorch_model.bin` state dict into NumPy arrays without importing torch.

The file is torch's zip format: `<archive>/data.pkl` (a pickle that rebuilds tensors from storages) plus one
raw little-endian file per storage under `<archive>/data/`. Only the handful of globals a state dict needs are
allowed, so a pickle that tries to call anything else is refused rather than executed.

Every value the pickle supplies is untrusted: a storage's declared length must match its file, and each tensor's
offset, sizes and strides must address elements inside its storage, checked before the strided view is made,
so no tensor can read memory outside its storage.
"""

from __future__ import annotations

import collections
import math
import pickle
import zipfile
from typing import Any

import numpy as np

# torch storage class name -> NumPy dtype of its raw bytes (bfloat16 is widened after reading).
_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "HalfStorage": np.float16, "DoubleStorage": np.float64,
    "BFloat16Storage": np.uint16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class TorchFileError(pickle.UnpicklingError):
    """A pytorch_model.bin whose contents do not describe a well-formed state dict."""


class _Storage:
    def __init__(self, key: str, name: str, data: np.ndarray):
        self.key, self.name, self.data = key, name, data


def _non_negative_int(value: Any, what: str) -> int:
    # bool is an int subclass; a pickle may also hand over floats or strings where torch writes ints.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TorchFileError(f"pytorch_model.bin: {what} must be a non-negative integer, got {value!r}")
    return value


def _int_tuple(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple):
        raise TorchFileError(f"pytorch_model.bin: tensor {what} must be a tuple, got {type(value).__name__}")
    return tuple(_non_negative_int(v, f"tensor {what} entry") for v in value)


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_unused) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2: the elements offset + sum(i_k * stride_k) of the storage, copied.

    Refuses a tensor that would address an element outside its storage, or that has more elements than its
    storage (overlapping strides, which no saved weight has: they would let a tiny file expand to any size).
    """
    if not isinstance(storage, _Storage):
        raise TorchFileError(f"pytorch_model.bin: a tensor is rebuilt from {type(storage).__name__}, not a storage")
    offset = _non_negative_int(offset, "tensor storage offset")
    size, stride = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    if len(size) != len(stride):
        raise TorchFileError(f"pytorch_model.bin: tensor size {list(size)} and stride {list(stride)} differ in rank")
    data = storage.data
    count = math.prod(size)
    if count:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= data.size:
            raise TorchFileError(
                f"pytorch_model.bin: tensor of size {list(size)}, stride {list(stride)} at offset {offset} reaches "
                f"element {last} of storage {storage.key}, which holds {data.size} elements")
        if count > data.size:
            raise TorchFileError(
                f"pytorch_model.bin: tensor of size {list(size)}, stride {list(stride)} has {count} elements, more "
                f"than its storage {storage.key} holds ({data.size}): overlapping strides are not a saved weight")
    # Safe now: every element the view addresses lies in [offset, last] inside the storage.
    view = np.lib.stride_tricks.as_strided(data[offset:], shape=size, strides=tuple(s * data.itemsize for s in stride))
    array = np.array(view)
    if storage.name == "BFloat16Storage":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array


def _rebuild_parameter(data: Any, *_unused) -> np.ndarray:
    if not isinstance(data, np.ndarray):
        raise TorchFileError(f"pytorch_model.bin: a parameter wraps {type(data).__name__}, not a tensor")
    return data


class _StateDictUnpickler(pickle.Unpickler):
    def __init__(self, archive: zipfile.ZipFile, root: str, file):
        super().__init__(file)
        self._archive, self._root = archive, root
        self._storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str):
        allowed = {("collections", "OrderedDict"): collections.OrderedDict,
                   ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
                   ("torch._utils", "_rebuild_parameter"): _rebuild_parameter}
        if (module, name) in allowed:
            return allowed[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return name
        raise pickle.UnpicklingError(f"pytorch_model.bin refers to {module}.{name}, which a plain state dict "
                                     f"does not contain; refusing to load it")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise TorchFileError(f"unsupported persistent id {pid!r} in pytorch_model.bin")
        _kind, storage_name, key, _location, numel = pid
        if storage_name not in _STORAGE_DTYPES:
            raise TorchFileError(f"pytorch_model.bin: unsupported storage type {storage_name!r}")
        if not isinstance(key, str):
            raise TorchFileError(f"pytorch_model.bin: storage key {key!r} is not a string")
        numel = _non_negative_int(numel, f"element count of storage {key}")
        cached = self._storages.get(key)
        if cached is not None:
            if cached.name != storage_name or cached.data.size != numel:
                raise TorchFileError(f"pytorch_model.bin: storage {key} is declared twice with different types "
                                     f"or lengths")
            return cached
        storage = _Storage(key, storage_name, self._read_storage(key, np.dtype(_STORAGE_DTYPES[storage_name]), numel))
        self._storages[key] = storage
        return storage

    def _read_storage(self, key: str, dtype: np.dtype, numel: int) -> np.ndarray:
        """The storage's file, which must hold exactly numel elements (checked before it is read)."""
        name = f"{self._root}/data/{key}"
        try:
            info = self._archive.getinfo(name)
        except KeyError:
            raise TorchFileError(f"pytorch_model.bin: storage {key} has no file {name} in the archive") from None
        # torch writes storages uncompressed; a compressed one could inflate far beyond the file's size.
        if info.compress_type != zipfile.ZIP_STORED:
            raise TorchFileError(f"pytorch_model.bin: storage file {name} is compressed; torch never writes it so")
        if info.file_size != numel * dtype.itemsize:
            raise TorchFileError(f"pytorch_model.bin: storage {key} declares {numel} elements of {dtype} "
                                 f"({numel * dtype.itemsize} bytes) but its file holds {info.file_size} bytes")
        return np.frombuffer(self._archive.read(info), dtype=dtype)


def load_state_dict(path: str) -> dict[str, np.ndarray]:
    """name -> array for a state dict saved by torch.save (zip format, torch >= 1.6).

    Raises pickle.UnpicklingError (TorchFileError for malformed contents) naming what does not fit."""
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a zip-format torch file (saved by torch < 1.6?); re-save it with a recent "
                         f"torch or as model.safetensors")
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if not pickles:
            raise ValueError(f"{path}: no data.pkl inside the archive")
        root = pickles[0][:-len("/data.pkl")]
        with archive.open(pickles[0]) as f:
            state = _StateDictUnpickler(archive, root, f).load()
    if not isinstance(state, dict):
        raise TorchFileError(f"{path}: holds a {type(state).__name__}, not a state dict")
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, np.ndarray):
            raise TorchFileError(f"{path}: entry {name!r} is a {type(value).__name__}, not a named tensor")
    return dict(state)
