"""Hostile pytorch_model.bin files: every tensor must lie inside its storage, checked before it is read.

Each file is read in a child process under an address-space limit, so that a regression (a copy of the reader's
heap, a segfault, a huge allocation) fails the test instead of the machine.
"""

from __future__ import annotations

import collections
import io
import json
import pickle
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from bertserve.export import torch_pickle

torch = pytest.importorskip("torch")

ADDRESS_SPACE_LIMIT = 3 << 30  # the reader and NumPy fit easily; a hostile expansion does not


class _Storage:
    """A float32 storage as torch pickles it: a persistent id naming a raw file of the archive."""

    def __init__(self, key: str, numel: int):
        self.key, self.numel = key, numel


class _Tensor:
    def __init__(self, storage: _Storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


class _CraftingPickler(pickle.Pickler):
    """Pickles _Tensor exactly as torch.save pickles a tensor, with whatever offset, size and stride it holds."""

    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, _Tensor):
            return torch._utils._rebuild_tensor_v2, (obj.storage, obj.offset, obj.size, obj.stride, False,
                                                     collections.OrderedDict())
        return NotImplemented


def write_torch_file(path, tensors: dict[str, _Tensor], files: dict[str, bytes]) -> str:
    """A zip-format torch file with data.pkl holding `tensors` and data/<key> holding `files`."""
    buffer = io.BytesIO()
    _CraftingPickler(buffer, protocol=2).dump(collections.OrderedDict(tensors))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", buffer.getvalue())
        for key, raw in files.items():
            archive.writestr(f"archive/data/{key}", raw)
    return str(path)


def _limited(address_space: int, command: list[str]) -> list[str]:
    """`command` under an address-space limit set by util-linux's prlimit, which then execs it: a preexec_fn would
    fork this process, whose gRPC threads (left by other tests) can abort the forked child before it execs."""
    return ["prlimit", f"--as={address_space}", *command]


def read_in_child(path: str) -> subprocess.CompletedProcess:
    """load_state_dict(path) in a child process under ADDRESS_SPACE_LIMIT; prints the arrays' sums if it loads."""
    script = ("import sys\nfrom bertserve.export import torch_pickle\n"
              "state = torch_pickle.load_state_dict(sys.argv[1])\n"
              "print({name: float(value.sum()) for name, value in state.items()})\n")
    return subprocess.run(_limited(ADDRESS_SPACE_LIMIT, [sys.executable, "-c", script, path]), capture_output=True,
                          text=True, timeout=120)


FOUR_FLOATS = np.arange(4, dtype=np.float32).tobytes()


@pytest.mark.parametrize("case, offset, size, stride, message", [
    ("past_its_storage", 0, (16,), (1,), r"reaches element 15 of storage 0, which holds 4 elements"),
    ("offset_past_its_storage", 3, (2,), (1,), r"reaches element 4 of storage 0, which holds 4 elements"),
    ("huge_stride", 0, (2, 2), (1 << 40, 1), r"reaches element 1099511627777 of storage 0"),
    ("negative_offset", -3, (2,), (1,), r"tensor storage offset must be a non-negative integer, got -3"),
    ("negative_stride", 3, (4,), (-1,), r"tensor stride entry must be a non-negative integer, got -1"),
    ("overlapping_strides", 0, (1 << 31,), (0,), r"has 2147483648 elements, more than its storage 0 holds \(4\)"),
    ("rank_mismatch", 0, (2, 2), (1,), r"size \[2, 2\] and stride \[1\] differ in rank"),
    ("float_size", 0, (2.5,), (1,), r"tensor size entry must be a non-negative integer, got 2.5"),
])
def test_tensor_outside_its_storage_is_refused(tmp_path, case, offset, size, stride, message):
    storage = _Storage("0", 4)
    path = write_torch_file(tmp_path / f"{case}.bin", {"weight": _Tensor(storage, offset, size, stride)},
                            {"0": FOUR_FLOATS})
    result = read_in_child(path)
    assert result.returncode == 1, f"exit {result.returncode}, stdout {result.stdout!r}, stderr {result.stderr[-2000:]}"
    assert "TorchFileError" in result.stderr and re.search(message, result.stderr), result.stderr[-2000:]


@pytest.mark.parametrize("numel, raw, message", [
    (1 << 40, FOUR_FLOATS, r"declares 1099511627776 elements of float32 .* but its file holds 16 bytes"),
    (4, FOUR_FLOATS[:12], r"declares 4 elements of float32 \(16 bytes\) but its file holds 12 bytes"),
])
def test_storage_length_must_match_its_file(tmp_path, numel, raw, message):
    path = write_torch_file(tmp_path / "storage.bin", {"weight": _Tensor(_Storage("0", numel), 0, (4,), (1,))},
                            {"0": raw})
    with pytest.raises(torch_pickle.TorchFileError, match=message):
        torch_pickle.load_state_dict(path)


def test_compressed_storage_is_refused(tmp_path):
    path = tmp_path / "deflated.bin"
    buffer = io.BytesIO()
    _CraftingPickler(buffer, protocol=2).dump({"weight": _Tensor(_Storage("0", 1 << 20), 0, (1 << 20,), (1,))})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", buffer.getvalue())
        archive.writestr("archive/data/0", bytes(4 << 20), compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(torch_pickle.TorchFileError, match=r"storage file archive/data/0 is compressed"):
        torch_pickle.load_state_dict(str(path))


def test_missing_storage_file_and_non_tensor_entries_are_refused(tmp_path):
    missing = write_torch_file(tmp_path / "missing.bin", {"weight": _Tensor(_Storage("7", 4), 0, (4,), (1,))}, {})
    with pytest.raises(torch_pickle.TorchFileError, match=r"storage 7 has no file archive/data/7"):
        torch_pickle.load_state_dict(missing)
    not_tensor = write_torch_file(tmp_path / "plain.bin", {"weight": 3}, {})
    with pytest.raises(torch_pickle.TorchFileError, match=r"entry 'weight' is a int, not a named tensor"):
        torch_pickle.load_state_dict(not_tensor)


def test_views_that_torch_saves_still_load(tmp_path):
    """Transposed, sliced and tied tensors (shared storages, non-contiguous strides, offsets) are real weights."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"plain": base, "transposed": base.t(), "sliced": base[1:3, 2:5], "tied": base,
             "half": base.half()[2], "bf16": base.bfloat16()[:, 1]}
    path = tmp_path / "views.bin"
    torch.save(state, path)
    loaded = torch_pickle.load_state_dict(str(path))
    assert sorted(loaded) == sorted(state)
    for name, tensor in state.items():
        np.testing.assert_array_equal(loaded[name], tensor.float().numpy(), err_msg=name)


def test_export_refuses_a_tensor_past_its_storage(tmp_path):
    """Through `bertserve export`: the exporter exits non-zero naming the tensor, instead of exporting heap bytes."""
    model_dir = tmp_path / "hf"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["BertForSequenceClassification"], "vocab_size": 16, "hidden_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 8,
        "type_vocab_size": 2, "num_labels": 1}), encoding="utf-8")
    (model_dir / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                   + [f"tok{i}" for i in range(11)]) + "\n", encoding="utf-8")
    write_torch_file(model_dir / "pytorch_model.bin",
                     {"bert.embeddings.word_embeddings.weight": _Tensor(_Storage("0", 4), 0, (16, 8), (8, 1))},
                     {"0": FOUR_FLOATS})
    result = subprocess.run(
        _limited(8 << 30, [sys.executable, "-m", "bertserve.cli", "export", str(model_dir), str(tmp_path / "out"),
                           "--model", "hostile", "--version", "1"]), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "reaches element 127 of storage 0, which holds 4 elements" in result.stderr, result.stderr[-3000:]
