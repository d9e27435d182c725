"""The TF GPU path once in one process, for compute-sanitizer memcheck: the MiniLM fused fp32 and fp16 SavedModels
exported here, loaded on GPU:0 and called at batches 1, 33 and 512 of the carried pool (twice each: a shape's first
call launches the encoder's kernels and captures its graph, the second replays it), plus one bad request of each
kind, which must be refused before any kernel runs.

Usage, on the GPU machine after `source gpu_rig/env.sh` (gpu_rig/run_tf_tests.sh runs it so):
  compute-sanitizer --tool memcheck python3 tests/gpu/memcheck_tf.py
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tf_gpu_inputs import bad_inputs  # noqa: E402
from tf_gpu_testing import TOLERANCE, carried, load_saved_model, max_abs, op_message, reference_dir  # noqa: E402

from bertserve.model_dir import OUTPUT_NAME, SIGNATURE_NAME  # noqa: E402

BATCHES = (1, 33, 512)


def main() -> int:
    folder = reference_dir()
    pool, scores = carried.load_pool(folder), carried.load_scores(folder)
    failures = 0
    for precision in carried.PRECISIONS:
        weights = carried.variant_weights(folder, "minilm", precision)
        reference = scores[f"reference_minilm_{precision}"]
        with tempfile.TemporaryDirectory() as base:
            signature = load_saved_model(carried.export_fused(weights, precision, base)).signatures[SIGNATURE_NAME]
            for batch in BATCHES:
                rows = carried.batch_rows(len(pool["input_ids"]), batch)
                inputs = {name: tf.constant(value) for name, value in carried.take(pool, rows).items()}
                for run in ("first call", "replay"):
                    error = max_abs(signature(**inputs)[OUTPUT_NAME].numpy(), reference[rows])
                    failures += error > TOLERANCE["fp16"]  # sane scores; test_tf_gpu_accuracy holds the targets
                    print(f"minilm {precision} batch {batch} {run}: max abs vs float64 {error:.3e}", flush=True)
            for name, (bad, _) in bad_inputs(carried.take(pool, np.arange(64)), weights.config).items():
                try:
                    signature(**{k: tf.constant(v) for k, v in bad.items()})
                    print(f"minilm {precision} {name}: no error", flush=True)
                    failures += 1
                except tf.errors.InvalidArgumentError as e:
                    print(f"minilm {precision} {name}: InvalidArgument {op_message(e)[:120]}", flush=True)
    print(f"memcheck_tf: {failures} failed checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
