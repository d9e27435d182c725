"""Loads op libraries into TensorFlow in the given order and prints, as JSON, the kernels registered for the ops
they register: {op: {device: [constraints, ...]}}, each constraint set a {attr: [DataType names]} dict.

Run as a script in a fresh process (an op library registers its ops once per process):

    python registered_kernels.py <library.so> [<library.so> ...]
"""

from __future__ import annotations

import json
import sys


def kernels_by_device(op: str) -> dict[str, list[dict[str, list[str]]]]:
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import kernels

    found: dict[str, list[dict[str, list[str]]]] = {}
    for kernel in kernels.get_registered_kernels_for_op(op).kernel:
        constraints = {c.name: sorted(types_pb2.DataType.Name(t) for t in c.allowed_values.list.type)
                       for c in kernel.constraint}
        found.setdefault(kernel.device_type, []).append(constraints)
    return {device: sorted(sets, key=json.dumps) for device, sets in found.items()}


def load_ops(library: str) -> list[str]:
    """Loads the library as tf.load_op_library does and returns the names of the ops it registered."""
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import pywrap_tf_session

    handle = pywrap_tf_session.TF_LoadLibrary(library)
    try:
        return [op.name for op in op_def_pb2.OpList.FromString(pywrap_tf_session.TF_GetOpList(handle)).op]
    finally:
        pywrap_tf_session.TF_DeleteLibraryHandle(handle)


def main(libraries: list[str]) -> None:
    ops = [op for library in libraries for op in load_ops(library)]
    json.dump({op: kernels_by_device(op) for op in ops}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
