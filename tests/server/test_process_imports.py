"""The server process runs without JAX even where it is installed: TensorFlow would import it, and its callback on
Python's garbage collector would then run on the event loop's thread."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_the_server_process_refuses_jax_and_tensorflow_goes_on_without_it(tmp_path):
    # An installed "jax" that does what JAX does on import: adds a garbage-collection callback.
    package = tmp_path / "jax"
    package.mkdir()
    (package / "__init__.py").write_text("import gc\ndef _xla_gc_callback(*args): pass\n"
                                         "gc.callbacks.append(_xla_gc_callback)\ndef jit(f): return f\n")
    script = textwrap.dedent("""
        import gc, sys
        import jax  # importable before the server's module is
        del sys.modules["jax"]
        gc.callbacks.clear()
        import bertserve.server.main
        import tensorflow as tf
        from tensorflow.lite.python import util
        try:
            import jax
        except ModuleNotFoundError as refused:
            print("refused:", refused)
        print("jax loaded:", "jax" in sys.modules, "callbacks:", len(gc.callbacks), "tf.lite jit:", util._jit)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "refused: bertserve serve does not load jax" in lines
    assert "jax loaded: False callbacks: 0 tf.lite jit: None" in lines
