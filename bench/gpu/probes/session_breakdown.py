"""Where a small batch's time goes on TF Serving's session path: the fused fp16 chit-chat graph on GPU:0 timed
as a SavedModel, whole in a TF1 graph and cut short (after the embedding, after the encoder), frozen (weights as
constants: no variable nodes), next to TensorFlow's own floor (a trivial graph on CPU and on GPU). One process per op library: run it
once per build to compare them. Usage: session_breakdown.py --out FILE [--batches 1,32] [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tf_serving_path  # noqa: E402
from tf_serving_path import export, inputs_for, timed  # noqa: E402

from bertserve import custom_ops  # noqa: E402
from bertserve.bench.gpu.lengths import lengths_for  # noqa: E402
from bertserve.export import graph  # noqa: E402
from bertserve.export.weights import CHITCHAT_CONFIG, BertWeights  # noqa: E402
from bertserve.model_dir import INPUT_NAMES  # noqa: E402


def callable_for(session: tf.compat.v1.Session, feeds: list[str], fetch: str):
    options = config_pb2.CallableOptions(feed=feeds, fetch=[fetch])
    return session._make_callable_from_options(options)  # noqa: SLF001 - Session::MakeCallable, as the server


def floor_paths(device: str) -> tuple[tf.compat.v1.Session, list[str], str]:
    """Three int32 feeds summed on `device`: the session path's cost with no model."""
    g = tf.Graph()
    with g.as_default():
        feeds = [tf.compat.v1.placeholder(tf.int32, [None, 32], name=n) for n in INPUT_NAMES]
        with tf.device(device):
            out = tf.reduce_sum(tf.cast(feeds[0] + feeds[1] + feeds[2], tf.float32), axis=1)
    return tf.compat.v1.Session(graph=g), [f.name for f in feeds], out.name


def model_paths(weights: BertWeights, frozen: bool) -> dict[str, tuple[tf.compat.v1.Session, list[str], str]]:
    """The fused fp16 graph as the export builds it, in a TF1 graph of its own (no function call): fetched at the
    scores, and cut after the embedding and after the encoder (each reduced to one float on GPU:0). Frozen: the
    weights are constants, so the graph has no variable nodes."""
    g = tf.Graph()
    with g.as_default():
        arrays = {n: v.astype(np.float16) for n, v in graph.fused_arrays(weights).items()}
        w = {n: tf.constant(v, name=n) if frozen else tf.Variable(v, trainable=False, name=n)
             for n, v in arrays.items()}
        feeds = {n: tf.compat.v1.placeholder(tf.int32, [None, 32], name=n) for n in INPUT_NAMES}
        scores = graph._fused_serve(weights, True)(w, **feeds)  # noqa: SLF001 - the export's graph
        names = [feeds[n].name for n in INPUT_NAMES]
        prefix = "frozen" if frozen else "variables"
        paths = {f"{prefix}_scores": scores.name}
        with tf.device("/GPU:0"):
            for kind in ("BertEmbedding", "BertEncoder"):
                op = next(o for o in g.get_operations() if o.type == kind)
                paths[f"{prefix}_to_{kind}"] = tf.reduce_sum(tf.cast(op.outputs[0][:1], tf.float32)).name
        init = tf.compat.v1.global_variables_initializer()
    session = tf.compat.v1.Session(graph=g)
    session.run(init)
    return {key: (session, names, fetch) for key, fetch in paths.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    custom_ops.load_op_library()
    weights = BertWeights.random(CHITCHAT_CONFIG, seed=0)
    rng = np.random.default_rng(7)
    result = {"library": os.environ.get("BERTSERVE_OPS_LIBRARY", ""), "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        saved = tf_serving_path.SessionPath(export(weights, "fused", "fp16", os.path.join(tmp, "m")))
        paths = {**model_paths(weights, frozen=False), **model_paths(weights, frozen=True),
                 "floor_cpu": floor_paths("/CPU:0"), "floor_gpu": floor_paths("/GPU:0")}
        for batch in map(int, args.batches.split(",")):
            inputs = inputs_for(lengths_for("U8_32", batch, rng), CHITCHAT_CONFIG.vocab_size, rng)
            row = {"batch": batch, "savedmodel": timed(lambda: saved(inputs), args.calls, None)}
            for name, (session, feeds, fetch) in paths.items():
                fn = callable_for(session, feeds, fetch)
                row[name] = timed(lambda: fn(*(inputs[n] for n in INPUT_NAMES)), args.calls, None)
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
