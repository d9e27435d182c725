"""Small forwards of every kernel variant, for compute-sanitizer (memcheck / racecheck) on the GPU machine:
fp16 (with the CUTLASS GEMMs of the launch chain, untuned and, once per head size, autotuned: every candidate
launched with the kernel that reads its output, on scratch; cuBLASLt only) and fp32, rows of length 0..seq, seq
32 / 64 / 128 (the fused attention's three sizes) and 200 (the streaming attention), batches of 1, 2 and 8 rows
(the first-token layer's few-row GEMMs; 27 tokens at 2 rows: small-m GEMMs), a graph bucket with scratch rows, the
encoder as the TF kernel runs it (eager, and captured then replayed from the core's graph cache), the untuned
tiles of a few hundred to a few thousand tokens, and the padding ops.

Usage (on the GPU machine, after `source gpu_rig/env.sh`):
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/gpu/sanitize_core.py LIB.so
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from bertserve.bench.gpu import core
from bertserve.bench.gpu.correctness import check_padding_ops
from bertserve.bench.gpu.harness import config_dict
from bertserve.export.weights import BertConfig, BertWeights


def check_wave_fill_tiles(lib) -> None:
    """The untuned rules above 256 rows pick tiles by how full their waves are (gemm/gemm_gelu.cu's DefaultPlan,
    gemm/cutlass_gemm_plain.cu's DefaultPlainRunner): at the chit-chat widths, 704, 1,216 and 2,048 tokens take the
    basic 64x80 attention output and the 256x80, 256x128 and 256x96 GEMM + GELU tiles (in layer 0; the last layer
    runs on first tokens)."""
    config = BertConfig(vocab_size=1000, hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
                                    intermediate_size=3072, max_position_embeddings=64)
    w = {k: torch.as_tensor(v).cuda() for k, v in BertWeights.random(config, seed=1).items()}
    rng = np.random.default_rng(1)
    for batch, length in ((32, 22), (38, 32), (64, 32)):
        lengths = np.full(batch, length, np.int32)
        ids = torch.as_tensor(rng.integers(0, 1000, (batch, 32)), dtype=torch.int32, device="cuda")
        ranker = core.CudaRanker(lib, config_dict(config), w, torch.float16, batch, 32, autotune=False)
        scores = ranker.forward(ids, torch.zeros_like(ids), lengths)
        torch.cuda.synchronize()
        assert torch.isfinite(scores).all(), (batch, length)
        print(f"{batch} x {length} tokens:", [p for p in ranker.gemm_plans() if "CUTLASS" in p and "x768" in p])
        ranker.close()


def main(argv: list[str]) -> int:
    lib = core.load_library(argv[0])
    config = BertConfig(vocab_size=1000, hidden_size=384, num_hidden_layers=2, num_attention_heads=6,
                                    intermediate_size=768, max_position_embeddings=256)
    for heads in (6, 12):  # head sizes 64 and 32
        cfg = config_dict(config) | {"num_attention_heads": heads}
        w = {k: torch.as_tensor(v).cuda() for k, v in BertWeights.random(config, seed=heads).items()}
        rng = np.random.default_rng(heads)
        # One row and two rows (8 rows come with the mixed batches): the first-token layer's fewest rows.
        for seq, lengths in ((32, np.array([13], np.int32)), (32, np.array([7, 20], np.int32)), (32, None), (64, None),
                             (128, None), (200, None)):
            if lengths is None:
                lengths = np.concatenate([[0, 1, seq], rng.integers(0, seq + 1, 5)]).astype(np.int32)
            ids = torch.as_tensor(rng.integers(0, 1000, (len(lengths), seq)), dtype=torch.int32, device="cuda")
            seg = torch.zeros_like(ids)
            variants = [(torch.float16, {}), (torch.float16, {"custom_gemms": False}),
                        (torch.float16, {"first_token_last_layer": False}), (torch.float32, {})]
            if seq == 32 and len(lengths) == 2:
                variants.append((torch.float16, {"autotune": True}))
            for dtype, options in variants:
                ranker = core.CudaRanker(lib, cfg, w, dtype, len(lengths), seq, **({"autotune": False} | options))
                scores = ranker.forward(ids, seg, lengths)
                graph_scores = ranker.forward_graph(ids, seg, lengths)
                # The encoder as the TF kernel runs it: eager, then a key's first graph call (captures), a replay.
                hidden = torch.randn(int(lengths.sum()), cfg["hidden_size"], device="cuda").to(dtype)
                first_token_only = options.get("first_token_last_layer", True)
                encoded = [ranker.encoder(hidden, lengths, first_token_only, graphs) for graphs in (False, True, True)]
                torch.cuda.synchronize()
                assert torch.isfinite(scores).all() and torch.isfinite(graph_scores).all(), (heads, seq, dtype)
                assert all(torch.isfinite(e).all() for e in encoded), (heads, seq, dtype)
                ranker.close()
    check_wave_fill_tiles(lib)
    print("padding ops:", check_padding_ops(lib))
    print("sanitize run finished")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
