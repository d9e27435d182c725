"""The exported ranker timed as TF Serving runs it, on the GPU machine, beside the CUDA core alone.

What users deploy is a SavedModel: TF Serving loads it into a `tf.compat.v1.Session` over the MetaGraph and runs the
signature's tensor names with host tensors in and out. This script exports the chit-chat ranker (random weights
from a seed) as fused fp16, fused fp32 and stock fp16 SavedModels and times, host numpy in and out:
- `session`: tf.compat.v1.saved_model.loader.load + Session::MakeCallable on the signature's tensor names (the
  session path, as server/servable.py's SessionBundle holds it; `session_run` is Session.run with a feed dict);
- `server`: what `bertserve serve` runs per batch (server/servable.py: the token checks, then the same callable);
- `tf2`: tf.saved_model.load + the `serving_default` concrete function;
- `core`: the CUDA core's graph replay through the harness's C ABI (bench/gpu/core.py), device time only, on the same
  lengths: the ceiling the TF path is compared with.
Each headline row (fused fp16, session and server) is the median and P99 of --calls calls after a warmup; the
others stop early where --budget_s runs out.
One traced session call per small batch says where the time goes (per-op host and device times).

Usage (on the GPU machine, from the repository root, after `source gpu_rig/env.sh`):
  python3 bench/gpu/tf_serving_path.py --out $OUT/tf_serving_path.json [--harness_lib .device_carry/cuda/libbertserve_cuda.so]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Callable

import numpy as np
import tensorflow as tf

from bertserve import custom_ops
from bertserve.bench.gpu.lengths import SEQ, lengths_for
from bertserve.export import graph
from bertserve.export.weights import CHITCHAT_CONFIG, BertWeights
from bertserve.model_dir import INPUT_NAMES, OUTPUT_NAME, SIGNATURE_NAME

BATCHES = (1, 8, 32, 128, 512, 2048, 8192)
DISTS = ("U8_32", "all32")
VARIANTS = (("fused", "fp16"), ("stock", "fp16"), ("fused", "fp32"))


def inputs_for(lengths: np.ndarray, vocab: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The signature's three int32 [batch, SEQ] inputs for these real lengths (real positions first)."""
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(1000, vocab, (len(lengths), SEQ)).astype(np.int32) * mask
    segments = ((np.arange(SEQ)[None, :] >= lengths[:, None] // 2) * mask).astype(np.int32)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def export(weights: BertWeights, variant: str, precision: str, path: str) -> str:
    module = graph.build_ranker_module(weights, variant, precision)
    tf.saved_model.save(module, path, signatures={SIGNATURE_NAME: module.serving_default})
    return path


def timed(fn: Callable[[], object], calls: int, budget_s: float | None) -> dict:
    """Median and P99 of host wall time per call (each call returns host numpy, so it includes the device work):
    `calls` calls, or fewer (50 at least) where budget_s runs out first."""
    for _ in range(20):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < calls and (budget_s is None or time.perf_counter() - start < budget_s or len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1e3
    return {"median_ms": round(float(np.median(ms)), 4), "p99_ms": round(float(np.percentile(ms, 99)), 4),
            "calls": len(times)}


class SessionPath:
    """The SavedModel as TF Serving's session-based loader holds it: the server's SessionBundle (one Session over
    the MetaGraph) and a Session::MakeCallable callable on the signature's tensor names."""

    def __init__(self, path: str):
        from bertserve.server.servable import SessionBundle

        self.bundle = SessionBundle(path, {"serve"})
        self.session = self.bundle.session
        signature = self.bundle.meta_graph.signature_def[SIGNATURE_NAME]
        self.feeds = [signature.inputs[name].name for name in INPUT_NAMES]
        self.fetch = signature.outputs[OUTPUT_NAME].name
        self.callable = self.bundle.make_callable(self.feeds, [self.fetch])

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.callable(*(inputs[name] for name in INPUT_NAMES))[0]

    def feed_dict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {feed: inputs[name] for feed, name in zip(self.feeds, INPUT_NAMES)}

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(self.fetch, self.feed_dict(inputs))

    def trace(self, inputs: dict[str, np.ndarray], top: int = 12) -> dict:
        """One call with a full trace: the slowest ops per device, host scheduling included (microseconds)."""
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        metadata = tf.compat.v1.RunMetadata()
        self.session.run(self.fetch, self.feed_dict(inputs), options=options, run_metadata=metadata)
        per_device = {}
        for device in metadata.step_stats.dev_stats:
            nodes = [(n.node_name, n.all_end_rel_micros, n.all_start_micros) for n in device.node_stats]
            if not nodes:
                continue
            first = min(start for _, _, start in nodes)
            last = max(start + dur for _, dur, start in nodes)
            per_device[device.device] = {
                "span_us": last - first, "ops": len(nodes),
                "slowest": sorted(((name, dur) for name, dur, _ in nodes), key=lambda x: -x[1])[:top]}
        return per_device

    def close(self) -> None:
        self.bundle.close()


class ServerPath:
    """What `bertserve serve` runs per batch: the servable's checks of the token inputs, then its Session callable."""

    def __init__(self, path: str):
        from bertserve.server.servable import LoadedVersion

        self.signature = LoadedVersion("chitchat", 1, path, {"serve"}).signature(SIGNATURE_NAME)

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        self.signature.check_inputs(inputs)
        return self.signature.run(inputs)[OUTPUT_NAME]


class Tf2Path:
    def __init__(self, path: str):
        self.model = tf.saved_model.load(path)
        self.fn = self.model.signatures[SIGNATURE_NAME]

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.fn(**{name: tf.constant(inputs[name]) for name in INPUT_NAMES})[OUTPUT_NAME].numpy()


def core_column(lib_path: str, weights: BertWeights, cases: list[tuple[str, int, dict]]) -> dict:
    """The CUDA core's graph replay (device time, fp16) on the same lengths, through the harness's C ABI. Run in a
    process without TensorFlow (--core_only): torch and TensorFlow each bring their own CUDA libraries."""
    import torch

    import core
    from harness import config_dict, graph_replay_ms

    arrays = {k: torch.as_tensor(v).cuda() for k, v in weights.items()}
    max_batch = max(batch for _, batch, _ in cases)
    ranker = core.CudaRanker(core.load_library(lib_path), config_dict(weights.config), arrays, torch.float16,
                             max_batch, SEQ)
    out = {}
    for dist, batch, inputs in cases:
        lengths = inputs["input_mask"].sum(1).astype(np.int32)
        ids = torch.as_tensor(inputs["input_ids"]).cuda()
        segments = torch.as_tensor(inputs["segment_ids"]).cuda()
        out[f"{dist}:{batch}"] = round(graph_replay_ms(ranker, ids, segments, lengths), 4)
    ranker.close()
    return out


def environment() -> dict:
    gpus = [tf.config.experimental.get_device_details(d).get("device_name", d.name)
            for d in tf.config.list_physical_devices("GPU")]
    return {"gpu": gpus, "tensorflow": tf.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "tf32": tf.config.experimental.tensor_float_32_execution_enabled()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--server_calls", type=int, default=1000)
    parser.add_argument("--budget_s", type=float, default=2.0, help="per row and path, but the headline's")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--variants", default=",".join(f"{v}_{p}" for v, p in VARIANTS))
    parser.add_argument("--harness_lib", default=".device_carry/cuda/libbertserve_cuda.so")
    parser.add_argument("--core_only", action="store_true", help="write the core column to --out and stop")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    weights = BertWeights.random(CHITCHAT_CONFIG, seed=0)
    rng = np.random.default_rng(7)
    cases = [(dist, batch, inputs_for(lengths_for(dist, batch, rng), CHITCHAT_CONFIG.vocab_size, rng))
             for dist in DISTS for batch in batches]
    if args.core_only:
        with open(args.out, "w") as f:
            json.dump(core_column(args.harness_lib, weights, cases), f)
        return 0
    core_ms = {}
    if os.path.exists(args.harness_lib):
        core_file = args.out + ".core.json"
        subprocess.run([sys.executable, __file__, "--core_only", "--out", core_file, "--batches", args.batches,
                        "--harness_lib", args.harness_lib], check=True)
        with open(core_file) as f:
            core_ms = json.load(f)
        os.remove(core_file)
    else:
        print(f"no harness library at {args.harness_lib}: the core column is left out", flush=True)
    custom_ops.load_op_library()
    result = {"environment": environment(), "shape": "chit-chat 6 x 768, 12 heads, FFN 3072, seq 32",
              "what": "host numpy in and out per call; median and P99 of wall time", "rows": []}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    rows = {(dist, batch): {"dist": dist, "batch": batch, "core_graph_ms": core_ms.get(f"{dist}:{batch}")}
            for dist, batch, _ in cases}
    result["rows"] = list(rows.values())
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants.split(","):
            kind, precision = variant.split("_")
            t0 = time.time()
            path = export(weights, kind, precision, os.path.join(tmp, variant))
            print(f"exported {variant} in {time.time() - t0:.1f} s", flush=True)
            session, tf2 = SessionPath(path), Tf2Path(path)
            headline = variant == "fused_fp16"
            server = ServerPath(path) if headline else None
            for dist, batch, inputs in cases:
                row = rows[(dist, batch)]
                # The headline rows take --calls calls whatever they cost; the others stop at --budget_s.
                row[f"{variant}_session"] = timed(lambda: session(inputs), args.calls,
                                                  None if headline else args.budget_s)
                if headline:
                    row[f"{variant}_server"] = timed(lambda: server(inputs), args.server_calls, None)
                    row[f"{variant}_session_run"] = timed(lambda: session.run(inputs), args.calls, args.budget_s)
                    row[f"{variant}_tf2"] = timed(lambda: tf2(inputs), args.calls, args.budget_s)
                for key in [k for k in row if k.startswith(variant)]:
                    row[key]["seq_s"] = round(batch / row[key]["median_ms"] * 1e3)
                if headline and batch in (1, 32, 8192) and dist == "U8_32":
                    result.setdefault("traces", {})[f"{variant}_batch{batch}"] = session.trace(inputs)
                print(json.dumps({k: row[k] for k in ("dist", "batch", "core_graph_ms", f"{variant}_session")}),
                      flush=True)
                save()
            session.close()
            del session, tf2
    save()
    print_table(result)
    return 0


def print_table(result: dict) -> None:
    print("| lengths | batch | core graph ms | fused fp16 session ms (P99) | server ms (P99) | TF2 ms | stock fp16 ms |"
          " seq/s session | session / core seq/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in result["rows"]:
        s = row.get("fused_fp16_session")
        if not s:
            continue
        server = row.get("fused_fp16_server", {})
        tf2 = row.get("fused_fp16_tf2", {}).get("median_ms")
        stock = row.get("stock_fp16_session", {}).get("median_ms")
        ratio = f"{row['core_graph_ms'] / s['median_ms']:.2f}" if row.get("core_graph_ms") else "-"
        print(f"| {row['dist']} | {row['batch']} | {row.get('core_graph_ms')} | {s['median_ms']} ({s['p99_ms']}) | "
              f"{server.get('median_ms')} ({server.get('p99_ms')}) | {tf2} | {stock} | {s['seq_s']} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
