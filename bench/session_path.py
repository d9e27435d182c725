"""Per-batch cost of running a signature: the server's Session path against the calls it replaced.

The server loads every SavedModel into a tf.compat.v1 Session and runs a signature as one C++ callable
(Session::MakeCallable, feeds and fetches resolved at load). This times one call, NumPy in and out, of:

- session_callable: bertserve.server.servable.Signature.run (what a batch costs the server now);
- session_run: Session.run with a feed_dict by tensor name (Python-side feed checks on every call);
- saved_model_function: tf.saved_model.load(...).signatures[key](**tf.constant inputs), then .numpy() (the
  server's previous path);

on the tiny ranker of bench/serve_overhead.py (1 layer, hidden 32: model time is small, the overhead shows) and,
when the op library is built, its fused export, at batch 1 and 32 of seq 32. Calls are interleaved so that the
shared CPUs' noise hits every path alike: quote the differences and ratios.

Run: .venv/bin/python bench/session_path.py [--calls N] [--out bench/results/session_path.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import tempfile

import numpy as np
import tensorflow as tf

from bertserve import custom_ops
from bertserve.bench.machine import machine
from bertserve.bench.serve_overhead import SEQ, TINY_CONFIG, export, interleaved_latency_us
from bertserve.export.saved import warmup_inputs
from bertserve.server.servable import LoadedVersion

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_model(path: str, calls: int) -> dict:
    version = LoadedVersion("tiny", 1, path, {"serve"})
    signature = version.signature("serving_default")
    function = tf.saved_model.load(path).signatures["serving_default"]
    feeds = {signature.inputs[alias].name: alias for alias in signature.inputs}
    fetches = {alias: info.name for alias, info in signature.outputs.items()}
    results = {}
    for batch in (1, 32):
        inputs = warmup_inputs(TINY_CONFIG, batch, SEQ, seed=batch)
        expected = function(**{k: tf.constant(v) for k, v in inputs.items()})["scores"].numpy()
        np.testing.assert_allclose(signature.run(inputs)["scores"], expected, rtol=0, atol=1e-5)
        results[f"batch_{batch}"] = interleaved_latency_us({
            "session_callable": lambda: signature.run(inputs),
            "session_run": lambda: version.bundle.session.run(
                fetches, feed_dict={name: inputs[alias] for name, alias in feeds.items()}),
            "saved_model_function": lambda: {k: v.numpy() for k, v in function(
                **{k: tf.constant(v) for k, v in inputs.items()}).items()},
        }, calls)
        p50 = {name: row["p50_us"] for name, row in results[f"batch_{batch}"].items()}
        results[f"batch_{batch}"]["saved_model_minus_callable_p50_us"] = round(
            p50["saved_model_function"] - p50["session_callable"], 1)
        results[f"batch_{batch}"]["session_run_minus_callable_p50_us"] = round(
            p50["session_run"] - p50["session_callable"], 1)
    version.release_model()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="timed calls of each path per batch size")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "bench", "results", "session_path.json"))
    args = parser.parse_args()
    results = {"machine": {**machine(), "python": platform.python_version(), "tensorflow": tf.__version__,
                           "note": "other work shares these cores; compare paths within one run"},
               "model": f"1 layer, hidden 32, seq {SEQ}, random weights; p50/p99 of one call, NumPy in and out"}
    with tempfile.TemporaryDirectory() as base:
        for variant in ("stock", "fused"):
            if variant == "fused" and not custom_ops.library_loads():
                results["fused_skipped"] = "op library not loadable"
                continue
            path = os.path.join(export(base, f"tiny_{variant}", TINY_CONFIG, variant), "1")
            results[variant] = time_model(path, args.calls)
            print(json.dumps({variant: results[variant]}, indent=1), flush=True)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
