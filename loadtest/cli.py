"""`bertserve loadtest` and `bertserve tune-batching`: argv in, exit code out."""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Sequence

from bertserve.client.cli import (add_server_args, add_tokenizer_args, guarded, model_spec_from_args,
                                  tokenizer_from_args)
from bertserve.loadtest import clients, loadgen, report, sweep, tuner
from bertserve.model_dir import DEFAULT_MAX_LEN, SIGNATURE_NAME
from bertserve.train.pairs import LENGTHS, read_lengths


def parse_length_range(text: str) -> tuple[int, ...]:
    lo, sep, hi = text.partition(":")
    if not sep or not lo.isdigit() or not hi.isdigit() or int(lo) > int(hi):
        raise ValueError(f"--length_range must be LO:HI with LO <= HI, got {text!r}")
    return tuple(range(int(lo), int(hi) + 1))


def _request_shape(args: argparse.Namespace) -> loadgen.RequestShape:
    tokenizer = tokenizer_from_args(args)
    max_len = tokenizer.max_len if tokenizer else (args.max_len or DEFAULT_MAX_LEN)
    if args.length_range:
        lengths = parse_length_range(args.length_range)
    else:
        lengths = tuple(int(n) for n in read_lengths(args.lengths))
    ids = dict(vocab_size=tokenizer.vocab_size, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id) if tokenizer else {}
    return loadgen.RequestShape(replies_per_query=args.replies, max_len=max_len, lengths=lengths, **ids)


def _add_load_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replies", type=int, default=20, help="K: replies per query = rows per request")
    parser.add_argument("--lengths", default=LENGTHS, help="file of pair token lengths, one a line, sampled per pair "
                                                         "(default: the shipped pair set)")
    parser.add_argument("--length_range", help="LO:HI: uniform pair lengths instead of --lengths")
    parser.add_argument("--slo_ms", type=float, default=100.0, help="P99 latency budget in ms")
    parser.add_argument("--sweep_start", type=float, default=1.0, help="first QPS of a sweep")
    parser.add_argument("--sweep_factor", type=float, default=1.5, help="QPS multiplier between sweep steps")
    parser.add_argument("--sweep_steps", type=int, default=12, help="most sweep steps")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run (per sweep step)")
    parser.add_argument("--clients", type=int, default=1,
                        help="client processes sharing the load (1: this process); more when one process cannot "
                             "offer the rate: the report shows each one's CPU use")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _sweep_config(args: argparse.Namespace) -> sweep.SweepConfig:
    return sweep.SweepConfig(slo_p99_ms=args.slo_ms, start_qps=args.sweep_start, factor=args.sweep_factor,
                       max_steps=args.sweep_steps, step_duration_s=args.duration)


def _loadtest(args: argparse.Namespace, spec: clients.LoadSpec) -> tuple[list[loadgen.RunStats], str]:
    progress = not args.quiet
    with clients.load_runner(spec, args.clients, progress) as load:
        if args.sweep:
            return sweep.sweep(load, _sweep_config(args), progress)
        if args.mode == "open":
            return [load.open([loadgen.Phase(args.qps, args.duration)], args.seed)], ""
        return [load.closed(args.concurrency, args.duration)], ""


def _run_loadtest(args: argparse.Namespace) -> int:
    model, shape = model_spec_from_args(args), _request_shape(args)
    spec = clients.LoadSpec(tuple(t.strip() for t in args.target.split(",")), (model,), shape, args.timeout,
                            "rest" if args.rest else "grpc", args.seed)
    runs, stop = _loadtest(args, spec)
    kind = "QPS sweep" if args.sweep else f"{args.mode} loop"
    title = (f"{kind}: model {model.name} over {spec.api}, {shape.replies_per_query} replies/query, seq "
             f"{shape.max_len}, {args.duration:g} s per run, {args.clients} client process(es); "
             f"{report.machine_label()}")
    table = report.markdown_table(runs, title)
    print(table + (f"sweep ended: {stop}\n" if stop else ""))
    if args.sweep:
        best = sweep.best_within_slo(runs, _sweep_config(args))
        print(f"highest QPS within P99 {args.slo_ms:g} ms: " +
              (f"{best.achieved_qps:.1f} QPS ({best.pairs_per_s:.0f} pairs/s)" if best else "none"))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "loadtest.md"), "w", encoding="utf-8") as f:
            f.write(table)
        report.write_json(runs, os.path.join(args.out, "loadtest.json"),
                          {"title": title, "machine": report.machine_label(), "slo_p99_ms": args.slo_ms,
                           "stop_reason": stop})
        if args.sweep:
            report.plot_latency_vs_qps(runs, os.path.join(args.out, "latency_vs_qps.png"), title, args.slo_ms)
        print(f"wrote {args.out}/loadtest.md, loadtest.json" + (", latency_vs_qps.png" if args.sweep else ""))
    return 0


def loadtest_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="bertserve loadtest",
                                     description="Open- or closed-loop load test; --sweep finds the QPS at the "
                                                 "P99 SLO.")
    add_server_args(parser)
    add_tokenizer_args(parser, required=False)
    _add_load_args(parser)
    parser.add_argument("--mode", choices=("open", "closed"), default="open",
                        help="open: Poisson arrivals at --qps; closed: --concurrency callers back to back")
    parser.add_argument("--qps", type=float, default=5.0, help="open loop target QPS (queries/s)")
    parser.add_argument("--concurrency", type=int, default=4, help="closed loop callers")
    parser.add_argument("--sweep", action="store_true", help="raise QPS until the P99 SLO breaks")
    parser.add_argument("--rest", action="store_true", help="load the REST API (--target is then the REST port)")
    parser.add_argument("--out", help="folder for loadtest.md, loadtest.json and (sweep) latency_vs_qps.png")
    parser.add_argument("--seed", type=int, default=0)
    return guarded(_run_loadtest, parser.parse_args(list(argv)), parser.prog)


# ------------------------------------------------------------------------------------------- tune-batching

def _run_tune(args: argparse.Namespace) -> int:
    spec, shape, config = model_spec_from_args(args), _request_shape(args), _sweep_config(args)
    candidates = (tuner.read_candidates(args.candidates) if args.candidates
                  else tuner.default_candidates(shape.replies_per_query))
    workdir = args.workdir or tempfile.mkdtemp(prefix="bertserve-tune-")
    os.makedirs(workdir, exist_ok=True)
    trials = []
    for i, candidate in enumerate(candidates):
        print(f"[{i + 1}/{len(candidates)}] {candidate.describe()}", flush=True)
        trial = tuner.run_trial(candidate, args.model_config_file, spec, shape, config, args.timeout, workdir, i,
                                args.serve_flag, progress=not args.quiet, clients=args.clients)
        trials.append(trial)
        best = trial.best
        print(f"    best within SLO: {f'{best.achieved_qps:.1f} QPS' if best else 'none'} ({trial.stop_reason})")
    table = tuner.trials_table(trials, config, shape)
    print("\n" + table)
    table_path = args.table or os.path.splitext(args.output)[0] + "_table.md"
    with open(table_path, "w", encoding="utf-8") as f:
        f.write(table)
    winner = tuner.pick_best(trials)
    if winner is None:
        print(f"no candidate met P99 <= {args.slo_ms:g} ms; nothing written to {args.output} (table: {table_path})")
        return 1
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(f"# bertserve tune-batching: {winner.best.achieved_qps:.1f} QPS within P99 {args.slo_ms:g} ms; "
                f"see {os.path.basename(table_path)}\n" + winner.candidate.to_text())
    print(f"wrote {args.output} ({winner.candidate.describe()}) and {table_path}")
    return 0


def tune_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="bertserve tune-batching",
                                     description="Restart `bertserve serve` with each batching parameter set and "
                                                 "keep the one with the highest QPS within the P99 SLO.")
    parser.add_argument("--model_config_file", required=True, help="the ModelServerConfig the server is started with")
    parser.add_argument("--model", required=True)
    parser.add_argument("--signature", default=SIGNATURE_NAME)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.set_defaults(version=None, label=None)
    add_tokenizer_args(parser, required=False)
    _add_load_args(parser)
    parser.add_argument("--candidates", help="JSON list of batching parameter sets (default: a CPU-sized grid)")
    parser.add_argument("--output", default="batching_parameters.txt", help="where the winning file goes")
    parser.add_argument("--table", help="where the table goes (default: next to --output)")
    parser.add_argument("--workdir", help="folder for per-candidate files and server logs (default: a temp dir)")
    parser.add_argument("--serve_flag", action="append", default=[],
                        help="extra flag for `bertserve serve`, repeatable (e.g. --serve_flag=--enable_model_warmup)")
    return guarded(_run_tune, parser.parse_args(list(argv)), parser.prog)
