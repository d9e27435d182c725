"""Where one forward's time goes, kernel by kernel: the CUPTI timeline (torch profiler) of one CUDA-graph replay of
the chit-chat ranker at U[8,32] lengths. Each kernel's start and end, and its step: from the end of the kernel
before it to its own end, i.e. what it adds to the forward. In the launch chain a kernel starts before the one
before it ends, so its duration overstates its cost and the steps, which add up to the forward, are the measure.

Usage (on the GPU machine, from the repository root, after `source gpu_rig/env.sh`):
  python3 bench/gpu/probes/timeline.py LIB [--batches 1,32] [--out F (default bench/results/gpu_<gpu>_timeline.json)]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch
from torch.autograd import DeviceType

from bertserve.bench.gpu import core, harness

REPLAYS = 3  # profiled back to back; the middle one is reported


def timeline(ranker: core.CudaRanker, vocab_size: int, batch: int, rng: np.random.Generator) -> dict:
    lengths = harness.lengths_for("U8_32", batch, rng)
    ids = torch.randint(1000, vocab_size, (batch, harness.SEQ), dtype=torch.int32, device="cuda")
    bucket = ranker.token_bucket(ranker.stage(ids, torch.zeros_like(ids), lengths))
    graph = ranker.graph_for(batch, bucket)
    for _ in range(200):  # clocks up, plans made
        graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    events = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                    if e.device_type == DeviceType.CUDA)
    per_replay = len(events) // REPLAYS
    middle = events[per_replay:2 * per_replay]
    t0 = middle[0][0]
    kernels, previous_end = [], t0
    for start, end, name in middle:
        kernels.append({"kernel": harness.kernel_label(name), "start_us": round(start - t0, 2),
                        "end_us": round(end - t0, 2), "step_us": round(end - previous_end, 2)})
        previous_end = end
    return {"batch": batch, "tokens": int(lengths.sum()), "bucket": bucket, "kernels_per_forward": per_replay,
            "forward_us": round(middle[-1][1] - t0, 1), "kernels": kernels}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lib")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--out", help="default: bench/results/gpu_<gpu>_timeline.json")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    cfg, w32 = harness.chitchat_random()
    ranker = core.CudaRanker(core.load_library(args.lib), cfg, w32, torch.float16, max(batches), harness.SEQ)
    rng = np.random.default_rng(9)
    result = {"environment": harness.environment(), "timelines": []}
    for batch in batches:
        t = timeline(ranker, cfg["vocab_size"], batch, rng)
        result["timelines"].append(t)
        print(f"batch {batch}, {t['tokens']} tokens (bucket {t['bucket']}): {t['kernels_per_forward']} kernels, "
              f"{t['forward_us']} us", flush=True)
        for k in t["kernels"]:
            print(f"  {k['start_us']:7.1f} {k['end_us']:7.1f}  step {k['step_us']:5.1f}  {k['kernel'][:70]}")
    ranker.close()
    with open(args.out or os.path.join(harness.RESULTS_DIR, harness.result_name("timeline")), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
