"""The ops under an address-space limit (RLIMIT_AS), each case in a subprocess so that a regression fails the test,
not the machine: memory the CPU kernel cannot get is a ResourceExhausted error, never a crash, and attention over
one long row needs memory linear in its length (no len x len scores, whose int count overflows from 46,341)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Run in a fresh interpreter: builds the inputs and warms the op up (threads, their stacks and malloc arenas exist
# before the limit), then allows only HEADROOM_MB more address space than the process holds and runs CASE.
SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import tensorflow as tf
    from bertserve import custom_ops as ops
    from bertserve.export.graph import fused_arrays
    from bertserve.export.weights import BertConfig, BertWeights

    def encoder_weights(hidden, heads, intermediate, layers):
        config = BertConfig(vocab_size=8, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                            intermediate_size=intermediate, max_position_embeddings=8, type_vocab_size=1)
        arrays = fused_arrays(BertWeights.random(config, seed=0))
        return {name: tf.constant(arrays[name]) for name in ops.ENCODER_WEIGHT_NAMES}

    def limit_address_space(headroom_mb):
        with open("/proc/self/statm") as f:
            held = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (held + headroom_mb * 2**20, resource.RLIM_INFINITY))

    def encode(hidden, cu_seqlens, weights, heads, **attrs):
        return ops.bert_encoder(hidden, cu_seqlens, **weights, num_heads=heads, **attrs).numpy()
""")

LONG_ROW = """
tokens = 46_400  # one row: its len * len scores would overflow int and take 8.6 GB
weights = encoder_weights(hidden=4, heads=1, intermediate=8, layers=1)
token = np.random.default_rng(1).standard_normal((1, 4)).astype(np.float32)
one = encode(token, np.array([0, 1], np.int32), weights, heads=1)
hidden = tf.constant(np.repeat(token, tokens, axis=0))
cu_seqlens = tf.constant(np.array([0, tokens], np.int32))
limit_address_space(headroom_mb=1024)
out = encode(hidden, cu_seqlens, weights, heads=1)
# Identical tokens attend uniformly to identical values: every output is the one-token row's output.
err = float(np.abs(out - one).max())
print("max difference", err)
sys.exit(0 if out.shape == (tokens, 4) and err < 1e-3 else 1)
"""

PACKING_FAILS = """
weights = encoder_weights(hidden=256, heads=4, intermediate=1024, layers=4)  # 12.6 MB once packed
hidden = tf.constant(np.ones((3, 256), np.float32))
cu_seqlens = tf.constant(np.array([0, 3], np.int32))
encode(hidden, cu_seqlens, encoder_weights(hidden=256, heads=4, intermediate=1024, layers=1), heads=4)  # warm-up
limit_address_space(headroom_mb=4)
try:
    encode(hidden, cu_seqlens, weights, heads=4)
    sys.exit(1)
except tf.errors.ResourceExhaustedError as e:
    print("ResourceExhausted:", e.message)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
sys.exit(0 if np.isfinite(encode(hidden, cu_seqlens, weights, heads=4)).all() else 1)  # the kernel still works
"""

WORKSPACE_FAILS = """
weights = encoder_weights(hidden=64, heads=2, intermediate=128, layers=1)
encode(np.ones((3, 64), np.float32), np.array([0, 3], np.int32), weights, heads=2)  # warm-up
hidden = tf.constant(np.ones((40_000, 64), np.float32))
cu_seqlens = tf.constant(np.array([0, 40_000], np.int32))
limit_address_space(headroom_mb=8)  # less than one [40000, 64] float tensor (10 MB)
try:
    encode(hidden, cu_seqlens, weights, heads=2)
except tf.errors.ResourceExhaustedError as e:
    print("ResourceExhausted:", e.message)
    sys.exit(0)
sys.exit(1)
"""


def run_limited(case: str) -> subprocess.CompletedProcess:
    # Large blocks always mmapped and unmapped when freed (no dynamic threshold), so that memory freed before the
    # limit is not reused under it and the headroom is what the case gets.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
    return subprocess.run([sys.executable, "-c", SCRIPT + case], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.parametrize("case", [LONG_ROW, PACKING_FAILS, WORKSPACE_FAILS],
                         ids=["long_row_attention_is_linear", "weight_packing_fails", "workspace_fails"])
def test_under_address_space_limit(case):
    result = run_limited(case)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
