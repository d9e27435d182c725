"""Reads a PyTorch `pytorch_model.bin` state dict into NumPy arrays without importing torch.

The file is torch's zip format: `<archive>/data.pkl` (a pickle that rebuilds tensors from storages) plus one
raw little-endian file per storage under `<archive>/data/`. Only the handful of globals a state dict needs are
allowed, so a pickle that tries to call anything else is refused rather than executed.
"""

from __future__ import annotations

import collections
import pickle
import zipfile

import numpy as np

# torch storage class name -> NumPy dtype of its raw bytes (bfloat16 is widened after reading).
_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "HalfStorage": np.float16, "DoubleStorage": np.float64,
    "BFloat16Storage": np.uint16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class _Storage:
    def __init__(self, name: str, data: np.ndarray):
        self.name, self.data = name, data


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple, stride: tuple, *_unused) -> np.ndarray:
    data = storage.data
    view = np.lib.stride_tricks.as_strided(data[offset:], shape=tuple(size),
                                           strides=tuple(s * data.itemsize for s in stride))
    array = np.array(view)
    if storage.name == "BFloat16Storage":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array


def _rebuild_parameter(data: np.ndarray, *_unused) -> np.ndarray:
    return data


class _StateDictUnpickler(pickle.Unpickler):
    def __init__(self, archive: zipfile.ZipFile, root: str, file):
        super().__init__(file)
        self._archive, self._root = archive, root

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
        kind, storage_name, key, _location, _numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(f"unsupported persistent id {kind!r} in pytorch_model.bin")
        raw = self._archive.read(f"{self._root}/data/{key}")
        return _Storage(storage_name, np.frombuffer(raw, dtype=_STORAGE_DTYPES[storage_name]))


def load_state_dict(path: str) -> dict[str, np.ndarray]:
    """name -> array for a state dict saved by torch.save (zip format, torch >= 1.6)."""
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
    return dict(state)
