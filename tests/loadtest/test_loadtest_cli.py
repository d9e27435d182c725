"""`bertserve loadtest` and `bertserve tune-batching`, run against the session's real server."""

from __future__ import annotations

import json

import numpy as np
from google.protobuf import text_format

from bertserve.loadtest.cli import loadtest_main, tune_main
from bertserve.loadtest.tuner import BatchingCandidate
from bertserve.server.batching_parameters_pb2 import BatchingParameters
from bertserve.train import pairs
from bertserve.train.recipe import MODEL_NAME as MODEL


def _runs(out_dir) -> dict:
    with open(out_dir / "loadtest.json", encoding="utf-8") as f:
        return json.load(f)


def test_open_loop_loadtest_reports_sane_stats(served_ranker, tmp_path):
    rc = loadtest_main(["--target", served_ranker.server.target, "--model", MODEL, "--model_dir",
                        served_ranker.version_dir, "--qps", "4", "--duration", "4", "--replies", "4",
                        "--quiet", "--out", str(tmp_path)])
    assert rc == 0
    report = _runs(tmp_path)
    (run,) = report["runs"]
    assert report["machine"].endswith("cores")
    assert run["errors"] == 0 and run["ok"] >= 5
    assert 0.3 * 4 <= run["achieved_qps"] <= 3 * 4
    assert abs(run["pairs_per_s"] - 4 * run["achieved_qps"]) < 0.1
    assert 0 < run["p50_ms"] <= run["p90_ms"] <= run["p99_ms"] <= run["p99.9_ms"] < 5000


def test_closed_loop_and_sweep(served_ranker, tmp_path):
    closed = tmp_path / "closed"
    assert loadtest_main(["--target", served_ranker.server.target, "--model", MODEL, "--mode", "closed",
                          "--concurrency", "2", "--duration", "3", "--replies", "4", "--length_range", "8:16",
                          "--quiet", "--out", str(closed)]) == 0
    (run,) = _runs(closed)["runs"]
    assert run["mode"] == "closed" and run["load"] == 2 and run["ok"] > 0 and run["errors"] == 0

    swept = tmp_path / "sweep"
    assert loadtest_main(["--target", served_ranker.server.target, "--model", MODEL, "--sweep", "--sweep_start", "2",
                          "--sweep_factor", "2", "--sweep_steps", "2", "--duration", "2", "--replies", "4",
                          "--slo_ms", "5000", "--quiet", "--out", str(swept)]) == 0
    runs = _runs(swept)["runs"]
    assert [r["load"] for r in runs] == [2, 4]
    png = (swept / "latency_vs_qps.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "| offered QPS |" in (swept / "loadtest.md").read_text()


def test_tune_batching_restarts_the_server_and_writes_the_best_file(served_ranker, tmp_path, capsys):
    candidates = [BatchingCandidate(4, 0, 1), BatchingCandidate(16, 2_000, 1, (4, 8, 16))]
    path = tmp_path / "candidates.json"
    path.write_text(json.dumps([
        {"max_batch_size": c.max_batch_size, "batch_timeout_micros": c.batch_timeout_micros,
         "num_batch_threads": c.num_batch_threads, "allowed_batch_sizes": list(c.allowed_batch_sizes)}
        for c in candidates]))
    output = tmp_path / "batching_parameters.txt"
    rc = tune_main(["--model_config_file", served_ranker.model_config_file, "--model", MODEL,
                    "--candidates", str(path), "--replies", "4", "--slo_ms", "5000", "--sweep_start", "2",
                    "--sweep_steps", "1", "--duration", "2", "--quiet", "--output", str(output),
                    "--workdir", str(tmp_path / "work")])
    assert rc == 0
    table = (tmp_path / "batching_parameters_table.md").read_text()
    assert table.count("max_batch_size=") == 2
    params = text_format.Parse(output.read_text(), BatchingParameters())
    assert params.max_batch_size.value in (4, 16)
    assert "wrote" in capsys.readouterr().out


def test_bad_load_arguments_are_named(capsys):
    assert loadtest_main(["--model", MODEL, "--length_range", "9:3"]) == 2
    assert "LO:HI" in capsys.readouterr().err
    assert loadtest_main(["--model", MODEL, "--replies", "0"]) == 2
    assert "replies per query" in capsys.readouterr().err
    assert np.all(pairs.read_lengths() >= 3)
