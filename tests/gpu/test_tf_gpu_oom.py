"""A GPU allocation failure answers RESOURCE_EXHAUSTED, not Internal: in a process whose GPU:0 is a logical device of
MEMORY_LIMIT_MB (tf.config.set_logical_device_configuration, before TensorFlow starts its GPU, hence a subprocess), the
chit-chat fp16 model serves a small batch, then a batch whose encoder arena cannot fit (LARGE_ROWS x 32 tokens: its
embedding output fits, the encoder's workspace of ~10 KB a token does not), then the small batch again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tf_gpu_testing import gpu_only, needs_device

pytestmark = [needs_device, gpu_only]

MEMORY_LIMIT_MB = 1024
LARGE_ROWS = 4096

CHILD = r"""
import json, sys
import numpy as np
import tensorflow as tf
path, limit_mb, large_rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
gpu = tf.config.list_physical_devices("GPU")[0]
tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mb)])
from bertserve import custom_ops
custom_ops.load_op_library()
with tf.device("/GPU:0"):
    loaded = tf.saved_model.load(path)
serve = loaded.signatures["serving_default"]
def run(rows):
    ids = np.full((rows, 32), 2000, np.int32)
    return serve(input_ids=tf.constant(ids), input_mask=tf.constant(np.ones_like(ids)),
                 segment_ids=tf.constant(np.zeros_like(ids)))["scores"].numpy()
small = run(4)
result = {"small": "ok"}
try:
    run(large_rows)
    result["large"] = "no error"
except tf.errors.OpError as e:
    result["large"], result["message"] = type(e).__name__, e.message.splitlines()[0][:300]
result["small_after_unchanged"] = bool(np.array_equal(run(4), small))
print("RESULT " + json.dumps(result))
"""


def test_arena_that_does_not_fit_answers_resource_exhausted(tf_served):
    path = tf_served("chitchat", "fp16").path
    child = subprocess.run([sys.executable, "-c", CHILD, path, str(MEMORY_LIMIT_MB), str(LARGE_ROWS)],
                           capture_output=True, text=True, timeout=600, env=os.environ.copy())
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    assert child.returncode == 0 and lines, f"the child failed ({child.returncode}): {child.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    print(f"GPU:0 limited to {MEMORY_LIMIT_MB} MB, batch {LARGE_ROWS} x 32 tokens: {result}")
    assert result["large"] == "ResourceExhaustedError"
    assert "arena" in result["message"], "another allocation failed first: the arena's path went unexercised"
    assert result["small_after_unchanged"]
