"""What the server process refuses to import: JAX.

TensorFlow imports JAX when it is installed (tensorflow/lite/python/util.py, reached from `import tensorflow`
through compat.v1.lite), and JAX then adds a callback to Python's garbage collector that runs on every collection,
on whichever thread triggers it: in the server, mostly the event loop's. Nothing here runs JAX. On the GPU machine,
whose Python has JAX, that callback took 4.9 % of the event loop's samples at 6,000 queries/s
(bench/gpu/stack_sampler.py names the import chain and the callbacks)."""

from __future__ import annotations

import importlib.abc
import sys

REFUSED = ("jax", "jaxlib")


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ARG002 - the finder protocol's signature
        if name.split(".", 1)[0] in REFUSED:
            raise ModuleNotFoundError(f"bertserve serve does not load {name}", name=name)
        return None


def refuse_jax() -> None:
    """Before TensorFlow is imported: TensorFlow's own `except ImportError` then goes on without JAX."""
    if not any(isinstance(finder, _Refuse) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Refuse())
