"""One device call of the GPU harness: build the CUDA core, check it against float32/float64 references, time it
against PyTorch fp16 in the same process, replay serving traffic, and write the results.

Usage (on the GPU machine, from the repository root, after `source gpu_rig/env.sh`):
  python3 bench/gpu/run_bench.py [--stages build,check,time,profile,replay,compile,sustain] [--out DIR] [--quick]
Stages run in order. The check stage writes gpu_<gpu>_correctness.json, the others gpu_<gpu>_bench.json (for the
H200: gpu_h200_*.json), in --out (default bench/results, overwritten in place), each rewritten after every stage, so
that a cut-off run still returns what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

from bertserve.bench.gpu import core, correctness, serving_replay, torch_models
from bertserve.bench.gpu.harness import (DEVICE_CARRY, REPO_ROOT, RESULTS_DIR, SEQ, chitchat_random, config_dict,
                                         environment, event_ms, graph_replay_ms, kernel_label, lengths_for, median_ms,
                                         result_name)
from bertserve.export.weights import CHITCHAT_CONFIG

BATCHES = (1, 8, 32, 128, 512, 2048, 8192)


class Results:
    """One result file, rewritten after each stage."""

    def __init__(self, path: str, env: dict):
        self.path = path
        self.data: dict = {"environment": env}

    def save(self) -> None:
        with open(self.path, "w") as f:
            json.dump(self.data, f, indent=1, default=str)


# ------------------------------------------------------------------------------------------------ stages

def stage_build(build_dir: str) -> dict:
    """Builds the core into build_dir (on a GPU machine that has CUTLASS; the rig carries a prebuilt one instead)."""
    t0 = time.time()
    log = subprocess.run(["bash", os.path.join(REPO_ROOT, "custom_ops/kernels/cuda/build.sh"), build_dir],
                         capture_output=True, text=True)
    print(log.stdout[-2000:], log.stderr[-4000:], flush=True)
    if log.returncode != 0:
        raise SystemExit("build failed")
    return {"seconds": round(time.time() - t0, 1), "ptxas_warnings": log.stderr.count("warning")}


def stage_check(res: Results, lib) -> None:
    """Every correctness check (correctness.py), by name, and their summary."""
    checks = correctness.run_checks(lib, DEVICE_CARRY)
    res.data["correctness"] = checks
    print(json.dumps(checks["summary"]), flush=True)


def stage_time(res: Results, lib, quick: bool) -> None:
    cfg, w32 = chitchat_random()
    batches = (1, 32, 2048) if quick else BATCHES
    ranker = core.CudaRanker(lib, cfg, w32, torch.float16, max(batches), SEQ)
    cublaslt = core.CudaRanker(lib, cfg, w32, torch.float16, max(batches), SEQ, custom_gemms=False)
    all_tokens = core.CudaRanker(lib, cfg, w32, torch.float16, max(batches), SEQ, first_token_last_layer=False)
    del w32
    torch.manual_seed(0)
    hand = torch_models.HandRanker(cfg).cuda().half().eval()
    hf = torch_models.hf_ranker(cfg, None, "sdpa").half()
    rng = np.random.default_rng(7)
    rows = []
    for dist in ("all32", "U8_32"):
        for bs in batches:
            lengths = lengths_for(dist, bs, rng)
            ids = torch.randint(1000, cfg["vocab_size"], (bs, SEQ), dtype=torch.int32, device="cuda")
            seg = torch.zeros_like(ids)
            mask = (torch.arange(SEQ, device="cuda")[None] < torch.as_tensor(lengths, device="cuda")[:, None]).long()
            row = {"dist": dist, "batch": bs, "tokens": int(lengths.sum()),
                   "bucket": ranker.token_bucket(int(lengths.sum()))}
            row["core_graph_ms"] = graph_replay_ms(ranker, ids, seg, lengths)
            row["core_eager_ms"] = median_ms(lambda: ranker.launch(bs, row["tokens"]))  # inputs still staged
            row["core_cublaslt_graph_ms"] = graph_replay_ms(cublaslt, ids, seg, lengths)  # side by side
            row["core_all_tokens_graph_ms"] = graph_replay_ms(all_tokens, ids, seg, lengths)
            with torch.inference_mode():
                ids64, seg64 = ids.long(), seg.long()
                row["hf_sdpa_ms"] = median_ms(lambda: hf(input_ids=ids64, token_type_ids=seg64, attention_mask=mask))
                row["hand_sdpa_ms"] = median_ms(lambda: hand(ids64, seg64, mask))
                static = (ids64.clone(), seg64.clone(), mask.clone())
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        hand(*static)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    hand(*static)
                row["hand_sdpa_graph_ms"] = median_ms(g.replay)
                del g
            for key in [k for k in row if k.endswith("_ms")]:
                row[key.replace("_ms", "_seq_s")] = round(bs / row[key] * 1e3)
                row[key] = round(row[key], 4)
            rows.append(row)
            print(json.dumps(row), flush=True)
            res.data["timing"] = {"shape": "6 layers, hidden 768, 12 heads, FFN 3072, seq 32, fp16", "rows": rows}
            res.save()
    res.data["timing"]["gemm_plans"] = ranker.gemm_plans()
    res.save()
    for r in (ranker, cublaslt, all_tokens):
        r.close()


def stage_sustain(res: Results, lib) -> None:
    """Clocks and power while one large batch runs back to back for a few seconds, beside the same forward timed
    in short bursts: whether sustained throughput is limited by the GPU's power budget."""
    cfg, w32 = chitchat_random()
    bs = 8192
    ranker = core.CudaRanker(lib, cfg, w32, torch.float16, bs, SEQ)
    lengths = lengths_for("U8_32", bs, np.random.default_rng(10))
    ids = torch.randint(1000, cfg["vocab_size"], (bs, SEQ), dtype=torch.int32, device="cuda")
    graph = ranker.graph_for(bs, ranker.token_bucket(ranker.stage(ids, torch.zeros_like(ids), lengths)))
    query = "--query-gpu=clocks.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active"
    smi = subprocess.Popen(["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    times = []
    t_end = time.time() + 6.0
    while time.time() < t_end:
        times.append(event_ms(graph.replay))
    time.sleep(0.3)
    smi.terminate()
    samples = [line.split(", ") for line in smi.communicate()[0].strip().splitlines()]
    torch.cuda.synchronize()
    time.sleep(3.0)  # idle, then one short burst
    burst = [event_ms(graph.replay) for _ in range(3)]
    out = {"batch": bs, "lengths": "U8_32", "replays": len(times), "first_3_ms": [round(t, 3) for t in times[:3]],
           "last_3_ms": [round(t, 3) for t in times[-3:]], "median_ms": round(float(np.median(times)), 3),
           "burst_after_3s_idle_ms": [round(t, 3) for t in burst],
           "nvidia_smi_samples": {"fields": query.split("=")[1].split(","), "rows": samples}}
    print(json.dumps({k: v for k, v in out.items() if k != "nvidia_smi_samples"}), flush=True)
    print(samples[:3], samples[-3:], flush=True)
    res.data["sustained"] = out
    ranker.graphs.clear()
    ranker.close()


def stage_compile(res: Results) -> None:
    cfg = config_dict(CHITCHAT_CONFIG)
    torch.manual_seed(0)
    hand = torch_models.HandRanker(cfg).cuda().half().eval()
    compiled = torch.compile(hand)
    rng = np.random.default_rng(8)
    out = []
    for bs in (32, 2048):
        lengths = lengths_for("U8_32", bs, rng)
        ids = torch.randint(1000, cfg["vocab_size"], (bs, SEQ), device="cuda")
        seg = torch.zeros_like(ids)
        mask = (torch.arange(SEQ, device="cuda")[None] < torch.as_tensor(lengths, device="cuda")[:, None]).long()
        with torch.inference_mode():
            t0 = time.time()
            compiled(ids, seg, mask)
            torch.cuda.synchronize()
            compile_s = time.time() - t0
            ms = median_ms(lambda: compiled(ids, seg, mask))
        out.append({"batch": bs, "dist": "U8_32 (computed padded)", "ms": round(ms, 4), "seq_s": round(bs / ms * 1e3),
                    "compile_s": round(compile_s, 1)})
        print(json.dumps(out[-1]), flush=True)
        res.data["torch_compile"] = out
        res.save()


def stage_profile(res: Results, lib) -> None:
    """Per-kernel GPU time of one forward (torch profiler over CUPTI): where the time goes."""
    cfg, w32 = chitchat_random()
    ranker = core.CudaRanker(lib, cfg, w32, torch.float16, 2048, SEQ)
    rng = np.random.default_rng(9)
    prof_out = {}
    for bs in (1, 32, 2048):
        lengths = lengths_for("U8_32", bs, rng)
        ids = torch.randint(1000, cfg["vocab_size"], (bs, SEQ), dtype=torch.int32, device="cuda")
        n = ranker.token_bucket(ranker.stage(ids, torch.zeros_like(ids), lengths))
        graph = ranker.graph_for(bs, n)  # plans (and autotunes) every GEMM of this bucket before profiling
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                ranker.launch(bs, n)
            torch.cuda.synchronize()
        table: dict[str, dict] = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t > 0:
                entry = table.setdefault(kernel_label(e.key), {"us_per_forward": 0.0, "calls_per_forward": 0})
                entry["us_per_forward"] = round(entry["us_per_forward"] + t / 5, 1)
                entry["calls_per_forward"] += e.count // 5
        prof_out[f"U8_32_batch{bs}_tokens{n}"] = dict(sorted(table.items(), key=lambda kv: -kv[1]["us_per_forward"]))
        print(f"batch {bs}:", json.dumps(prof_out[f"U8_32_batch{bs}_tokens{n}"])[:1500], flush=True)
    res.data["profile_eager_launches"] = prof_out
    res.data["profile_gemm_plans"] = ranker.gemm_plans()
    ranker.close()


def stage_replay(res: Results, lib, quick: bool) -> None:
    cfg, w32 = chitchat_random()
    wide = serving_replay.BatchingParameters(1024, 2000, (128, 256, 512, 1024))
    # (batching, offered QPS levels, graphs). Without graphs, as the TF GPU kernel runs: eager launches over the
    # token bucket, GEMMs planned without autotuning the first time a bucket is seen (no warmup: the first level
    # pays for planning the buckets it meets).
    policies = [
        (serving_replay.BatchingParameters(256, 1000, (32, 64, 128, 256)), (1000, 2000, 4000, 6000, 7000, 8000), True),
        (wide, (6000, 8000, 9000, 10000), True),
        (wide, (6000, 8000, 9000), False),
    ]
    out = []
    for params, levels, graphs in policies:
        ranker = core.CudaRanker(lib, cfg, w32, torch.float16, params.max_batch_size, SEQ, autotune=graphs)
        t0 = time.time()
        if graphs:  # every (size, bucket) graph before traffic starts
            for size in params.allowed_batch_sizes:
                for bucket in sorted({ranker.token_bucket(t) for t in range(1, size * SEQ + 1, 8)}):
                    ranker.graph_for(size, bucket)
        capture_s = round(time.time() - t0, 1)
        for qps in (levels[:2] if quick else levels):
            r = serving_replay.replay(ranker, params, serving_replay.Traffic(qps=qps, seconds=2.0), seed=int(qps),
                                      graphs=graphs)
            r.update({"max_batch_size": params.max_batch_size, "batch_timeout_micros": params.batch_timeout_micros,
                      "allowed_batch_sizes": list(params.allowed_batch_sizes), "graphs": len(ranker.graphs),
                      "graph_capture_s": capture_s})
            out.append(r)
            print(json.dumps(r), flush=True)
            res.data["serving_replay"] = {"replies_per_query": 32, "lengths": "U[8,32]", "rows": out}
            res.save()
        ranker.close()
        ranker.graphs.clear()
        del ranker
        torch.cuda.empty_cache()


def readme_table(data: dict) -> str:
    lines = ["| batch | lengths | core + graph ms (seq/s) | core eager ms | core, cuBLASLt + graph ms (seq/s) | "
             "core, last layer on all tokens + graph ms (seq/s) | "
             "PyTorch SDPA + graph ms (seq/s) | hand SDPA ms | HF sdpa ms | core vs best PyTorch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data.get("timing", {}).get("rows", []):
        best = min(r["hand_sdpa_graph_ms"], r["hand_sdpa_ms"], r["hf_sdpa_ms"])
        lines.append(f"| {r['batch']} | {r['dist']} | {r['core_graph_ms']:.3f} ({r['core_graph_seq_s']:,}) | "
                     f"{r['core_eager_ms']:.3f} | "
                     f"{r['core_cublaslt_graph_ms']:.3f} ({r['core_cublaslt_graph_seq_s']:,}) | "
                     f"{r['core_all_tokens_graph_ms']:.3f} ({r['core_all_tokens_graph_seq_s']:,}) | "
                     f"{r['hand_sdpa_graph_ms']:.3f} ({r['hand_sdpa_graph_seq_s']:,}) | "
                     f"{r['hand_sdpa_ms']:.3f} | {r['hf_sdpa_ms']:.3f} | {best / r['core_graph_ms']:.2f}x |")
    rows = data.get("serving_replay", {}).get("rows", [])
    if rows:
        lines += ["", "| max batch / timeout | launch | offered QPS | achieved QPS | seq/s | rows/batch | P50 ms | "
                      "P99 ms |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['max_batch_size']} / {r['batch_timeout_micros']} us | {r['launch']} | "
                         f"{r['offered_qps']:,} | "
                         f"{r['achieved_qps']:,} | {r['sequences_per_s']:,} | {r['mean_rows_per_batch']} | "
                         f"{r['p50_ms']} | {r['p99_ms']} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stages", default="build,check,time,profile,replay,compile,sustain")
    p.add_argument("--out", default=RESULTS_DIR, help="folder of the result files (default: bench/results)")
    p.add_argument("--build-dir", default="/tmp/bertserve_cuda_build",
                   help="where the build stage writes libbertserve_cuda.so, or where a prebuilt one is read")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    stages = args.stages.split(",")
    env = environment()
    print(json.dumps(env), flush=True)
    build = stage_build(args.build_dir) if "build" in stages else None
    lib = core.load_library(os.path.join(args.build_dir, "libbertserve_cuda.so"))
    files: dict[str, Results] = {}  # only the files whose stages run are written
    for name, fn in (("check", lambda res: stage_check(res, lib)),
                     ("time", lambda res: stage_time(res, lib, args.quick)),
                     ("profile", lambda res: stage_profile(res, lib)),
                     ("replay", lambda res: stage_replay(res, lib, args.quick)),
                     ("compile", lambda res: stage_compile(res)), ("sustain", lambda res: stage_sustain(res, lib))):
        if name not in stages:
            continue
        kind = "correctness" if name == "check" else "bench"
        if kind not in files:
            files[kind] = Results(os.path.join(args.out, result_name(kind)), env)
        res = files[kind]
        if build is not None:
            res.data["build"], build = build, None
        t0 = time.time()
        try:
            fn(res)
        except Exception as e:  # one failing stage must not lose the others' numbers
            res.data.setdefault("errors", {})[name] = repr(e)[:2000]
            print(f"stage {name} failed: {e!r}", flush=True)
        res.data.setdefault("stage_seconds", {})[name] = round(time.time() - t0, 1)
        res.save()
    if "bench" in files:
        print(readme_table(files["bench"].data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
