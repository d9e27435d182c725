"""Whether a batch runs faster as micro-batches on concurrent streams: one CUDA graph of the chit-chat ranker over
the whole batch, against one graph that forks the batch's rows into K parts, each a forward of its own ranker (its
own workspace and GEMM plans) on a stream of its own, joined at the end; and the same K forwards one after another
on one stream, which shows what running K smaller forwards costs without the overlap.

At a few hundred to a thousand tokens each GEMM of a forward fills the GPU for only a few microseconds between
its launch, pipeline fill and epilogue; another forward's kernels could fill those gaps.

Usage (on the GPU machine, from the repository root, after `source gpu_rig/env.sh`):
  python3 bench/gpu/probes/split_probe.py LIB [--rows U8_32:8,U8_32:32,all32:32,U8_32:128] [--parts 2,3] [--out F]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from bertserve.bench.gpu import core, harness

ROUNDS = 3


def split_rows(batch: int, parts: int) -> list[slice]:
    edges = np.linspace(0, batch, parts + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def capture(rankers: list[core.CudaRanker], pieces: list[tuple[int, int]], concurrent: bool) -> torch.cuda.CUDAGraph:
    """One graph of len(pieces) forwards (batch, bucket), ranker i running piece i."""
    for ranker, (batch, bucket) in zip(rankers, pieces):
        ranker.launch(batch, bucket)  # plans the GEMMs outside capture
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in pieces[1:]]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        main = torch.cuda.current_stream()
        if not concurrent:
            for ranker, (batch, bucket) in zip(rankers, pieces):
                ranker.launch(batch, bucket)
        else:
            for stream in streams:
                stream.wait_stream(main)
            rankers[0].launch(*pieces[0])
            for ranker, piece, stream in zip(rankers[1:], pieces[1:], streams):
                with torch.cuda.stream(stream):
                    ranker.launch(*piece)
            for stream in streams:
                main.wait_stream(stream)
    return graph


def time_row(whole: core.CudaRanker, split_rankers: dict[int, list[core.CudaRanker]], ids: torch.Tensor,
             seg: torch.Tensor, lengths: np.ndarray) -> dict:
    """Best of ROUNDS replay medians for the whole batch and for each split, variants interleaved round by round.
    Each split has rankers of its own: a graph reads the inputs its rankers staged when it was captured."""
    batch = ids.shape[0]
    whole.stage(ids, seg, lengths)
    whole_graph = whole.graph_for(batch, whole.token_bucket(int(lengths.sum())))
    variants = {"whole": whole_graph.replay}  # bound methods keep their graphs alive
    worst = 0.0
    for parts, rankers in split_rankers.items():
        if parts > batch:
            continue
        pieces = []
        for ranker, rows in zip(rankers, split_rows(batch, parts)):
            n = ranker.stage(ids[rows], seg[rows], lengths[rows])
            pieces.append((rows.stop - rows.start, ranker.token_bucket(n)))
        for concurrent in (True, False):
            graph = capture(rankers, pieces, concurrent)
            whole_graph.replay()
            graph.replay()
            split_scores = torch.cat([r.scores[:b] for r, (b, _) in zip(rankers, pieces)])
            worst = max(worst, float((split_scores - whole.scores[:batch]).abs().max()))
            variants[f"split{parts}_{'streams' if concurrent else 'serial'}"] = graph.replay
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, replay in variants.items():
            times[name].append(harness.median_ms(replay))
    whole.graphs.clear()
    return {**{name: round(min(t), 4) for name, t in times.items()}, "split_vs_whole_max_abs": worst}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lib")
    parser.add_argument("--rows", default="U8_32:8,U8_32:32,all32:32,U8_32:128")
    parser.add_argument("--parts", default="2,3")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    rows = harness.parse_rows(args.rows)
    parts_list = [int(p) for p in args.parts.split(",")]
    lib = core.load_library(args.lib)
    cfg, w32 = harness.chitchat_random()
    max_batch = max(b for _, b in rows)
    def ranker() -> core.CudaRanker:
        return core.CudaRanker(lib, cfg, w32, torch.float16, max_batch, harness.SEQ)

    whole = ranker()
    split_rankers = {parts: [ranker() for _ in range(parts)] for parts in parts_list}
    rng = np.random.default_rng(7)
    out = []
    for dist, batch in rows:
        lengths = harness.lengths_for(dist, batch, rng)
        ids = torch.randint(1000, cfg["vocab_size"], (batch, harness.SEQ), dtype=torch.int32, device="cuda")
        seg = torch.zeros_like(ids)
        tokens = int(lengths.sum())
        row = {"dist": dist, "batch": batch, "tokens": tokens, **time_row(whole, split_rankers, ids, seg, lengths)}
        out.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        harness.write_jsonl(args.out, ROUNDS, out)
    for r in [whole] + [r for rankers in split_rankers.values() for r in rankers]:
        r.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
