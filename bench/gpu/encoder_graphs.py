"""The encoder as the TF GPU kernel runs it: the core's BucketedEncoder copies a batch's real tokens into an arena of
their token bucket and replays a CUDA graph per (batch, bucket) from the core's GraphCache. Checked, then timed,
against the same launches one by one on the same arena (the TF kernel's way before graphs).

Check (fp16 and fp32 encoders, planned without autotuning as in the TF kernel; all-token and first-token outputs;
batches 1-1,100 of lengths U[0,32] with empty rows, the same lengths permuted, and all-32): every graph call equal to
the eager launches bit for bit (a key's first call, replays with other tokens of the same bucket, keys interleaved),
a graph captured on a key's first call only (none lost when the arena grows), and both against the float32 torch
reference encoder on the same fp16-rounded input; then calls from 4 threads at once onto one stream (keys mixed, one
batch without tokens), each equal to its launches.
Timing (fp16, first tokens, U[8,32]; the core's call alone, its inputs made beforehand): a bucket's first call, host
to host per call (each waited for, as one serving request is), back to back (the host's or the GPU's pace), and the
host's time in a call; launches, graphs, and graphs of autotuned plans, alternating in one process; and the GEMM
plans of both rankers.

Usage (on the GPU machine, after `source gpu_rig/env.sh`):
  python3 bench/gpu/encoder_graphs.py LIB.so [--out FILE.json (default bench/results/gpu_<gpu>_encoder_graphs.json)]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time

import numpy as np
import torch

from bertserve.bench.gpu import core, torch_models
from bertserve.bench.gpu.harness import (RESULTS_DIR, SEQ, WARMUP_S, chitchat_random, compare, environment,
                                         result_name)

CHECK_BATCHES = (1, 3, 8, 32, 128, 1100)  # 1,100: cu_seqlens past the 1,000 indices one staging launch carries
TIME_BATCHES = (1, 8, 16, 32, 64, 128)  # 1, the batch sizes serving_config's batcher pads to, and 128
REL_L2_LIMIT = {torch.float16: 5e-3, torch.float32: 1e-4}


class EncoderInput:
    """A batch's packed encoder input (the reference embedding, rounded to the encoder's dtype) and the float32
    reference encoder's output on it: every token's [N, H], or each row's first token [B, H] (zeros when empty)."""

    def __init__(self, w32: dict[str, torch.Tensor], config: dict, dtype: torch.dtype, lengths: np.ndarray,
                 rng: np.random.Generator):
        b = len(lengths)
        ids = torch.as_tensor(rng.integers(0, config["vocab_size"], (b, SEQ)), device="cuda")
        segments = torch.as_tensor(rng.integers(0, 2, (b, SEQ)), device="cuda")
        real = torch.arange(SEQ, device="cuda")[None] < torch.as_tensor(lengths, device="cuda")[:, None]
        with torch.no_grad():
            x = torch_models.reference_embedding(w32, config, ids, segments).to(dtype)
            out = torch_models.reference_encoder(w32, config, x.float(), lengths)
        self.lengths = lengths
        self.hidden = x[real].contiguous()
        self.all_tokens = out[real]
        self.first_tokens = torch.where(real[:, :1], out[:, 0], torch.zeros_like(out[:, 0]))


def check(lib, config: dict, w32: dict[str, torch.Tensor], rng: np.random.Generator) -> tuple[list[dict], bool]:
    rows, ok = [], True
    for dtype in (torch.float16, torch.float32):
        weights = {k: v.to(dtype).float() for k, v in w32.items()}
        ranker = core.CudaRanker(lib, config, weights, dtype, max(CHECK_BATCHES), SEQ, autotune=False)
        first_lengths = {b: np.concatenate([[0], rng.integers(0, SEQ + 1, b - 1)]).astype(np.int32) if b > 1
                         else np.array([int(rng.integers(1, SEQ + 1))], np.int32) for b in CHECK_BATCHES}
        permuted = {b: rng.permutation(v) for b, v in first_lengths.items()}
        cases = [("U0_32", first_lengths), ("U0_32 permuted", permuted),
                 ("all32", {b: np.full(b, SEQ, np.int32) for b in CHECK_BATCHES}),
                 ("U0_32 again, new tokens", first_lengths)]
        seen: set[tuple[int, int, bool]] = set()  # (batch, token bucket, first_token_only): the keys captured so far
        for case, lengths_by_batch in cases:
            for first_token_only in (True, False):
                for b in CHECK_BATCHES:
                    inp = EncoderInput(weights, config, dtype, lengths_by_batch[b], rng)
                    eager = ranker.encoder(inp.hidden, inp.lengths, first_token_only, graphs=False)
                    held = ranker.encoder_graph_count()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    graph = ranker.encoder(inp.hidden, inp.lengths, first_token_only, graphs=True)
                    torch.cuda.synchronize()
                    graph_call_ms = (time.perf_counter() - t0) * 1e3
                    replay = ranker.encoder(inp.hidden, inp.lengths, first_token_only, graphs=True)
                    ref = inp.first_tokens if first_token_only else inp.all_tokens
                    tokens = int(inp.lengths.sum())
                    row = {"dtype": str(dtype).removeprefix("torch."), "lengths": case, "batch": b,
                           "tokens": tokens, "token_bucket": ranker.token_bucket(tokens),
                           "first_token_only": first_token_only,
                           # a key's first call launches eagerly, then captures and instantiates its graph
                           "captured": ranker.encoder_graph_count() > held, "graph_call_ms": graph_call_ms,
                           "graph_vs_eager_max_abs": float((graph.float() - eager.float()).abs().max()),
                           "replay_vs_eager_max_abs": float((replay.float() - eager.float()).abs().max()),
                           "eager_vs_torch_fp32": compare(eager, ref), "graph_vs_torch_fp32": compare(graph, ref)}
                    key = (b, row["token_bucket"], first_token_only)  # lengths <= 32: one attention size class
                    row["expected_capture"] = key not in seen
                    seen.add(key)
                    good = (row["graph_vs_eager_max_abs"] == 0 and row["replay_vs_eager_max_abs"] == 0
                            and row["captured"] == row["expected_capture"]
                            and row["eager_vs_torch_fp32"]["finite"]
                            and row["eager_vs_torch_fp32"]["rel_l2"] < REL_L2_LIMIT[dtype])
                    row["ok"] = bool(good)
                    ok &= good
                    rows.append(row)
        rows.append({"dtype": str(dtype).removeprefix("torch."), "graphs_held": ranker.encoder_graph_count()})
        ranker.close()
    return rows, ok


def check_threads(lib, config: dict, w32: dict[str, torch.Tensor], rng: np.random.Generator) -> dict:
    """Calls from several threads at once onto one stream, as TF Serving's batch threads reach the TF kernel on its
    compute stream: a mix of keys (some captured while the others wait), a batch with no tokens at all, and every
    output equal to the launches' one by one computed before."""
    weights = {k: v.half().float() for k, v in w32.items()}
    ranker = core.CudaRanker(lib, config, weights, torch.float16, 8, SEQ, autotune=False)
    cases = []
    for b, first_token_only in ((1, True), (3, True), (8, True), (3, False), (8, False), (3, True)):
        lengths = np.zeros(b, np.int32) if len(cases) == 5 else rng.integers(0, SEQ + 1, b).astype(np.int32)
        inp = EncoderInput(weights, config, torch.float16, lengths, rng)
        cases.append((inp, first_token_only, ranker.encoder(inp.hidden, inp.lengths, first_token_only, graphs=False)))
    torch.cuda.synchronize()
    mismatches: list[int] = []

    def worker(offset: int) -> None:
        for call in range(30):
            inp, first_token_only, expected = cases[(offset + call) % len(cases)]
            out = ranker.encoder(inp.hidden, inp.lengths, first_token_only, graphs=True)
            if not torch.equal(out, expected):
                mismatches.append(call)

    threads = 4
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))  # re-raises a worker's exception
    result = {"threads": threads, "calls": 30 * threads, "mismatches": len(mismatches),
              "graphs_held": ranker.encoder_graph_count(), "empty_batch_first_tokens_zero":
              bool(torch.count_nonzero(cases[5][2]) == 0)}
    result["ok"] = result["mismatches"] == 0 and result["empty_batch_first_tokens_zero"]
    ranker.close()
    return result


def host_to_host_us(call, calls: int) -> dict:
    """Each call waited for before the next, as one serving request at a time: median and P99 microseconds."""
    start = time.monotonic()
    while time.monotonic() - start < WARMUP_S:
        call()
        torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return {"median_us": float(np.median(samples)), "p99_us": float(np.percentile(samples, 99))}


def back_to_back_us(call, calls: int) -> float:
    """Calls issued without waiting, then one wait: microseconds a call, the host's or the GPU's rate."""
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / calls


def issue_us(call, calls: int) -> float:
    """The host's time in one call, not waiting for the GPU (a wait every 50 calls keeps the queue short): median."""
    samples = []
    for i in range(calls):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e6)
        if i % 50 == 49:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return float(np.median(samples))


# (mode, graphs, autotuned): the TF kernel's launches before graphs, its graphs now (planned without autotuning),
# and graphs of the harness's autotuned plans, which a serving op does not make (a new bucket's autotuning takes a
# large fraction of a second).
MODES = (("eager", False, False), ("graphs", True, False), ("graphs_autotuned", True, True))


def timings(lib, config: dict, w32: dict[str, torch.Tensor], rng: np.random.Generator,
            rounds: int) -> tuple[list[dict], dict[str, list[str]]]:
    """Each TIME_BATCHES row's times, and the GEMM plans of the untuned and the autotuned ranker."""
    weights = {k: v.half().float() for k, v in w32.items()}
    rankers = {tuned: core.CudaRanker(lib, config, weights, torch.float16, max(TIME_BATCHES), SEQ, autotune=tuned)
               for tuned in (False, True)}
    rows = []
    for b in TIME_BATCHES:
        inp = EncoderInput(weights, config, torch.float16, rng.integers(8, SEQ + 1, b).astype(np.int32), rng)
        cu = core.cu_seqlens_of(inp.lengths)
        out = torch.empty((b, config["hidden_size"]), dtype=torch.float16, device="cuda")
        row: dict = {"batch": b, "tokens": int(inp.lengths.sum()), "first_token_only": True}
        calls = {mode: (lambda r=rankers[tuned], g=graphs: r.encoder_into(inp.hidden, cu, out, True, g))
                 for mode, graphs, tuned in MODES}
        for mode, call in calls.items():  # a bucket's first call: planning (autotuning where on), capture
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            row[f"{mode}_first_call_ms"] = (time.perf_counter() - t0) * 1e3
        for _ in range(rounds):
            for mode, call in calls.items():
                row.setdefault(mode, []).append({"host_to_host": host_to_host_us(call, 300),
                                                 "back_to_back_us": back_to_back_us(call, 300),
                                                 "issue_us": issue_us(call, 300)})
        for mode in calls:
            row[f"{mode}_best_median_us"] = min(t["host_to_host"]["median_us"] for t in row[mode])
            row[f"{mode}_best_back_to_back_us"] = min(t["back_to_back_us"] for t in row[mode])
            row[f"{mode}_best_issue_us"] = min(t["issue_us"] for t in row[mode])
        row["eager_over_graphs_host_to_host"] = row["eager_best_median_us"] / row["graphs_best_median_us"]
        print(json.dumps({k: v for k, v in row.items() if k not in calls}), flush=True)
        rows.append(row)
    plans = {"autotuned" if tuned else "untuned": ranker.gemm_plans() for tuned, ranker in rankers.items()}
    for ranker in rankers.values():
        ranker.close()
    return rows, plans


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("lib")
    parser.add_argument("--out", help="default: bench/results/gpu_<gpu>_encoder_graphs.json")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    lib = core.load_library(args.lib)
    config, w32 = chitchat_random()
    rng = np.random.default_rng(7)
    check_rows, ok = check(lib, config, w32, rng)
    print("check:", "ok" if ok else "FAILED", sum(r.get("ok", True) for r in check_rows), "of", len(check_rows),
          flush=True)
    threads = check_threads(lib, config, w32, rng)
    print("threads:", json.dumps(threads), flush=True)
    ok &= threads["ok"]
    result = {"environment": environment(), "check_ok": ok, "check": check_rows, "threads": threads}
    result["timing"], result["gemm_plans"] = timings(lib, config, w32, rng, args.rounds)
    with open(args.out or os.path.join(RESULTS_DIR, result_name("encoder_graphs")), "w") as f:
        json.dump(result, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
