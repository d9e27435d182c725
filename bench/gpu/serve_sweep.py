"""`bertserve serve` measured end to end on GPU:0: queries of 32 (query, reply) pairs from client processes over gRPC
(the official stubs' wire format), through TF Serving's batching, our TensorFlow GPU kernels and back.

One part per device call (each within 10 minutes):
- chitchat: the fused fp16 chit-chat ranker (6 x 768, random weights); an open-loop QPS sweep up to and past
  saturation, the overload followed by a lower rate (UNAVAILABLE answers, then recovery), a version swap under
  load, a REST load at one rate, then the harness replay at the same batching parameters (the ceiling);
- minilm: the same for the real MiniLM-L6 ranker (the carried fp16 file), without the swap;
- eight_models: GPU memory per model (fp16 and fp32: weights, arena, graphs), then 8 chit-chat models served from
  one model config with the traffic spread across them: aggregate QPS and P99.
Per rate it records achieved QPS, P50/P99, errors by status code, the server's batches by padded size and by rows
(from its Prometheus page), GPU utilisation and memory (NVML or nvidia-smi), and each client process's CPU use
and send lag (the load generator's headroom). Before the server starts, the version's warmup file is replaced by
one request per (allowed batch size, token bucket) the load's pair lengths can make (export/bucket_warmup.py), so no CUDA
graph is captured while measuring; the time from start to AVAILABLE includes that warmup.
Batching parameters are given by hand (flags, or --batching_file) or chosen on the spot by `bertserve
tune-batching` (--batching tune); the JSON says which. --serve_flag passes flags through to `bertserve serve`.
--cpu runs every stage that needs no GPU on a CPU machine (a tiny fused fp32 ranker, low rates, short steps).
Writes <out>/gpu_<gpu>_serving_<part>.json and .png (with --cpu: cpu_serving_<part>.json and .png), after every
stage, so a run cut short still leaves what it measured.

Usage (GPU machine, from the repository root, after the rig's install stage; bench/gpu/README.md):
  source gpu_rig/env.sh && python3 bench/gpu/serve_sweep.py --part chitchat --out $OUT
On a CPU machine: .venv/bin/python bench/gpu/serve_sweep.py --part chitchat --cpu --out /tmp/serve_sweep
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

import grpc
import numpy as np
import psutil
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2

from bertserve.bench.gpu import serving_setup
from bertserve.bench.gpu.gpu_sampler import GpuSampler
from bertserve.bench.machine import gpu_result_name, machine
from bertserve.client.protocol import ModelSpec
from bertserve.loadtest import report, server_metrics
from bertserve.loadtest.clients import ClientProcesses, LoadSpec
from bertserve.loadtest.loadgen import Phase, RequestShape, RunStats
from bertserve.loadtest.server_process import AVAILABLE, ServerProcess
from bertserve.loadtest.sweep import SweepConfig, meets_slo, saturation
from bertserve.loadtest.tuner import BatchingCandidate
from bertserve.train.pairs import LENGTHS, read_lengths

HERE = os.path.dirname(os.path.realpath(__file__))
SAMPLER_PATH = os.path.join(HERE, "server_profile")  # its sitecustomize.py installs stack_sampler.py
CARRY = os.path.join(os.path.dirname(os.path.dirname(HERE)), ".device_carry")
SEQ = 32
REPLIES = 32
TARGET_QPS, TARGET_P99_MS, OVERHEAD_QPS, OVERHEAD_P50_MS = 6000.0, 10.0, 1000.0, 1.0  # issue 32's targets


@dataclasses.dataclass(frozen=True)
class Part:
    models: int
    source: str  # the model on the GPU (on a CPU machine: the tiny ranker)
    replay: bool
    rest: bool
    recovery: bool
    swap: bool
    memory: bool


PARTS = {
    "chitchat": Part(1, "chitchat", replay=True, rest=True, recovery=True, swap=True, memory=False),
    "minilm": Part(1, "minilm", replay=True, rest=True, recovery=True, swap=False, memory=False),
    "eight_models": Part(8, "chitchat", replay=False, rest=False, recovery=False, swap=False, memory=True),
}


@dataclasses.dataclass(frozen=True)
class Defaults:
    rates: str
    duration: float
    clients: int
    client_cpus: int
    rest_qps: float
    slo_ms: float
    batching: BatchingCandidate
    budget_s: float


# GPU: the replay's 6,000 queries/s policy (bench/results/gpu_h200_bench.json) with a second batch thread, so the
# host's part of one batch overlaps the GPU's part of the other; four client processes on four cores of their own.
GPU = Defaults("500,1000,2000,3000,4000,5000,6000,7000,8000,10000", 8.0, 4, 4, 500.0, TARGET_P99_MS,
               BatchingCandidate(256, 1000, 2, (32, 64, 128, 256), 10), 540.0)
CPU = Defaults("8,32,128,256,512,768", 2.0, 2, 0, 4.0, 1000.0, BatchingCandidate(128, 2000, 2, (32, 64, 128), 10), 400.0)
# tune-batching's grid on the GPU: batches of 8 to 32 queries, one or two batch threads.
GPU_TUNE_GRID = (BatchingCandidate(256, 1000, 1, (32, 64, 128, 256), 10),
                 BatchingCandidate(256, 1000, 2, (32, 64, 128, 256), 10),
                 BatchingCandidate(512, 2000, 2, (64, 128, 256, 512), 10),
                 BatchingCandidate(1024, 2000, 2, (128, 256, 512, 1024), 10))


class Budget:
    """The device call's time: a stage starts only if what it needs is left."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


class Result:
    """The JSON result, rewritten after every stage."""

    def __init__(self, path: str, data: dict):
        self.path, self.data = path, data

    def save(self) -> None:
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=1, default=str)
            f.write("\n")

    def skip(self, stage: str, why: str) -> None:
        print(f"skipped {stage}: {why}", flush=True)
        self.data.setdefault("skipped", {})[stage] = why
        self.save()


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None  # the device call's copy of the tree has no .git


def _csv(text: str, kind=float) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def measured_step(load: ClientProcesses, server: ServerProcess, gpu: GpuSampler, phases: Sequence[Phase],
                  seed: int) -> tuple[RunStats, dict]:
    """One open-loop run with the server's batching counters and the GPU's samples over its window."""
    load.warm_up()  # the clients' first requests stay out of the window
    before, start = server.metrics(), gpu.now()
    stats = load.open(phases, seed)
    end, after = gpu.now(), server.metrics()
    row = {"offered_qps": stats.load, **stats.row(),
           "server_batching": server_metrics.batching_between(before, after, REPLIES),
           "gpu": gpu.between(start, end)}
    return stats, row


def _print_step(label: str, row: dict) -> None:
    cpu = max(row.get("client_cpu_cores") or [0.0])
    print(f"{label}: offered {row['offered_qps']:g} QPS -> {row['achieved_qps']:g} answered, P50 {row['p50_ms']} ms, "
          f"P99 {row['p99_ms']} ms, errors {row['errors_by_status'] or 0}, client CPU max {cpu:.2f} cores, send lag "
          f"P99 {row.get('send_lag_p99_ms')} ms, GPU util {row['gpu'].get('util_mean_pct', '-')} %", flush=True)


def sweep_rates(load: ClientProcesses, server: ServerProcess, gpu: GpuSampler, rates: list[float],
                args: argparse.Namespace, budget: Budget, result: Result) -> list[RunStats]:
    """The rates in turn, `past_saturation` more after the first that saturates the server (errors, or fewer
    answers than requests sent: a P99 over the SLO alone does not stop it); if the list ends first, rates go on
    growing by extend_factor while the budget lasts."""
    config = SweepConfig(slo_p99_ms=args.slo_ms)
    runs, rows = [], result.data.setdefault("sweep", [])
    saturated_at = None
    step = 0
    while saturated_at is None or step - saturated_at <= args.past_saturation:
        if step == len(rates):
            rates.append(round(rates[-1] * args.extend_factor))
        if not budget.allows(args.duration + args.reserve_s):
            result.skip(f"sweep from {rates[step]:g} QPS", f"{budget.left():.0f} s left, {args.reserve_s:g} s kept "
                                                           "for the later stages")
            break
        stats, row = measured_step(load, server, gpu, [Phase(rates[step], args.duration)], seed=step)
        row["within_slo"] = meets_slo(stats, config)
        row["saturated"] = saturation(stats, config)
        rows.append(row)
        runs.append(stats)
        _print_step(f"step {step + 1}", row)
        result.save()
        if row["saturated"] and saturated_at is None:
            saturated_at = step
            result.data["saturated_at"] = {"offered_qps": rates[step], "why": row["saturated"]}
        step += 1
    return runs


def recovery_step(load: ClientProcesses, server: ServerProcess, gpu: GpuSampler, high: float, low: float,
                  args: argparse.Namespace) -> dict:
    """The overload rate, then a lower one in the same run: the timeline shows the refusals and when they stop."""
    phases = [Phase(high, args.overload_s), Phase(low, args.recovery_s)]
    stats, row = measured_step(load, server, gpu, phases, seed=101)
    tail_from = args.overload_s + args.recovery_s / 2  # the second half of the low phase
    tail = stats.latency_at_s >= tail_from
    row["recovered"] = {"window_s": [tail_from, args.overload_s + args.recovery_s], "ok": int(tail.sum()),
                        "errors": int((stats.error_at_s >= tail_from).sum()),
                        "p99_ms": round(float(np.percentile(stats.latencies_ms[tail], 99)), 2) if tail.any() else None}
    row["timeline"] = stats.timeline(args.timeline_bin_s)
    _print_step("recovery", row)
    print(f"  second half of the low phase: {row['recovered']}", flush=True)
    return row


def _available_versions(server: ServerProcess, name: str) -> set[int]:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    try:
        status = server.models.GetModelStatus(request, timeout=2.0)
    except grpc.RpcError:
        return set()
    return {v.version for v in status.model_version_status if v.state == AVAILABLE}


def swap_step(load: ClientProcesses, server: ServerProcess, gpu: GpuSampler, version_dir: str, name: str,
              qps: float, args: argparse.Namespace) -> dict:
    """Load at qps while a new version appears in the base path (hard links of the current one, renamed into place
    as `bertserve export` does): the server loads and warms it under load, then swaps and unloads the old one."""
    base, current = os.path.dirname(version_dir), int(os.path.basename(version_dir))
    events: dict = {"new_version": current + 1}

    def add_version() -> None:
        start = time.monotonic()
        time.sleep(args.swap_at_s)
        staging = os.path.join(base, f".{current + 1}.partial")
        shutil.copytree(version_dir, staging, copy_function=os.link)
        os.rename(staging, os.path.join(base, str(current + 1)))
        events["written_at_s"] = round(time.monotonic() - start, 2)
        while time.monotonic() - start < args.swap_s + 60:
            if current + 1 in _available_versions(server, name):
                events["available_at_s"] = round(time.monotonic() - start, 2)
                break
            time.sleep(0.2)
        while time.monotonic() - start < args.swap_s + 60 and current in _available_versions(server, name):
            time.sleep(0.2)
        events["old_version_gone_at_s"] = round(time.monotonic() - start, 2)

    thread = threading.Thread(target=add_version, name="version-swap")
    thread.start()
    stats, row = measured_step(load, server, gpu, [Phase(qps, args.swap_s)], seed=202)
    thread.join()
    row["swap"] = events
    row["timeline"] = stats.timeline(args.timeline_bin_s)
    _print_step("version swap", row)
    print(f"  swap events (s from the start of the run): {events}", flush=True)
    return row


def _server_processes(server: ServerProcess) -> list[int]:
    """The server and its Python children: the ones whose sitecustomize installed the sampler's signal handlers
    (a signal to any other process, such as a C++ gRPC front end, would end it)."""
    parent = psutil.Process(server.proc.pid)
    return [parent.pid] + [p.pid for p in parent.children(recursive=True) if "python" in p.name().lower()]


def profile_step(load: ClientProcesses, server: ServerProcess, gpu: GpuSampler, qps: float, folder: str,
                 args: argparse.Namespace) -> dict:
    """A run at qps with the server's threads sampled (stack_sampler.py): where its CPU time goes per thread."""
    shutil.rmtree(folder, ignore_errors=True)
    pids = _server_processes(server)
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    _, row = measured_step(load, server, gpu, [Phase(qps, args.profile_s)], seed=404)
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 30
    paths = [os.path.join(folder, f"{pid}.json") for pid in pids]
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in paths):
        time.sleep(0.2)
    row["stack_samples"] = {}
    for pid, path in zip(pids, paths):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                row["stack_samples"][f"pid {pid}" + (" (main)" if pid == pids[0] else "")] = json.load(f)
    _print_step("profiled", row)
    for pid, samples in row["stack_samples"].items():
        for name, thread in list(samples["threads"].items())[:4]:
            print(f"  {pid} {name} x{thread['threads']}: busy {thread['busy_share']:.0%}, on top: "
                  + ", ".join(f"{k} {v}%" for k, v in list(thread["top"].items())[:5]), flush=True)
    return row


def choose_batching(args: argparse.Namespace, defaults: Defaults) -> tuple[BatchingCandidate, str]:
    """The batching parameters given by hand: --batching_file, or the flags over the defaults."""
    if args.batching_file:
        with open(args.batching_file, encoding="utf-8") as f:
            return BatchingCandidate.from_text(f.read()), f"by hand: {args.batching_file}"
    d = defaults.batching
    allowed = tuple(_csv(args.allowed_batch_sizes, int)) if args.allowed_batch_sizes else d.allowed_batch_sizes
    chosen = BatchingCandidate(args.max_batch_size or d.max_batch_size,
                               d.batch_timeout_micros if args.batch_timeout_micros is None else args.batch_timeout_micros,
                               args.num_batch_threads or d.num_batch_threads, allowed,
                               args.max_enqueued_batches or d.max_enqueued_batches)
    return chosen, "by hand: " + ("these flags" if chosen != d else "serve_sweep.py's defaults (from the replay)")


def tune_batching(args: argparse.Namespace, candidates: Sequence[BatchingCandidate], config_file: str, name: str,
                  work: str, env: dict, serve_flags: list[str]) -> tuple[BatchingCandidate, dict]:
    """`bertserve tune-batching` over candidates on this machine (random word pieces of BERT's vocabulary, as the
    sweep's); the winner and its table."""
    grid = os.path.join(work, "tune_candidates.json")
    with open(grid, "w", encoding="utf-8") as f:
        json.dump([dataclasses.asdict(c) for c in candidates], f)
    output = os.path.join(work, "tuned_batching_parameters.txt")
    command = [sys.executable, "-m", "bertserve.cli", "tune-batching", "--model_config_file", config_file,
               "--model", name, "--max_len", str(SEQ), "--candidates", grid, "--replies", str(REPLIES),
               "--lengths", args.lengths, "--slo_ms", str(args.slo_ms), "--sweep_start", str(args.tune_start),
               "--sweep_factor", str(args.tune_factor), "--sweep_steps", str(args.tune_steps),
               "--duration", str(args.tune_duration), "--clients", str(args.clients), "--quiet",
               "--output", output, "--workdir", os.path.join(work, "tune"),
               *(f"--serve_flag={flag}" for flag in serve_flags)]
    start = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    print(done.stdout[-4000:], done.stderr[-2000:], sep="\n", flush=True)
    table_path = os.path.splitext(output)[0] + "_table.md"
    table = open(table_path, encoding="utf-8").read() if os.path.exists(table_path) else done.stdout[-4000:]
    if done.returncode != 0:
        raise RuntimeError(f"tune-batching exited {done.returncode}: no candidate met the SLO or it failed\n{table}")
    with open(output, encoding="utf-8") as f:
        return BatchingCandidate.from_text(f.read()), {"table": table, "seconds": round(time.monotonic() - start)}


def memory_per_model(source: str, version_dirs: dict[str, str], copies: int, env: dict, work: str) -> dict:
    """model_memory.py once per precision, each in a fresh process (an allocator that served one precision keeps
    its memory), while no server holds the GPU."""
    out = {}
    for precision, version_dir in version_dirs.items():
        path = os.path.join(work, f"memory_{precision}.json")
        subprocess.run([sys.executable, os.path.join(HERE, "model_memory.py"), "--version_dir", version_dir,
                        "--copies", str(copies), "--out", path], env=env, check=True)
        with open(path, encoding="utf-8") as f:
            out[f"{source}_{precision}"] = json.load(f)
    return out


def memory_fraction_check(name: str, version_dir: str, env: dict, work: str, gpu: GpuSampler,
                          fractions: Sequence[float] = (0.0, 0.2)) -> dict:
    """`bertserve serve` started once per --per_process_gpu_memory_fraction, with TensorFlow's allocator
    reserving up front (no allow-growth), as a deployment runs it: the GPU memory in use once it is AVAILABLE.
    0.0 is TensorFlow's default (nearly all of the GPU)."""
    env = {k: v for k, v in env.items() if k != "TF_FORCE_GPU_ALLOW_GROWTH"}
    rows = []
    for fraction in fractions:
        before = gpu.memory_mib()
        flags = [f"--model_name={name}", f"--model_base_path={os.path.dirname(version_dir)}",
                 f"--per_process_gpu_memory_fraction={fraction}"]
        server = ServerProcess(flags, os.path.join(work, f"serve_fraction_{fraction}.log"), env=env)
        try:
            server.wait_until_available([name], timeout_s=120)
            used = gpu.memory_mib()
        finally:
            server.terminate()
        rows.append({"fraction": fraction, "gpu_memory_before_mib": before, "gpu_memory_available_mib": used})
        print(json.dumps(rows[-1]), flush=True)
    return {"total_mib": gpu.total_mib(), "runs": rows}


def run_replay(args: argparse.Namespace, source: str, batching: BatchingCandidate, rates: Sequence[float],
               env: dict, work: str) -> dict:
    path = os.path.join(work, "replay.json")
    command = [sys.executable, os.path.join(HERE, "replay_ceiling.py"), "--out", path, "--model", source,
               "--carry", args.carry, "--harness_lib", args.harness_lib,
               "--max_batch_size", str(batching.max_batch_size),
               "--batch_timeout_micros", str(batching.batch_timeout_micros),
               "--allowed", ",".join(map(str, batching.allowed_batch_sizes)),
               "--rates", ",".join(f"{r:g}" for r in rates), "--seconds", str(args.replay_seconds),
               "--replies", str(REPLIES), "--lengths", args.lengths]
    subprocess.run(command, env=env, check=True, timeout=max(60.0, args.replay_timeout_s))
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def targets(result: dict, slo_ms: float) -> dict:
    """Issue 32's targets against what this run measured (None where a stage did not run); recovery is judged
    against this run's P99 budget."""
    sweep = result.get("sweep", [])
    within = [r for r in sweep if r["errors"] == 0 and r["ok"] and r["p99_ms"] <= TARGET_P99_MS and not r["saturated"]]
    best = max(within, key=lambda r: r["achieved_qps"], default=None)
    out = {"throughput": {"target": f">= {TARGET_QPS:g} queries/s at P99 <= {TARGET_P99_MS:g} ms",
                          "best_within": best and {k: best[k] for k in ("offered_qps", "achieved_qps", "p50_ms",
                                                                        "p99_ms")},
                          "met": bool(best and best["achieved_qps"] >= TARGET_QPS)}}
    served = next((r for r in sweep if r["offered_qps"] == OVERHEAD_QPS), None)
    replayed = next((r for r in result.get("replay", {}).get("rows", []) if r["offered_qps"] == OVERHEAD_QPS), None)
    if served and replayed:
        gap = served["p50_ms"] - replayed["p50_ms"]
        out["overhead"] = {"target": f"P50 within {OVERHEAD_P50_MS:g} ms of the replay's at {OVERHEAD_QPS:g} QPS",
                           "server_p50_ms": served["p50_ms"], "replay_p50_ms": replayed["p50_ms"],
                           "gap_ms": round(gap, 3), "met": gap <= OVERHEAD_P50_MS}
    # A CUDA graph captured under load would allocate device memory: growth past the memory at AVAILABLE hints
    # at a shape the warmup missed (or at TensorFlow's allocator growing for more batches in flight).
    server = result.get("server", {})
    peaks = [r["gpu"]["memory_used_max_mib"] for r in sweep if "memory_used_max_mib" in r["gpu"]]
    out["warmup"] = {"start_to_available_s": server.get("start_to_available_s"),
                     "gpu_memory_growth_under_load_mib": (round(max(peaks) - server["gpu_memory_available_mib"], 1)
                                                          if peaks and server.get("gpu_memory_available_mib")
                                                          else None)}
    first = next((i for i, r in enumerate(sweep) if r["saturated"]), len(sweep))
    out["errors_below_saturation"] = {"failed": sum(r["errors"] for r in sweep[:first]),
                                      "met": all(r["errors"] == 0 for r in sweep[:first])}
    past = {}
    for row in sweep[first:]:
        for code, n in row["errors_by_status"].items():
            past[code] = past.get(code, 0) + n
    recovery = result.get("recovery", {})
    tail = recovery.get("recovered")
    out["past_saturation"] = {"errors_by_status": past, "recovery_second_half": tail}
    if tail:
        # Recovered: no refusals, and a P99 within the SLO or within 1.5 x the sweep's at about that rate.
        steady = min(sweep, key=lambda r: abs(r["offered_qps"] - recovery["phases"][1]["qps"]))["p99_ms"]
        out["past_saturation"].update(steady_p99_ms=steady, recovered=bool(
            tail["errors"] == 0 and tail["p99_ms"] is not None and tail["p99_ms"] <= max(slo_ms, 1.5 * steady)))
    return out


def plot(result: dict, runs: Sequence[RunStats], path: str, title: str, slo_ms: float) -> None:
    replay = result.get("replay", {}).get("rows", [])
    reference = ({"replay P50": ([r["achieved_qps"] for r in replay], [r["p50_ms"] for r in replay]),
                  "replay P99": ([r["achieved_qps"] for r in replay], [r["p99_ms"] for r in replay])}
                 if replay else None)
    report.plot_latency_vs_qps(runs, path, title, slo_ms, reference)


@dataclasses.dataclass
class Setup:
    """What the server and the load stand on, from prepare()."""

    source: str
    precision: str
    version_dir: str
    shape: RequestShape
    names: list[str]
    batching: BatchingCandidate
    files: dict[str, str]  # models, batching, monitoring
    env: dict[str, str]  # for the server and the GPU probes
    client_cpus: list[int] | None
    server_cpus: list[int] | None
    work: str
    profile_dir: str  # where the server's stack sampler writes


def prepare(args: argparse.Namespace, part: Part, defaults: Defaults, result: Result) -> Setup:
    """The export and its bucket warmup, the config files, then (as the part asks) GPU memory per model and
    tune-batching: all before the measured server starts, while the GPU is free."""
    source = "tiny" if args.cpu else part.source
    precision = "fp32" if args.cpu else args.precision  # the CPU kernels' half path is not what this measures
    work = args.workdir or tempfile.mkdtemp(prefix="serve_sweep-")
    lengths = tuple(int(n) for n in read_lengths(args.lengths))
    cpus = sorted(os.sched_getaffinity(0))
    client_cpus = cpus[-args.client_cpus:] if args.client_cpus else None
    server_cpus = cpus[:-args.client_cpus] if args.client_cpus else None
    env = dict(os.environ, TF_FORCE_GPU_ALLOW_GROWTH="true", **({} if args.cpu else {"CUDA_VISIBLE_DEVICES": "0"}))
    if args.server_pythonpath:  # another checkout's server (serve_ab.sh); the clients and this harness stay ours
        env.update(PYTHONPATH=os.pathsep.join(filter(None, [os.path.abspath(args.server_pythonpath),
                                                             env.get("PYTHONPATH")])))
    profile_dir = os.path.join(work, "stack_samples")
    if args.profile_s > 0:  # the stack sampler waits in the server for profile_step's signals
        env.update(PYTHONPATH=os.pathsep.join(filter(None, [SAMPLER_PATH, env.get("PYTHONPATH")])),
                   BERTSERVE_STACK_SAMPLES=profile_dir)

    start = time.monotonic()
    version_dir, config = serving_setup.export_version(source, precision, os.path.join(work, "models"), args.carry)
    shape = RequestShape(REPLIES, SEQ, lengths, config.vocab_size)
    names = [source] if part.models == 1 else [f"{source}_{i}" for i in range(part.models)]
    batching, batching_source = choose_batching(args, defaults)
    tune_grid = (GPU_TUNE_GRID if not args.cpu else (defaults.batching, dataclasses.replace(
        defaults.batching, num_batch_threads=1))) if args.batching == "tune" else ()
    warm_sizes = sorted({s for c in (batching, *tune_grid) for s in c.allowed_batch_sizes})
    records = serving_setup.warm_every_bucket(version_dir, config, shape, warm_sizes)
    result.data["model"] = {"source": source, "precision": precision, "variant": "fused", "names": names,
                            "config": dataclasses.asdict(config), "export_s": round(time.monotonic() - start, 1)}
    result.data["load"] = {"api": "gRPC Predict, tensorflow_serving.apis stubs (grpc.aio)",
                           "replies_per_query": REPLIES, "max_len": SEQ, "lengths": args.lengths,
                           "lengths_range": [min(lengths), max(lengths)], "client_processes": args.clients,
                           "client_cpus": client_cpus, "server_cpus": server_cpus, "step_s": args.duration,
                           "timeout_s": args.timeout, "models_round_robin": len(names)}
    result.data["warmup"] = {"records": records, "batch_sizes": warm_sizes,
                             "covers": f"every (allowed batch size, token bucket) for pair lengths "
                                       f"{min(lengths)}..{min(max(lengths), SEQ)}"}
    config_dir = os.path.join(work, "config")
    files = serving_setup.write_config_files(config_dir, names, os.path.dirname(version_dir), batching)
    result.save()

    if part.memory:
        dirs = {precision: version_dir}
        if not args.cpu:  # fp32 beside the served fp16
            fp32_dir, _ = serving_setup.export_version(source, "fp32", os.path.join(work, "models_fp32"), args.carry)
            serving_setup.warm_every_bucket(fp32_dir, config, shape, warm_sizes)
            dirs["fp32"] = fp32_dir
        result.data["memory_per_model"] = memory_per_model(source, dirs, args.memory_copies, env, work)
        result.save()
        if not args.cpu:
            result.data["memory_fraction"] = memory_fraction_check(names[0], version_dir, env, work, GpuSampler())
            result.save()
    if args.batching == "tune":
        batching, result.data["tune_batching"] = tune_batching(
            args, tune_grid, files["models"], names[0], work, env,
            list(args.serve_flag) + [f"--monitoring_config_file={files['monitoring']}"])
        batching_source = "bertserve tune-batching on this machine"
        files = serving_setup.write_config_files(config_dir, names, os.path.dirname(version_dir), batching)
    result.data["batching"] = {**dataclasses.asdict(batching), "source": batching_source}
    result.save()
    return Setup(source, precision, version_dir, shape, names, batching, files, env, client_cpus, server_cpus, work,
                 profile_dir)


def start_server(args: argparse.Namespace, setup: Setup, gpu: GpuSampler, budget: Budget,
                 result: Result) -> ServerProcess:
    """`bertserve serve` on the server's cores, timed from start to every model AVAILABLE."""
    files = setup.files
    flags = [f"--model_config_file={files['models']}", "--enable_batching=true",
             f"--batching_parameters_file={files['batching']}", f"--monitoring_config_file={files['monitoring']}",
             "--file_system_poll_wait_seconds=1", *args.serve_flag]
    memory_before = gpu.memory_mib()
    start = time.monotonic()
    server = ServerProcess(flags, os.path.join(setup.work, "serve.log"), env=setup.env)
    result.data["server"] = {"flags": flags, "env": {k: setup.env[k] for k in ("TF_FORCE_GPU_ALLOW_GROWTH",
                                                                               "CUDA_VISIBLE_DEVICES")
                                                     if k in setup.env}}
    if setup.server_cpus:
        try:
            os.sched_setaffinity(server.proc.pid, setup.server_cpus)
        except OSError as error:
            result.data["load"]["server_cpus"] = f"pinning refused: {error}"
    try:
        server.wait_until_available(setup.names, timeout_s=max(60.0, budget.left() - 60))
    except BaseException:
        server.terminate()
        raise
    available_s = time.monotonic() - start
    memory_after = gpu.memory_mib()
    result.data["server"].update({
        "start_to_available_s": round(available_s, 1),
        "warmup_log": re.findall(r"model \S+ version \d+: warmed up with \d+ requests", server.log()),
        "gpu_memory_before_mib": memory_before, "gpu_memory_available_mib": memory_after,
        "gpu_memory_per_model_mib": (round((memory_after - memory_before) / len(setup.names), 1)
                                     if memory_before is not None else None)})
    print(f"AVAILABLE after {available_s:.1f} s ({result.data['warmup']['records']} warmup records per model)",
          flush=True)
    result.save()
    return server


def load_the_server(args: argparse.Namespace, part: Part, setup: Setup, server: ServerProcess, gpu: GpuSampler,
                    budget: Budget, result: Result) -> list[RunStats]:
    """The sweep, then recovery and the version swap on the same client processes, then the REST load."""
    models = tuple(ModelSpec(n) for n in setup.names)
    spec = LoadSpec((server.target,), models, setup.shape, args.timeout)
    rates = _csv(args.rates)
    with ClientProcesses(spec, args.clients, setup.client_cpus) as load:
        runs = sweep_rates(load, server, gpu, rates, args, budget, result)
        result.data["load"]["client_process_cores"] = load.cores
        best = [r for r in runs if meets_slo(r, SweepConfig(slo_p99_ms=args.slo_ms))]
        low = args.recovery_qps or (max(r.load for r in best) / 2 if best else rates[0])
        if args.profile_s > 0 and runs:
            unsaturated = [r.load for r in runs if not saturation(r, SweepConfig(slo_p99_ms=args.slo_ms))]
            qps = args.profile_qps or max(unsaturated, default=rates[0])
            if budget.allows(args.profile_s + args.reserve_s / 2):
                result.data["server_profile"] = profile_step(load, server, gpu, qps, setup.profile_dir, args)
                result.save()
            else:
                result.skip("server_profile", f"{budget.left():.0f} s left")
        if part.recovery and runs:
            if budget.allows(args.overload_s + args.recovery_s + args.reserve_s / 2):
                result.data["recovery"] = recovery_step(load, server, gpu, runs[-1].load, low, args)
                result.save()
            else:
                result.skip("recovery", f"{budget.left():.0f} s left")
        if part.swap and not args.no_swap:
            if budget.allows(args.swap_s + args.reserve_s / 2):
                result.data["swap"] = swap_step(load, server, gpu, setup.version_dir, setup.names[0], low, args)
                result.save()
            else:
                result.skip("swap", f"{budget.left():.0f} s left")
    if part.rest and args.rest_qps > 0:
        if budget.allows(args.duration + 30):
            rest_spec = LoadSpec((server.rest_target,), models, setup.shape, args.timeout, api="rest")
            with ClientProcesses(rest_spec, args.rest_clients, setup.client_cpus) as load:
                _, row = measured_step(load, server, gpu, [Phase(args.rest_qps, args.duration)], seed=303)
            _print_step("REST", row)
            result.data["rest"] = row
            result.save()
        else:
            result.skip("rest", f"{budget.left():.0f} s left")
    return runs


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    # This process exports and writes files with TensorFlow: left to itself it would claim GPU:0's memory, which
    # belongs to the server (and the replay and memory probes after it).
    tf.config.set_visible_devices([], "GPU")
    part = PARTS[args.part]
    defaults = CPU if args.cpu else GPU
    for field in ("rates", "duration", "clients", "client_cpus", "rest_qps", "slo_ms", "budget_s"):
        if getattr(args, field) is None:
            setattr(args, field, getattr(defaults, field))
    budget = Budget(args.budget_s)
    gpu = GpuSampler()
    if not args.cpu and gpu.name is None:
        raise SystemExit("no GPU found (NVML, nvidia-smi): run with --cpu on a machine without one")
    os.makedirs(args.out, exist_ok=True)
    stem = gpu_result_name(gpu.name, f"serving_{args.part}") if not args.cpu else f"cpu_serving_{args.part}.json"
    result = Result(os.path.join(args.out, stem), {
        "part": args.part, "command": " ".join([os.path.basename(sys.argv[0]), *argv]), "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": gpu.name, "host": machine(),
        "python": platform.python_version()})
    setup = prepare(args, part, defaults, result)

    with gpu:
        server = start_server(args, setup, gpu, budget, result)
        try:
            runs = load_the_server(args, part, setup, server, gpu, budget, result)
        finally:
            result.data["server"].update(exit_code=server.terminate(), log_tail=server.log_tail(15))
            result.save()

    if part.replay and not args.no_replay:
        replay_rates = [r.load for r in runs]
        if args.cpu:
            result.skip("replay", "the harness replay needs the CUDA core (a GPU)")
        elif not replay_rates:
            result.skip("replay", "no sweep step ran")
        elif not os.path.exists(args.harness_lib):
            result.skip("replay", f"no harness library at {args.harness_lib} (carry .device_carry/cuda)")
        elif budget.allows(30 + len(replay_rates) * (args.replay_seconds + 1)):
            result.data["replay"] = run_replay(args, setup.source, setup.batching, replay_rates, setup.env,
                                               setup.work)
        else:
            result.skip("replay", f"{budget.left():.0f} s left")
    result.data["targets"] = targets(result.data, args.slo_ms)
    result.data["wall_s"] = round(args.budget_s - budget.left(), 1)
    result.save()
    if runs:
        title = (f"bertserve serve, {args.part}: {setup.source} {setup.precision}, {REPLIES} pairs/query, "
                 f"{args.clients} client processes; {gpu.name or report.machine_label()}")
        print(report.markdown_table(runs, title))
        plot(result.data, runs, os.path.splitext(result.path)[0] + ".png", title, args.slo_ms)
    print(json.dumps(result.data["targets"], indent=1))
    print(f"wrote {result.path} in {result.data['wall_s']:.0f} s", flush=True)
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--part", choices=sorted(PARTS), required=True)
    p.add_argument("--out", required=True, help="folder for the JSON and PNG (on the GPU machine: $OUT)")
    p.add_argument("--cpu", action="store_true", help="a dry run on a CPU machine: tiny model, low rates")
    p.add_argument("--precision", choices=("fp16", "fp32"), default="fp16")
    p.add_argument("--rates", help="offered queries/s, comma-separated (default: the GPU's or the CPU's list)")
    p.add_argument("--duration", type=float, help="seconds per rate")
    p.add_argument("--past_saturation", type=int, default=2, help="rates run after the first that breaks")
    p.add_argument("--extend_factor", type=float, default=1.25, help="growth past the list's end before it breaks")
    p.add_argument("--slo_ms", type=float, help="P99 budget that ends the sweep (default: 10 on the GPU)")
    p.add_argument("--timeout", type=float, default=5.0, help="per-request deadline (s)")
    p.add_argument("--clients", type=int, help="client processes for the gRPC load")
    p.add_argument("--client_cpus", type=int,
                   help="the last N cores go to the clients, the others to the server (0: no pinning)")
    p.add_argument("--lengths", default=LENGTHS, help="pair lengths to draw from (default: the shipped pairs)")
    p.add_argument("--batching", choices=("hand", "tune"), default="hand",
                   help="hand: --batching_file or the flags below; tune: bertserve tune-batching here first")
    p.add_argument("--batching_file", help="a BatchingParameters text file to serve with")
    p.add_argument("--max_batch_size", type=int)
    p.add_argument("--batch_timeout_micros", type=int)
    p.add_argument("--num_batch_threads", type=int)
    p.add_argument("--allowed_batch_sizes", help="comma-separated")
    p.add_argument("--max_enqueued_batches", type=int)
    p.add_argument("--tune_start", type=float, default=1000.0, help="tune-batching: first QPS of each sweep")
    p.add_argument("--tune_factor", type=float, default=1.6)
    p.add_argument("--tune_steps", type=int, default=5)
    p.add_argument("--tune_duration", type=float, default=3.0)
    p.add_argument("--serve_flag", action="append", default=[],
                   help="extra `bertserve serve` flag, repeatable (e.g. --serve_flag=--grpc_front_end_processes=4)")
    p.add_argument("--rest_qps", type=float, help="the REST load's rate (0: none)")
    p.add_argument("--rest_clients", type=int, default=2)
    p.add_argument("--recovery_qps", type=float, help="the rate after the overload (default: half the best "
                                                      "within the SLO)")
    p.add_argument("--overload_s", type=float, default=5.0)
    p.add_argument("--recovery_s", type=float, default=10.0)
    p.add_argument("--swap_s", type=float, default=20.0, help="length of the run a version swap happens in")
    p.add_argument("--swap_at_s", type=float, default=3.0)
    p.add_argument("--no_swap", action="store_true")
    p.add_argument("--timeline_bin_s", type=float, default=0.5)
    p.add_argument("--profile_s", type=float, default=8.0,
                   help="a run of this length with the server's threads stack-sampled (0: none)")
    p.add_argument("--profile_qps", type=float, help="its rate (default: the highest the server kept up with)")
    p.add_argument("--memory_copies", type=int, default=2, help="eight_models: copies loaded per precision")
    p.add_argument("--no_replay", action="store_true")
    p.add_argument("--replay_seconds", type=float, default=2.0)
    p.add_argument("--replay_timeout_s", type=float, default=240.0)
    p.add_argument("--harness_lib", default=os.path.join(CARRY, "cuda", "libbertserve_cuda.so"))
    p.add_argument("--carry", default=CARRY, help="folder of the carried MiniLM files")
    p.add_argument("--budget_s", type=float, help="wall-clock budget of the whole run (a device call: 600 s)")
    p.add_argument("--reserve_s", type=float, default=90.0, help="kept from the sweep for the stages after it")
    p.add_argument("--workdir", help="exports, config files, server log (default: a temporary folder)")
    p.add_argument("--server_pythonpath", help="a folder holding another checkout as `bertserve` (its front end "
                   "built): the server runs that code")
    return p.parse_args(list(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
