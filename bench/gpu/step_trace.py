"""Each launch-chain step of one CUDA-graph replay split in two, from a diagnostic build of the core
(STEP_TRACE=1 custom_ops/kernels/cuda/build.sh OUT; see step_trace.cuh): block 0 of every kernel records when it
reached the programmatic-launch wait, when the wait returned and when it left. Per kernel of the forward, medians
over the replays of: reached / waited / exit (us from the forward's first record), the release (the wait's
return after the kernel before left, its block 0's exit), and its own run after the wait. A GEMM has two records:
its loader warp (reached, waited, exit once the main loop has consumed every stage) and its math warp group
(waited = main loop done, exit = epilogue done). Kernels outside the trace (cuBLASLt's, CUTLASS's persistent ones)
record nothing: the release after one is measured from the traced kernel before it.

Usage (on the GPU machine, from the repository root):
  python3 bench/gpu/step_trace.py LIB [--batches 1,32] [--replays 40] [--out F]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys

import numpy as np
import torch

import run_bench as rb
import core

WORDS, RECORDS = 8, 8192  # step_trace.cuh: kStepTraceWords, kStepTraceRecords
KINDS = {1: "embedding", 2: "layernorm", 3: "attention", 4: "first-token attention", 5: "bias+gelu", 6: "row copy",
         7: "head", 10: "gemm loader", 11: "gemm math"}


def trace(ranker: core.CudaRanker, vocab_size: int, batch: int, replays: int, rng: np.random.Generator) -> dict:
    lengths = rb.lengths_for("U8_32", batch, rng)
    ids = torch.randint(1000, vocab_size, (batch, rb.SEQ), dtype=torch.int32, device="cuda")
    bucket = ranker.token_bucket(ranker.stage(ids, torch.zeros_like(ids), lengths))
    graph = ranker.graph_for(batch, bucket)
    for _ in range(200):  # clocks up, plans made
        graph.replay()
    buffer = torch.zeros(WORDS * (RECORDS + 1), dtype=torch.int64, device="cuda")
    core.check(ranker.lib, ranker.lib.bertserve_cuda_step_trace(ctypes.c_void_p(buffer.data_ptr())))
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    core.check(ranker.lib, ranker.lib.bertserve_cuda_step_trace(None))
    words = buffer.cpu().numpy().view(np.uint64)
    count = int(words[0])
    if count > RECORDS or count % replays != 0:
        raise RuntimeError(f"{count} records for {replays} replays")
    records = words[WORDS:WORDS * (count + 1)].reshape(count, WORDS).astype(np.int64)
    per_replay = count // replays
    forwards = []
    for r in range(replays):
        chunk = records[r * per_replay:(r + 1) * per_replay]
        # By exit time: a kernel's wait returns only once the kernel before has completed, so block 0 of each
        # kernel leaves after the one before it, and a GEMM's loader leaves before its math warp group. Blocks
        # reach their waits out of order when launched early, and a GEMM's two records start at the same time.
        forwards.append(chunk[np.argsort(chunk[:, 5], kind="stable")])
    sequences = [tuple(map(tuple, f[:, :3].tolist())) for f in forwards]
    sequence = max(set(sequences), key=sequences.count)
    kept = [f for f, s in zip(forwards, sequences) if s == sequence]
    if 2 * len(kept) < replays:
        raise RuntimeError(f"no kernel sequence in most replays ({len(set(sequences))} different)")
    stack = np.stack(kept)  # [replays, kernels, WORDS]
    t0 = stack[:, :, 3].min(axis=1, keepdims=True)
    reached, waited, exited = ((stack[:, :, i] - t0) / 1e3 for i in (3, 4, 5))
    steps, previous_exit = [], None
    for i, (kind, dim0, dim1) in enumerate(sequence):
        step = {"kernel": KINDS.get(kind, str(kind)), "dims": [dim0, dim1],
                "reached_us": round(float(np.median(reached[:, i])), 2),
                "waited_us": round(float(np.median(waited[:, i])), 2),
                "exit_us": round(float(np.median(exited[:, i])), 2),
                "wait_cycles": int(np.median(stack[:, i, 6])), "run_cycles": int(np.median(stack[:, i, 7]))}
        if kind == 11:  # the math warp group waits on the loader's stages, not on the kernel before
            step["run_us"] = round(float(np.median(exited[:, i] - waited[:, i])), 2)
        else:
            if previous_exit is not None:
                step["release_us"] = round(float(np.median(waited[:, i] - previous_exit)), 2)
            step["run_us"] = round(float(np.median(exited[:, i] - waited[:, i])), 2)
        if kind != 10:  # a loader leaves before its kernel's epilogue; the math warp group's exit ends the kernel
            previous_exit = exited[:, i]
        steps.append(step)
    return {"batch": batch, "tokens": int(lengths.sum()), "bucket": bucket, "replays": len(kept),
            "records_per_forward": per_replay, "steps": steps}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lib")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    cfg, w32 = rb.chitchat_random()
    lib = core.load_library(args.lib)
    lib.bertserve_cuda_step_trace.argtypes = [ctypes.c_void_p]
    ranker = core.CudaRanker(lib, cfg, w32, torch.float16, max(batches), rb.SEQ)
    rng = np.random.default_rng(9)
    result = {"environment": rb.environment(), "traces": []}
    for batch in batches:
        t = trace(ranker, cfg["vocab_size"], batch, args.replays, rng)
        result["traces"].append(t)
        print(f"batch {batch}, {t['tokens']} tokens (bucket {t['bucket']}): {t['records_per_forward']} records")
        for s in t["steps"]:
            print(f"  {s['reached_us']:7.2f} {s['waited_us']:7.2f} {s['exit_us']:7.2f}  release "
                  f"{s.get('release_us', float('nan')):5.2f}  run {s['run_us']:5.2f}  {s['kernel']} {s['dims']}")
    ranker.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
