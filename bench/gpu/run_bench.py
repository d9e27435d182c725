"""One device call of the GPU harness: build the CUDA core, check it against float32/float64 references, time
it against PyTorch fp16 in the same process, replay serving traffic, and write gpu_bench.json + a README table.

Usage (on the GPU machine, from the repository root):
  python3 bench/gpu/run_bench.py [--stages build,check,time,profile,replay,compile,sustain] [--out DIR] [--quick]
Stages run in order; the JSON is rewritten after each, so a cut-off run still returns what it measured.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import time
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
# The project's numpy-only modules (BertWeights, the float64 reference) without installing the package.
_pkg = types.ModuleType("bertserve")
_pkg.__path__ = [ROOT]
sys.modules.setdefault("bertserve", _pkg)
weights_mod = importlib.import_module("bertserve.export.weights")
reference_mod = importlib.import_module("bertserve.export.reference")
machine_mod = importlib.import_module("bertserve.bench.machine")

import core  # noqa: E402
import serving_replay  # noqa: E402
import torch_models  # noqa: E402

SEQ = 32
BATCHES = (1, 8, 32, 128, 512, 2048, 8192)
WARMUP_S = 0.2  # work before timing: the SM clock ramps up from idle (345 MHz) and back from the power cap
CARRY = os.path.join(ROOT, ".device_carry")
SCORE_TOLERANCE = 2e-3


def config_dict(c) -> dict:
    return {f: getattr(c, f) for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "intermediate_size", "max_position_embeddings", "type_vocab_size",
                                       "layer_norm_eps", "num_labels")}


def to_torch(arrays, dtype=torch.float32) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.asarray(v, dtype=np.float32)).to("cuda", dtype) for k, v in arrays.items()}


def chitchat_random() -> tuple[dict, dict[str, torch.Tensor]]:
    """The chit-chat ranker's config and its seeded random float32 weights on the GPU: what every timing runs."""
    chitchat = weights_mod.CHITCHAT_CONFIG
    return config_dict(chitchat), to_torch(weights_mod.BertWeights.random(chitchat, seed=0).arrays)


def lengths_for(dist: str, batch: int, rng: np.random.Generator) -> np.ndarray:
    if dist == "all32":
        return np.full(batch, SEQ, dtype=np.int32)
    return rng.integers(8, SEQ + 1, batch).astype(np.int32)


def event_ms(fn) -> float:
    """One call of fn, timed with CUDA events on the current stream (waits for it)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); fn(); b.record(); b.synchronize()
    return a.elapsed_time(b)


def median_ms(fn, min_iters: int = 10, budget_ms: float = 300.0) -> float:
    """Median of CUDA-event timings after WARMUP_S of calls (at least 3), so that the clock has ramped up from
    idle or recovered from the power cap; the count adapts to ~budget_ms of work."""
    start, calls = time.monotonic(), 0
    while calls < 3 or time.monotonic() - start < WARMUP_S:
        fn()
        calls += 1
        if calls % 16 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    iters = int(max(min_iters, min(200, budget_ms / max(event_ms(fn), 1e-3))))
    return float(np.median([event_ms(fn) for _ in range(iters)]))


class Results:
    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, "gpu_bench.json")
        self.data: dict = {}

    def save(self) -> None:
        with open(self.path, "w") as f:
            json.dump(self.data, f, indent=1, default=str)


# ------------------------------------------------------------------------------------------------ stages

def stage_build(res: Results, build_dir: str) -> str:
    t0 = time.time()
    log = subprocess.run(["bash", os.path.join(ROOT, "custom_ops/kernels/cuda/build.sh"), build_dir],
                         capture_output=True, text=True)
    print(log.stdout[-2000:], log.stderr[-4000:], flush=True)
    if log.returncode != 0:
        raise SystemExit("build failed")
    res.data["build"] = {"seconds": round(time.time() - t0, 1), "ptxas_warnings": log.stderr.count("warning")}
    return os.path.join(build_dir, "libbertserve_cuda.so")


def environment() -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    nvcc = subprocess.run("nvcc --version | tail -2", shell=True, capture_output=True, text=True).stdout.strip()
    return {"gpu": torch.cuda.get_device_name(0), "nvidia_smi": smi, "nvcc": nvcc, "torch": torch.__version__,
            "host": machine_mod.machine(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def parse_rows(text: str) -> list[tuple[str, int]]:
    """"U8_32:1,all32:8" -> [("U8_32", 1), ("all32", 8)]: the (lengths, batch) rows of the comparison scripts."""
    return [(dist, int(batch)) for dist, batch in (item.split(":") for item in text.split(","))]


def write_jsonl(path: str, rounds_per_row: int, lines: list[dict]) -> None:
    """A comparison script's result: the machine and rounds on the first line, then one JSON line per result."""
    with open(path, "w") as f:
        f.write(json.dumps({"environment": environment(), "rounds_per_row": rounds_per_row}) + "\n")
        for line in lines:
            f.write(json.dumps(line) + "\n")


def compare(ours: torch.Tensor, ref: torch.Tensor) -> dict:
    ours, ref = ours.double().cpu(), ref.double().cpu()
    diff = (ours - ref).abs()
    return {"max_abs": float(diff.max()) if diff.numel() else 0.0,
            "rms": float(diff.pow(2).mean().sqrt()) if diff.numel() else 0.0,
            "rel_l2": float(diff.norm() / max(ref.norm(), 1e-30)), "finite": bool(torch.isfinite(ours).all())}


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


def stage_check(res: Results, lib) -> None:
    checks: dict = {}
    chitchat = weights_mod.CHITCHAT_CONFIG
    cfg = config_dict(chitchat)
    w32 = to_torch(weights_mod.BertWeights.random(chitchat, seed=0).arrays)
    ids, seg, lengths = mixed_inputs(cfg["vocab_size"], 31, seed=1)
    # float64 numpy reference on a few rows validates the float32 torch reference itself.
    rounded = weights_mod.BertWeights(chitchat, {k: v.half().float().cpu().numpy() for k, v in w32.items()})
    few = np.array([1, 7, 20, 32, 33, 40])
    mask = (np.arange(SEQ)[None] < lengths[few][:, None]).astype(np.int32)
    f64 = {"scores": reference_mod.scores(rounded, ids[few], mask, seg[few])}
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
    with open(os.path.join(CARRY, "minilm_l6_config.json")) as f:
        mcfg = json.load(f)
    mcfg = {k: mcfg[k] for k in cfg}
    mw = {k: v.float().cuda() for k, v in load_file(os.path.join(CARRY, "minilm_l6_fp16.safetensors")).items()}
    ref = np.load(os.path.join(CARRY, "minilm_l6_reference.npz"))
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
    model_checks = [k for k in checks if isinstance(checks[k], dict) and "fp16" in checks[k]]
    # Eager and graph (the path served), each against the reference, and the TF op's untuned plans.
    served = ("scores_vs_torch_fp32", "graph_scores_vs_torch_fp32")
    worst = max([checks[k]["fp16"][s]["max_abs"] for k in model_checks for s in served] +
                [checks[k]["fp16_untuned"]["scores_vs_torch_fp32"]["max_abs"] for k in model_checks])
    finite = all(checks[k][p][s]["finite"] for k in model_checks for p in ("fp16", "fp32") for s in served)
    checks["summary"] = {"fp16_worst_score_abs_error": worst, "target": SCORE_TOLERANCE,
                         "met": bool(worst <= SCORE_TOLERANCE and finite), "all_finite": finite}
    res.data["correctness"] = checks
    print(json.dumps(checks["summary"]), flush=True)


def graph_replay_ms(ranker: core.CudaRanker, ids: torch.Tensor, seg: torch.Tensor, lengths: np.ndarray) -> float:
    """Median replay time of a graph captured for this batch, then dropped: a graph captured for an earlier row
    and replayed for this one measured up to 15 % slower (U[8,32] batch 1 after all-32 batch 1)."""
    n = ranker.stage(ids, seg, lengths)
    ms = median_ms(ranker.graph_for(ids.shape[0], ranker.token_bucket(n)).replay)
    ranker.graphs.clear()
    return ms


def stage_time(res: Results, quick: bool) -> None:
    cfg, w32 = chitchat_random()
    batches = (1, 32, 2048) if quick else BATCHES
    ranker = core.CudaRanker(res.lib, cfg, w32, torch.float16, max(batches), SEQ)
    cublaslt = core.CudaRanker(res.lib, cfg, w32, torch.float16, max(batches), SEQ, custom_gemms=False)
    all_tokens = core.CudaRanker(res.lib, cfg, w32, torch.float16, max(batches), SEQ, first_token_last_layer=False)
    del w32
    torch.manual_seed(0)
    hand = torch_models.HandRanker(cfg).cuda().half().eval()
    hf = torch_models.hf_ranker(cfg, None, "sdpa").half()
    rng = np.random.default_rng(7)
    rows = []
    for dist in ("all32", "U8_32"):
        for bs in batches:
            lengths = lengths_for(dist, bs, rng)
            ids = torch.randint(1000, cfg["vocab_size"], (bs, SEQ), dtype=torch.int32, device="cuda")
            seg = torch.zeros_like(ids)
            mask = (torch.arange(SEQ, device="cuda")[None] < torch.as_tensor(lengths, device="cuda")[:, None]).long()
            row = {"dist": dist, "batch": bs, "tokens": int(lengths.sum()),
                   "bucket": ranker.token_bucket(int(lengths.sum()))}
            row["core_graph_ms"] = graph_replay_ms(ranker, ids, seg, lengths)
            row["core_eager_ms"] = median_ms(lambda: ranker.launch(bs, row["tokens"]))  # inputs still staged
            row["core_cublaslt_graph_ms"] = graph_replay_ms(cublaslt, ids, seg, lengths)  # side by side
            row["core_all_tokens_graph_ms"] = graph_replay_ms(all_tokens, ids, seg, lengths)
            with torch.inference_mode():
                ids64, seg64 = ids.long(), seg.long()
                row["hf_sdpa_ms"] = median_ms(lambda: hf(input_ids=ids64, token_type_ids=seg64, attention_mask=mask))
                row["hand_sdpa_ms"] = median_ms(lambda: hand(ids64, seg64, mask))
                static = (ids64.clone(), seg64.clone(), mask.clone())
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        hand(*static)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    hand(*static)
                row["hand_sdpa_graph_ms"] = median_ms(g.replay)
                del g
            for key in [k for k in row if k.endswith("_ms")]:
                row[key.replace("_ms", "_seq_s")] = round(bs / row[key] * 1e3)
                row[key] = round(row[key], 4)
            rows.append(row)
            print(json.dumps(row), flush=True)
            res.data["timing"] = {"shape": "6 layers, hidden 768, 12 heads, FFN 3072, seq 32, fp16", "rows": rows}
            res.save()
    res.data["timing"]["gemm_plans"] = ranker.gemm_plans()
    res.save()
    for r in (ranker, cublaslt, all_tokens):
        r.close()


def stage_sustain(res: Results) -> None:
    """Clocks and power while one large batch runs back to back for a few seconds, beside the same forward timed
    in short bursts: whether sustained throughput is limited by the GPU's power budget."""
    cfg, w32 = chitchat_random()
    bs = 8192
    ranker = core.CudaRanker(res.lib, cfg, w32, torch.float16, bs, SEQ)
    lengths = lengths_for("U8_32", bs, np.random.default_rng(10))
    ids = torch.randint(1000, cfg["vocab_size"], (bs, SEQ), dtype=torch.int32, device="cuda")
    graph = ranker.graph_for(bs, ranker.token_bucket(ranker.stage(ids, torch.zeros_like(ids), lengths)))
    query = "--query-gpu=clocks.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active"
    smi = subprocess.Popen(["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    times = []
    t_end = time.time() + 6.0
    while time.time() < t_end:
        times.append(event_ms(graph.replay))
    time.sleep(0.3)
    smi.terminate()
    samples = [line.split(", ") for line in smi.communicate()[0].strip().splitlines()]
    torch.cuda.synchronize()
    time.sleep(3.0)  # idle, then one short burst
    burst = [event_ms(graph.replay) for _ in range(3)]
    out = {"batch": bs, "lengths": "U8_32", "replays": len(times), "first_3_ms": [round(t, 3) for t in times[:3]],
           "last_3_ms": [round(t, 3) for t in times[-3:]], "median_ms": round(float(np.median(times)), 3),
           "burst_after_3s_idle_ms": [round(t, 3) for t in burst],
           "nvidia_smi_samples": {"fields": query.split("=")[1].split(","), "rows": samples}}
    print(json.dumps({k: v for k, v in out.items() if k != "nvidia_smi_samples"}), flush=True)
    print(samples[:3], samples[-3:], flush=True)
    res.data["sustained"] = out
    ranker.graphs.clear()
    ranker.close()


def stage_compile(res: Results) -> None:
    cfg = config_dict(weights_mod.CHITCHAT_CONFIG)
    torch.manual_seed(0)
    hand = torch_models.HandRanker(cfg).cuda().half().eval()
    compiled = torch.compile(hand)
    rng = np.random.default_rng(8)
    out = []
    for bs in (32, 2048):
        lengths = lengths_for("U8_32", bs, rng)
        ids = torch.randint(1000, cfg["vocab_size"], (bs, SEQ), device="cuda")
        seg = torch.zeros_like(ids)
        mask = (torch.arange(SEQ, device="cuda")[None] < torch.as_tensor(lengths, device="cuda")[:, None]).long()
        with torch.inference_mode():
            t0 = time.time()
            compiled(ids, seg, mask)
            torch.cuda.synchronize()
            compile_s = time.time() - t0
            ms = median_ms(lambda: compiled(ids, seg, mask))
        out.append({"batch": bs, "dist": "U8_32 (computed padded)", "ms": round(ms, 4), "seq_s": round(bs / ms * 1e3),
                    "compile_s": round(compile_s, 1)})
        print(json.dumps(out[-1]), flush=True)
        res.data["torch_compile"] = out
        res.save()


def kernel_label(name: str) -> str:
    """A readable key for a kernel: CUTLASS's mangled names differ only deep inside (schedule, wgmma shape)."""
    if "cutlass" not in name:
        return name[:90]
    mma = re.search(r"MMA_(\d+x\d+x\d+)", name)
    schedule = "ping-pong" if "Pingpong" in name else "cooperative"
    epilogue = "+bias+GELU" if "EltAct" in name else "+bias" if "PerRowBias" in name else ""
    return f"CUTLASS GEMM{epilogue} {schedule} wgmma {mma.group(1) if mma else '?'}"


def stage_profile(res: Results) -> None:
    """Per-kernel GPU time of one forward (torch profiler over CUPTI): where the time goes."""
    cfg, w32 = chitchat_random()
    ranker = core.CudaRanker(res.lib, cfg, w32, torch.float16, 2048, SEQ)
    rng = np.random.default_rng(9)
    prof_out = {}
    for bs in (1, 32, 2048):
        lengths = lengths_for("U8_32", bs, rng)
        ids = torch.randint(1000, cfg["vocab_size"], (bs, SEQ), dtype=torch.int32, device="cuda")
        n = ranker.token_bucket(ranker.stage(ids, torch.zeros_like(ids), lengths))
        graph = ranker.graph_for(bs, n)  # plans (and autotunes) every GEMM of this bucket before profiling
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                ranker.launch(bs, n)
            torch.cuda.synchronize()
        table: dict[str, dict] = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t > 0:
                entry = table.setdefault(kernel_label(e.key), {"us_per_forward": 0.0, "calls_per_forward": 0})
                entry["us_per_forward"] = round(entry["us_per_forward"] + t / 5, 1)
                entry["calls_per_forward"] += e.count // 5
        prof_out[f"U8_32_batch{bs}_tokens{n}"] = dict(sorted(table.items(), key=lambda kv: -kv[1]["us_per_forward"]))
        print(f"batch {bs}:", json.dumps(prof_out[f"U8_32_batch{bs}_tokens{n}"])[:1500], flush=True)
    res.data["profile_eager_launches"] = prof_out
    res.data["profile_gemm_plans"] = ranker.gemm_plans()
    ranker.close()


def stage_replay(res: Results, quick: bool) -> None:
    cfg, w32 = chitchat_random()
    wide = serving_replay.BatchingParameters(1024, 2000, (128, 256, 512, 1024))
    # (batching, offered QPS levels, graphs). Without graphs, as the TF GPU kernel runs: eager launches over the
    # token bucket, GEMMs planned without autotuning the first time a bucket is seen (no warmup: the first level
    # pays for planning the buckets it meets).
    policies = [
        (serving_replay.BatchingParameters(256, 1000, (32, 64, 128, 256)), (1000, 2000, 4000, 6000, 7000, 8000), True),
        (wide, (6000, 8000, 9000, 10000), True),
        (wide, (6000, 8000, 9000), False),
    ]
    out = []
    for params, levels, graphs in policies:
        ranker = core.CudaRanker(res.lib, cfg, w32, torch.float16, params.max_batch_size, SEQ, autotune=graphs)
        t0 = time.time()
        if graphs:  # every (size, bucket) graph before traffic starts
            for size in params.allowed_batch_sizes:
                for bucket in sorted({ranker.token_bucket(t) for t in range(1, size * SEQ + 1, 8)}):
                    ranker.graph_for(size, bucket)
        capture_s = round(time.time() - t0, 1)
        for qps in (levels[:2] if quick else levels):
            r = serving_replay.replay(ranker, params, serving_replay.Traffic(qps=qps, seconds=2.0), seed=int(qps),
                                      graphs=graphs)
            r.update({"max_batch_size": params.max_batch_size, "batch_timeout_micros": params.batch_timeout_micros,
                      "allowed_batch_sizes": list(params.allowed_batch_sizes), "graphs": len(ranker.graphs),
                      "graph_capture_s": capture_s})
            out.append(r)
            print(json.dumps(r), flush=True)
            res.data["serving_replay"] = {"replies_per_query": 32, "lengths": "U[8,32]", "rows": out}
            res.save()
        ranker.close()
        ranker.graphs.clear()
        del ranker
        torch.cuda.empty_cache()


def readme_table(data: dict) -> str:
    lines = ["| batch | lengths | core + graph ms (seq/s) | core eager ms | core, cuBLASLt + graph ms (seq/s) | "
             "core, last layer on all tokens + graph ms (seq/s) | "
             "PyTorch SDPA + graph ms (seq/s) | hand SDPA ms | HF sdpa ms | core vs best PyTorch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data.get("timing", {}).get("rows", []):
        best = min(r["hand_sdpa_graph_ms"], r["hand_sdpa_ms"], r["hf_sdpa_ms"])
        lines.append(f"| {r['batch']} | {r['dist']} | {r['core_graph_ms']:.3f} ({r['core_graph_seq_s']:,}) | "
                     f"{r['core_eager_ms']:.3f} | "
                     f"{r['core_cublaslt_graph_ms']:.3f} ({r['core_cublaslt_graph_seq_s']:,}) | "
                     f"{r['core_all_tokens_graph_ms']:.3f} ({r['core_all_tokens_graph_seq_s']:,}) | "
                     f"{r['hand_sdpa_graph_ms']:.3f} ({r['hand_sdpa_graph_seq_s']:,}) | "
                     f"{r['hand_sdpa_ms']:.3f} | {r['hf_sdpa_ms']:.3f} | {best / r['core_graph_ms']:.2f}x |")
    rows = data.get("serving_replay", {}).get("rows", [])
    if rows:
        lines += ["", "| max batch / timeout | launch | offered QPS | achieved QPS | seq/s | rows/batch | P50 ms | "
                      "P99 ms |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['max_batch_size']} / {r['batch_timeout_micros']} us | {r['launch']} | "
                         f"{r['offered_qps']:,} | "
                         f"{r['achieved_qps']:,} | {r['sequences_per_s']:,} | {r['mean_rows_per_batch']} | "
                         f"{r['p50_ms']} | {r['p99_ms']} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stages", default="build,check,time,profile,replay,compile,sustain")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--build-dir", default="/tmp/bertserve_cuda_build",
                   help="where the build stage writes libbertserve_cuda.so, or where a prebuilt one is read")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    stages = args.stages.split(",")
    res = Results(args.out)
    res.data["environment"] = environment()
    print(json.dumps(res.data["environment"]), flush=True)
    lib_path = stage_build(res, args.build_dir) if "build" in stages else os.path.join(args.build_dir,
                                                                                       "libbertserve_cuda.so")
    res.lib = core.load_library(lib_path)
    res.save()
    for name, fn in (("check", lambda: stage_check(res, res.lib)), ("time", lambda: stage_time(res, args.quick)),
                     ("profile", lambda: stage_profile(res)), ("replay", lambda: stage_replay(res, args.quick)),
                     ("compile", lambda: stage_compile(res)), ("sustain", lambda: stage_sustain(res))):
        if name not in stages:
            continue
        t0 = time.time()
        try:
            fn()
        except Exception as e:  # one failing stage must not lose the others' numbers
            res.data.setdefault("errors", {})[name] = repr(e)[:2000]
            print(f"stage {name} failed: {e!r}", flush=True)
        res.data.setdefault("stage_seconds", {})[name] = round(time.time() - t0, 1)
        res.save()
    table = readme_table(res.data)
    with open(os.path.join(args.out, "gpu_bench_table.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
