"""The harness replay at a served run's batching, lengths and padding: the ceiling the server is compared with.

serving_replay.py runs the CUDA core through its C ABI under TF Serving's batching rules, without a server; here at
the server's batching parameters, pair lengths and padding (copies of the first row), at each rate it was loaded at.

It runs in a process of its own, without TensorFlow (torch and TensorFlow each bring their CUDA libraries), after
the server has stopped, so the two never share the GPU. Graphs are captured first for every (batch size, token
bucket) the traffic can meet (export/bucket_warmup.py, the shapes the server's warmup covers), so none is captured while
timing; the Python mirror of the core's TokenBucket is checked against the library on the way.

Usage (GPU machine, after `source gpu_rig/env.sh`; serve_sweep.py runs it):
  python3 bench/gpu/replay_ceiling.py --out replay.json --model chitchat --max_batch_size 256 \
      --batch_timeout_micros 1000 --allowed 32,64,128,256 --rates 1000,2000,4000
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bertserve.bench.gpu import core, serving_replay
from bertserve.bench.gpu.harness import DEVICE_CARRY, SEQ, chitchat_random, config_dict, to_torch
from bertserve.export.bucket_warmup import bucket_shapes, token_bucket
from bertserve.train.pairs import LENGTHS, read_lengths


def ranker_weights(model: str, carry: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """The served model's config and weights on the GPU: the random chit-chat ranker or the carried MiniLM."""
    if model == "chitchat":
        return chitchat_random()
    from bertserve.gpu_rig.reference import minilm_weights

    weights = minilm_weights(carry)
    return config_dict(weights.config), to_torch(weights.arrays)


def capture_graphs(ranker: core.CudaRanker, allowed: tuple[int, ...], lo: int, hi: int) -> int:
    """Every (size, bucket) graph a padded batch can need (padding rows copy the first, as TF Serving's)."""
    for tokens in range(1, max(allowed) * SEQ + 1):
        if token_bucket(tokens) != ranker.token_bucket(tokens):
            raise RuntimeError(f"bucket_warmup.token_bucket({tokens}) = {token_bucket(tokens)}, the core's "
                               f"{ranker.token_bucket(tokens)}: the mirror is out of date")
    for size, tokens in bucket_shapes(allowed, lo, hi):
        ranker.graph_for(size, ranker.token_bucket(tokens))
    torch.cuda.synchronize()
    return len(ranker.graphs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", choices=("chitchat", "minilm"), default="chitchat")
    parser.add_argument("--carry", default=DEVICE_CARRY, help="folder of the MiniLM files (prepare_carry.py)")
    parser.add_argument("--harness_lib", default=f"{DEVICE_CARRY}/cuda/libbertserve_cuda.so")
    parser.add_argument("--max_batch_size", type=int, required=True)
    parser.add_argument("--batch_timeout_micros", type=int, required=True)
    parser.add_argument("--allowed", required=True, help="allowed_batch_sizes, comma-separated")
    parser.add_argument("--rates", required=True, help="queries/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=2.0, help="per rate")
    parser.add_argument("--replies", type=int, default=32)
    parser.add_argument("--lengths", default=LENGTHS, help="pair lengths to draw from, one a line")
    args = parser.parse_args(argv)
    allowed = tuple(int(a) for a in args.allowed.split(","))
    lengths = tuple(int(n) for n in read_lengths(args.lengths))
    params = serving_replay.BatchingParameters(args.max_batch_size, args.batch_timeout_micros, allowed)
    config, weights = ranker_weights(args.model, args.carry)
    ranker = core.CudaRanker(core.load_library(args.harness_lib), config, weights, torch.float16,
                             args.max_batch_size, SEQ)
    t0 = time.time()
    graphs = capture_graphs(ranker, allowed, min(lengths), min(max(lengths), SEQ))
    result = {"model": args.model, "precision": "fp16", "gpu": torch.cuda.get_device_name(0),
              "batching": {"max_batch_size": args.max_batch_size, "batch_timeout_micros": args.batch_timeout_micros,
                           "allowed_batch_sizes": list(allowed)},
              "replies_per_query": args.replies, "lengths": args.lengths, "padding": "copies of the first row",
              "graphs": graphs, "graph_capture_s": round(time.time() - t0, 1), "rows": []}
    for qps in (float(r) for r in args.rates.split(",")):
        traffic = serving_replay.Traffic(qps=qps, replies_per_query=args.replies, seconds=args.seconds,
                                         lengths=lengths, pad_with_first_row=True)
        row = serving_replay.replay(ranker, params, traffic, seed=int(qps))
        row["graphs_after"] = len(ranker.graphs)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    ranker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
