"""Small forwards of every kernel variant, for compute-sanitizer (memcheck / racecheck) on the GPU machine:
fp16 (with the CUTLASS GEMMs of the launch chain, untuned and, once per head size, autotuned: every candidate
launched with the kernel that reads its output, on scratch; cuBLASLt only) and fp32, rows of length 0..seq, seq
32 / 64 / 128 (the fused attention's three sizes) and 200 (the streaming attention), batches of 1, 2 and 8 rows
(the first-token layer's few-row GEMMs; 27 tokens at 2 rows: small-m GEMMs), a graph bucket with scratch rows, the
encoder as the TF kernel runs it (eager, and captured then replayed from the core's graph cache), and the padding
ops.

Usage: compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/gpu/sanitize_core.py LIB.so
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import core
from run_bench import config_dict, weights_mod, check_padding_ops


def main(argv: list[str]) -> int:
    lib = core.load_library(argv[0])
    config = weights_mod.BertConfig(vocab_size=1000, hidden_size=384, num_hidden_layers=2, num_attention_heads=6,
                                    intermediate_size=768, max_position_embeddings=256)
    for heads in (6, 12):  # head sizes 64 and 32
        cfg = config_dict(config) | {"num_attention_heads": heads}
        w = {k: torch.as_tensor(v).cuda() for k, v in weights_mod.BertWeights.random(config, seed=heads).items()}
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
    print("padding ops:", check_padding_ops(lib))
    print("sanitize run finished")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
