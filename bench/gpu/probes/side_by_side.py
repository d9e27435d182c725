"""Two or more builds of the core side by side on the same GPU: each build runs in a process of its own (its own
GEMM plans, autotuned as the harness does), the processes alternate build by build for a number of repetitions,
and each times CUDA-graph replays of the chit-chat ranker at a few (lengths, batch) rows, every row three rounds;
with --eager also eager launches over the same token bucket, as the TF GPU kernel runs (no graph: the host's
launch work is in the time).
Separate processes because a build's first timings depend on what ran before it in the process (clocks, caches,
plans), and because alternating spreads the machine's drift over every build alike.

Usage (on the GPU machine, from the repository root, after `source gpu_rig/env.sh`):
  python3 bench/gpu/probes/side_by_side.py NAME=LIB [NAME=LIB ...] [--rows U8_32:1,all32:1,...] [--repeat 2] [--eager]
                                    [--out F]
Writes one JSON line per (build, process, row) to F (default: stdout only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

from bertserve.bench.gpu import core, harness

DEFAULT_ROWS = "U8_32:1,all32:1,U8_32:8,U8_32:32,all32:32,U8_32:128"
ROUNDS = 3


def eager_ms(ranker: core.CudaRanker, ids: torch.Tensor, seg: torch.Tensor, lengths: np.ndarray) -> float:
    """Median time of one forward launched eagerly over the token bucket (its GEMMs planned by a graph before)."""
    bucket = ranker.token_bucket(ranker.stage(ids, seg, lengths))
    return harness.median_ms(lambda: ranker.launch(ids.shape[0], bucket))


def time_build(lib_path: str, rows: list[tuple[str, int]], eager: bool) -> list[dict]:
    """Best and worst of ROUNDS graph-replay medians per row (and eager-launch medians), rows interleaved round by
    round."""
    cfg, w32 = harness.chitchat_random()
    ranker = core.CudaRanker(core.load_library(lib_path), cfg, w32, torch.float16, max(b for _, b in rows),
                             harness.SEQ)
    rng = np.random.default_rng(7)  # the same lengths and ids for every build
    inputs = []
    for dist, batch in rows:
        lengths = harness.lengths_for(dist, batch, rng)
        ids = torch.randint(1000, cfg["vocab_size"], (batch, harness.SEQ), dtype=torch.int32, device="cuda")
        inputs.append((dist, batch, ids, torch.zeros_like(ids), lengths))
    times: dict[int, list[float]] = {}
    eager_times: dict[int, list[float]] = {}
    for _ in range(ROUNDS):
        for i, (_, _, ids, seg, lengths) in enumerate(inputs):
            times.setdefault(i, []).append(harness.graph_replay_ms(ranker, ids, seg, lengths))
            if eager:
                eager_times.setdefault(i, []).append(eager_ms(ranker, ids, seg, lengths))
    out = []
    for i, (dist, batch, _, _, lengths) in enumerate(inputs):
        tokens = int(lengths.sum())
        out.append({"dist": dist, "batch": batch, "tokens": tokens, "bucket": ranker.token_bucket(tokens),
                    "best_ms": round(min(times[i]), 4), "worst_ms": round(max(times[i]), 4)})
        if eager:
            out[-1].update(eager_best_ms=round(min(eager_times[i]), 4), eager_worst_ms=round(max(eager_times[i]), 4))
    out[0]["gemm_plans"] = ranker.gemm_plans()
    ranker.close()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builds", nargs="+", help="NAME=path/to/libbertserve_cuda.so")
    parser.add_argument("--rows", default=DEFAULT_ROWS)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--eager", action="store_true", help="also time eager launches")
    parser.add_argument("--out")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = harness.parse_rows(args.rows)
    if args.worker:
        print(json.dumps(time_build(args.builds[0].split("=", 1)[1], rows, args.eager)))
        return 0
    lines = []
    for process in range(args.repeat):
        for build in args.builds:
            name = build.split("=", 1)[0]
            result = subprocess.run([sys.executable, os.path.abspath(__file__), build, "--rows", args.rows,
                                     "--worker"] + (["--eager"] if args.eager else []),
                                    capture_output=True, text=True, check=True)
            for row in json.loads(result.stdout.strip().splitlines()[-1]):
                line = {"build": name, "process": process, **row}
                lines.append(line)
                print(json.dumps({k: v for k, v in line.items() if k != "gemm_plans"}), flush=True)
    if args.out:
        harness.write_jsonl(args.out, ROUNDS, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
