"""`bertserve rank`, run against the session's real server."""

from __future__ import annotations

import json

from bertserve.client.cli import rank_main
from bertserve.train import pairs
from bertserve.train.recipe import MODEL_NAME as MODEL


def test_rank_cli_prints_a_ranked_table(served_ranker, capsys):
    rc = rank_main(["--target", served_ranker.server.target, "--model", MODEL, "--model_dir",
                    served_ranker.version_dir, "tell me a joke", "Why did the scarecrow win an award?",
                    "Your password must have eight characters.", "Take the second left."])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "query: tell me a joke"
    rows = [line.split(None, 2) for line in lines[2:5]]
    assert [int(r[0]) for r in rows] == [1, 2, 3]
    scores = [float(r[1]) for r in rows]
    assert scores == sorted(scores, reverse=True)


def test_rank_cli_reads_a_file_and_uses_rest(served_ranker, tmp_path, capsys):
    path = tmp_path / "queries.json"
    path.write_text(json.dumps([{"query": q, "replies": r} for q, r in pairs.read_examples()[:2]]))
    rc = rank_main(["--target", served_ranker.server.rest_target, "--rest", "--model", MODEL, "--model_dir",
                    served_ranker.version_dir, "--file", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("query: ") == 2


def test_rank_cli_reports_errors_with_codes(served_ranker, capsys):
    rc = rank_main(["--target", served_ranker.server.target, "--model", "no_such_model", "--model_dir",
                    served_ranker.version_dir, "q", "r"])
    assert rc == 1
    assert "NOT_FOUND" in capsys.readouterr().err
    assert rank_main(["--target", served_ranker.server.target, "--model", MODEL, "q", "r"]) == 2
    assert "--model_dir" in capsys.readouterr().err
    assert rank_main(["--target", served_ranker.server.target, "--model", MODEL, "--model_dir",
                      served_ranker.version_dir, "only a query"]) == 2
