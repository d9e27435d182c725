"""The CUDA core's correctness checks: its scores and hidden states against the float32 PyTorch reference (itself
checked against the project's float64 numpy reference and Hugging Face's BERT), for the chit-chat ranker on random
weights and the real MiniLM-L6-H384 carried as fp16, over every path the core has (eager and CUDA graph, first-token
and all-token last layer, the launch chain's GEMMs, cuBLASLt only, the TF op's untuned plans), and the padding ops.

One copy of each check: `run_checks` is both the harness's check stage (bench/gpu/run_bench.py writes its dict to
the result JSON) and what tests/gpu/test_cuda_core.py asserts on.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from bertserve.bench.gpu import core, torch_models
from bertserve.bench.gpu.harness import SEQ, compare, config_dict, to_torch
from bertserve.export import reference
from bertserve.export.weights import CHITCHAT_CONFIG, BertWeights

# The bar for fp16 scores against the float32 reference.
SCORE_TOLERANCE = 2e-3
# The float32 references against each other (float64 numpy, HF eager): they differ by float32 rounding alone.
REFERENCE_TOLERANCE = 1e-5
# The carried files (bench/gpu/prepare_carry.py) the MiniLM checks read.
MINILM_CARRY_FILES = ("minilm_l6_config.json", "minilm_l6_fp16.safetensors", "minilm_l6_reference.npz")
# What the summary's worst case ranges over: the fp16 scores as served (eager and graph).
SERVED = ("scores_vs_torch_fp32", "graph_scores_vs_torch_fp32")


def check_model(lib, config: dict, w32: dict[str, torch.Tensor], ids: np.ndarray, seg: np.ndarray,
                lengths: np.ndarray, float64_ref: dict | None = None) -> dict:
    """Core fp16 and fp32 vs the float32 torch reference (and float64 numpy reference when given)."""
    seq = ids.shape[1]
    out: dict = {"rows": int(len(lengths)), "seq": int(seq), "tokens": int(lengths.sum()),
                 "lengths": f"{lengths.min()}..{lengths.max()}"}
    ids_t = torch.as_tensor(ids, device="cuda")
    seg_t = torch.as_tensor(seg, device="cuda")
    w16 = {k: v.half() for k, v in w32.items()}
    w16_as32 = {k: v.float() for k, v in w16.items()}
    with torch.no_grad():
        ref_hidden, ref_scores = torch_models.reference_forward(w16_as32, config, ids_t.long(), seg_t.long(), lengths)
        _, ref_scores_fp32_weights = torch_models.reference_forward(w32, config, ids_t.long(), seg_t.long(), lengths)
    for dtype, label in ((torch.float16, "fp16"), (torch.float32, "fp32")):
        weights = w16_as32 if dtype == torch.float16 else w32
        # The ranker as served (last layer for first tokens only), then every token through every layer, which
        # also gives the encoder's whole output to compare.
        ranker = core.CudaRanker(lib, config, weights, dtype, len(lengths), seq)
        ranker.scores.fill_(float("nan"))
        scores = ranker.forward(ids_t, seg_t, lengths).clone()
        graph_scores = ranker.forward_graph(ids_t, seg_t, lengths).clone()
        ranker.close()
        all_tokens = core.CudaRanker(lib, config, weights, dtype, len(lengths), seq, first_token_last_layer=False)
        hidden = torch.full((int(lengths.sum()), config["hidden_size"]), float("nan"), dtype=dtype, device="cuda")
        all_token_scores = all_tokens.forward(ids_t, seg_t, lengths, hidden_out=hidden).clone()
        all_tokens.close()
        torch.cuda.synchronize()
        reference_scores = ref_scores if dtype == torch.float16 else ref_scores_fp32_weights
        reference_hidden = ref_hidden if dtype == torch.float16 else None
        entry = {"scores_vs_torch_fp32": compare(scores, reference_scores),
                 "graph_scores_vs_torch_fp32": compare(graph_scores, reference_scores),
                 "graph_bucket_vs_eager_scores": compare(graph_scores, scores),
                 "all_token_last_layer_scores_vs_torch_fp32": compare(all_token_scores, reference_scores),
                 "first_token_vs_all_token_last_layer_scores": compare(scores, all_token_scores)}
        if reference_hidden is not None:
            entry["hidden_vs_torch_fp32"] = compare(hidden, reference_hidden)
            entry["scores_vs_fp32_model_unrounded_weights"] = compare(scores, ref_scores_fp32_weights)
        if float64_ref is not None and dtype == torch.float16:
            entry["scores_vs_float64_reference"] = compare(scores, torch.as_tensor(float64_ref["scores"]))
            entry["hidden_vs_float64_reference"] = compare(hidden, torch.as_tensor(float64_ref["hidden"]))
        out[label] = entry
    ranker = core.CudaRanker(lib, config, w16_as32, torch.float16, len(lengths), seq, custom_gemms=False)
    out["fp16_cublaslt"] = {"scores_vs_torch_fp32": compare(ranker.forward(ids_t, seg_t, lengths), ref_scores),
                            "graph_scores_vs_torch_fp32": compare(ranker.forward_graph(ids_t, seg_t, lengths),
                                                                  ref_scores)}
    ranker.close()
    # The plans without timing: what the TF op runs (cuBLASLt's first guess and the fixed CUTLASS rules).
    ranker = core.CudaRanker(lib, config, w16_as32, torch.float16, len(lengths), seq, autotune=False)
    out["fp16_untuned"] = {"scores_vs_torch_fp32": compare(ranker.forward(ids_t, seg_t, lengths), ref_scores)}
    ranker.close()
    keep = lengths > 0
    mask = (torch.arange(seq, device="cuda")[None] < torch.as_tensor(lengths, device="cuda")[:, None]).long()
    hf16 = torch_models.hf_ranker(config, w16_as32, "sdpa").half()
    with torch.no_grad():
        logits = hf16(input_ids=ids_t.long()[keep], token_type_ids=seg_t.long()[keep], attention_mask=mask[keep]).logits
    out["pytorch_hf_fp16_sdpa_scores_vs_torch_fp32"] = compare(torch.sigmoid(logits[:, 0].float()), ref_scores[keep])
    del hf16
    out["torch_fp32_reference_vs_float64"] = (compare(ref_scores, torch.as_tensor(float64_ref["scores"]))
                                              if float64_ref is not None else None)
    return out


def check_hf_agrees(config: dict, w32: dict, ids: np.ndarray, seg: np.ndarray, lengths: np.ndarray) -> dict:
    """The float32 reference against HF BertForSequenceClassification (eager attention) on rows with tokens."""
    keep = lengths > 0
    ids_t = torch.as_tensor(ids[keep], device="cuda").long()
    seg_t = torch.as_tensor(seg[keep], device="cuda").long()
    mask = (torch.arange(SEQ, device="cuda")[None] < torch.as_tensor(lengths[keep], device="cuda")[:, None]).long()
    model = torch_models.hf_ranker(config, w32, "eager").float()
    with torch.no_grad():
        logits = model(input_ids=ids_t, token_type_ids=seg_t, attention_mask=mask).logits
        _, ours = torch_models.reference_forward(w32, config, ids_t, seg_t, lengths[keep])
    return compare(ours, torch.sigmoid(logits[:, 0]))


def check_padding_ops(lib) -> dict:
    """The padding ops on fp16 and float32, rows of 0..SEQ tokens: whether packing and unpacking are exact."""
    rng = np.random.default_rng(3)
    lengths = np.concatenate([[0], rng.integers(0, SEQ + 1, 40)]).astype(np.int32)
    b, h = len(lengths), 96
    cu = torch.as_tensor(core.cu_seqlens_of(lengths), device="cuda")
    real = torch.arange(SEQ, device="cuda")[None] < torch.as_tensor(lengths, device="cuda")[:, None]
    out = {}
    for half, dtype in ((1, torch.float16), (0, torch.float32)):
        padded = torch.randn(b, SEQ, h, device="cuda").to(dtype)
        n = int(lengths.sum())
        packed = torch.full((n, h), float("nan"), device="cuda", dtype=dtype)
        stream = torch.cuda.current_stream().cuda_stream
        core.check(lib, lib.bertserve_cuda_remove_padding(half, padded.data_ptr(), SEQ, h, b, cu.data_ptr(), n,
                                                          packed.data_ptr(), stream))
        rebuilt = torch.full_like(padded, float("nan"))
        core.check(lib, lib.bertserve_cuda_rebuild_padding(half, packed.data_ptr(), SEQ, h, b, cu.data_ptr(),
                                                           rebuilt.data_ptr(), stream))
        torch.cuda.synchronize()
        out[str(dtype)] = {"remove_exact": bool(torch.equal(packed, padded[real])),
                           "rebuild_exact": bool(torch.equal(rebuilt, padded * real[..., None]))}
    return out


def mixed_inputs(vocab: int, rows_random: int, seed: int, seq: int = SEQ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every length 0..seq once (up to 33 of them), then rows_random random lengths in 1..seq."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([np.linspace(0, seq, min(seq + 1, 33)).astype(int), rng.integers(1, seq + 1, rows_random)])
    lengths = lengths.astype(np.int32)
    ids = rng.integers(1000, vocab, (len(lengths), seq)).astype(np.int32)
    seg = (np.arange(seq)[None, :] >= (lengths[:, None] // 2)).astype(np.int32)
    return ids, seg, lengths


def model_checks(checks: dict) -> list[str]:
    """The names of the check_model entries in a run_checks result."""
    return [k for k in checks if isinstance(checks[k], dict) and "fp16" in checks[k]]


def summarize(checks: dict) -> dict:
    """The worst fp16 score error over eager and graph (the path served) and the TF op's untuned plans, and
    whether every served score, fp16 and fp32, is finite."""
    names = model_checks(checks)
    worst = max([checks[k]["fp16"][s]["max_abs"] for k in names for s in SERVED] +
                [checks[k]["fp16_untuned"]["scores_vs_torch_fp32"]["max_abs"] for k in names])
    finite = all(checks[k][p][s]["finite"] for k in names for p in ("fp16", "fp32") for s in SERVED)
    return {"fp16_worst_score_abs_error": worst, "target": SCORE_TOLERANCE,
            "met": bool(worst <= SCORE_TOLERANCE and finite), "all_finite": finite}


def run_checks(lib, carry_dir: str) -> dict:
    """Every check, by name, and their summary; carry_dir holds prepare_carry.py's MiniLM files."""
    checks: dict = {}
    cfg = config_dict(CHITCHAT_CONFIG)
    w32 = to_torch(BertWeights.random(CHITCHAT_CONFIG, seed=0).arrays)
    ids, seg, lengths = mixed_inputs(cfg["vocab_size"], 31, seed=1)
    # float64 numpy reference on a few rows validates the float32 torch reference itself.
    rounded = BertWeights(CHITCHAT_CONFIG, {k: v.half().float().cpu().numpy() for k, v in w32.items()})
    few = np.array([1, 7, 20, 32, 33, 40])
    mask = (np.arange(SEQ)[None] < lengths[few][:, None]).astype(np.int32)
    f64 = {"scores": reference.scores(rounded, ids[few], mask, seg[few])}
    w16_as32 = {k: v.half().float() for k, v in w32.items()}
    with torch.no_grad():
        _, t32 = torch_models.reference_forward(w16_as32, cfg, torch.as_tensor(ids[few], device="cuda").long(),
                                                torch.as_tensor(seg[few], device="cuda").long(), lengths[few])
    checks["torch_fp32_reference_vs_float64_chitchat"] = compare(t32, torch.as_tensor(f64["scores"]))
    checks["torch_fp32_reference_vs_hf_eager_chitchat"] = check_hf_agrees(cfg, w32, ids, seg, lengths)
    checks["chitchat_random_mixed"] = check_model(lib, cfg, w32, ids, seg, lengths)
    big = np.random.default_rng(5)
    ids_b, seg_b, lengths_b = (big.integers(1000, cfg["vocab_size"], (512, SEQ)).astype(np.int32),
                               np.zeros((512, SEQ), np.int32), big.integers(1, SEQ + 1, 512).astype(np.int32))
    checks["chitchat_random_batch512_U1_32"] = check_model(lib, cfg, w32, ids_b, seg_b, lengths_b)
    # A few rows (<= 64 tokens): the batch-of-one regime, where every GEMM is a stream of weights.
    for lengths_s in (np.array([1, 9, 15], np.int32), np.array([3, 17, 12], np.int32), np.array([20, 32, 9], np.int32)):
        n = int(lengths_s.sum())
        checks[f"chitchat_random_{n}_tokens"] = check_model(lib, cfg, w32, ids[: len(lengths_s)],
                                                            seg[: len(lengths_s)], lengths_s)
    # Batches of 1, 2, 5 and 8 rows (random lengths 1..32): the few-row paths of the first-token layer.
    first = SEQ + 1  # past mixed_inputs' rows of every length 0..32
    for rows in (1, 2, 5, 8):
        pick = slice(first, first + rows)
        checks[f"chitchat_random_{rows}_rows"] = check_model(lib, cfg, w32, ids[pick], seg[pick], lengths[pick])
    # The real MiniLM-L6-H384 (head size 32), carried as fp16, against the project's float64 reference.
    from safetensors.torch import load_file
    with open(os.path.join(carry_dir, "minilm_l6_config.json")) as f:
        mcfg = json.load(f)
    mcfg = {k: mcfg[k] for k in cfg}
    mw = {k: v.float().cuda() for k, v in load_file(os.path.join(carry_dir, "minilm_l6_fp16.safetensors")).items()}
    ref = np.load(os.path.join(carry_dir, "minilm_l6_reference.npz"))
    row = int(np.argmax(ref["lengths"]))
    longest = slice(row, row + 1)
    checks["minilm_real_1_row"] = check_model(lib, mcfg, mw, ref["input_ids"][longest], ref["segment_ids"][longest],
                                              ref["lengths"][longest])
    checks["minilm_real_32_tokens"] = check_model(lib, mcfg, mw, ref["input_ids"][:3], ref["segment_ids"][:3],
                                                  np.array([3, 17, 12], np.int32))
    checks["minilm_real_mixed"] = check_model(lib, mcfg, mw, ref["input_ids"], ref["segment_ids"],
                                              ref["lengths"], float64_ref={"scores": ref["scores"],
                                                                           "hidden": ref["hidden"]})
    # Longer rows: the fused kernel's 64- and 128-key variants, and the streaming kernel past 128 tokens.
    for seq in (64, 128, 256):
        ids_l, seg_l, lengths_l = mixed_inputs(mcfg["vocab_size"], 15, seed=seq, seq=seq)
        checks[f"minilm_real_seq{seq}"] = check_model(lib, mcfg, mw, ids_l, seg_l, lengths_l)
    # A few rows of up to 64 tokens, one of them empty: the fused attention's 64-key variant at a few rows.
    ids_l, seg_l, _ = mixed_inputs(mcfg["vocab_size"], 0, seed=7, seq=64)
    checks["minilm_real_seq64_few_rows"] = check_model(lib, mcfg, mw, ids_l[:3], seg_l[:3],
                                                       np.array([41, 0, 64], np.int32))
    ids_l, seg_l, lengths_l = mixed_inputs(cfg["vocab_size"], 15, seed=11, seq=128)
    checks["chitchat_random_seq128"] = check_model(lib, cfg, w32, ids_l, seg_l, lengths_l)
    checks["padding_ops"] = check_padding_ops(lib)
    checks["summary"] = summarize(checks)
    return checks
