"""The shipped query/reply pair set (train/data/) and the ranking metrics computed on it.

Held-out evaluation groups each held-out query with its candidate replies (exactly one fits) and asks where the
ranker puts the fitting one: accuracy@1 and mean reciprocal rank, beside what random order would score.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from typing import Callable, Sequence

import numpy as np

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
TRAIN_PAIRS = os.path.join(DATA_DIR, "train_pairs.tsv")
HELDOUT_PAIRS = os.path.join(DATA_DIR, "heldout_pairs.tsv")
EXAMPLES = os.path.join(DATA_DIR, "examples.json")
LENGTHS = os.path.join(DATA_DIR, "lengths.txt")


@dataclasses.dataclass(frozen=True)
class LabelledPair:
    query: str
    reply: str
    label: int


@dataclasses.dataclass(frozen=True)
class RankingQuery:
    """A query, its candidate replies, and the index of the one that fits."""

    query: str
    replies: tuple[str, ...]
    correct: int


def read_pairs(path: str) -> list[LabelledPair]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if rows and set(rows[0]) != {"query", "reply", "label"}:
        raise ValueError(f"{path}: expected columns query, reply, label; got {', '.join(rows[0])}")
    return [LabelledPair(r["query"], r["reply"], int(r["label"])) for r in rows]


def group_by_query(pairs: Sequence[LabelledPair]) -> list[RankingQuery]:
    """One RankingQuery per query, in file order; each must have exactly one label-1 reply."""
    groups: dict[str, list[LabelledPair]] = {}
    for pair in pairs:
        groups.setdefault(pair.query, []).append(pair)
    out = []
    for query, members in groups.items():
        positives = [i for i, p in enumerate(members) if p.label == 1]
        if len(positives) != 1:
            raise ValueError(f"query {query!r} has {len(positives)} fitting replies; ranking needs exactly one")
        out.append(RankingQuery(query, tuple(p.reply for p in members), positives[0]))
    return out


def read_examples(path: str = EXAMPLES) -> list[tuple[str, list[str]]]:
    with open(path, encoding="utf-8") as f:
        return [(item["query"], list(item["replies"])) for item in json.load(f)]


def read_lengths(path: str = LENGTHS) -> np.ndarray:
    lengths = np.loadtxt(path, dtype=np.int64, ndmin=1)
    if lengths.size == 0 or lengths.min() < 1:
        raise ValueError(f"{path}: expected one positive token length per line")
    return lengths


@dataclasses.dataclass(frozen=True)
class RankingMetrics:
    queries: int
    accuracy_at_1: float
    mrr: float
    chance_accuracy_at_1: float
    chance_mrr: float


def heldout_metrics(score_pairs: Callable[[list[tuple[str, str]]], np.ndarray]) -> RankingMetrics:
    """The metrics on the held-out pairs; score_pairs scores (query, reply) pairs, e.g. RankerClient.score_pairs."""
    queries = group_by_query(read_pairs(HELDOUT_PAIRS))
    return evaluate(queries, lambda query, replies: score_pairs([(query, reply) for reply in replies]))


def evaluate(queries: Sequence[RankingQuery], score: Callable[[str, Sequence[str]], np.ndarray]) -> RankingMetrics:
    """`score(query, replies)` returns one score per reply; ties count against the fitting reply."""
    ranks, chance_acc, chance_mrr = [], [], []
    for q in queries:
        scores = np.asarray(score(q.query, q.replies), dtype=np.float64)
        ranks.append(1 + int(np.sum(np.delete(scores, q.correct) >= scores[q.correct])))
        n = len(q.replies)
        chance_acc.append(1.0 / n)
        chance_mrr.append(float(np.mean(1.0 / np.arange(1, n + 1))))
    ranks_arr = np.asarray(ranks, dtype=np.float64)
    return RankingMetrics(queries=len(queries), accuracy_at_1=float(np.mean(ranks_arr == 1)),
                          mrr=float(np.mean(1.0 / ranks_arr)), chance_accuracy_at_1=float(np.mean(chance_acc)),
                          chance_mrr=float(np.mean(chance_mrr)))
