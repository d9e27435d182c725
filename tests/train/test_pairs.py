"""The shipped pair set: held-out queries stay out of training, and the metrics rank as they should."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.train import pairs


def test_heldout_queries_and_replies_never_appear_in_training():
    train = pairs.read_pairs(pairs.TRAIN_PAIRS)
    heldout = pairs.group_by_query(pairs.read_pairs(pairs.HELDOUT_PAIRS))
    train_queries = {p.query for p in train}
    train_replies = {p.reply for p in train}
    assert not train_queries & {q.query for q in heldout}
    assert not train_replies & {q.replies[q.correct] for q in heldout}


def test_metrics_of_a_perfect_and_a_reversed_ranker():
    queries = pairs.group_by_query(pairs.read_pairs(pairs.HELDOUT_PAIRS))
    fitting = {q.query: q.replies[q.correct] for q in queries}

    def perfect(query, replies):
        return np.array([float(reply == fitting[query]) for reply in replies])

    best = pairs.evaluate(queries, perfect)
    worst = pairs.evaluate(queries, lambda query, replies: -perfect(query, replies))
    assert (best.accuracy_at_1, best.mrr) == (1.0, 1.0)
    assert worst.accuracy_at_1 == 0.0 and worst.mrr == pytest.approx(0.1)  # 10 candidates: last place
    assert worst.chance_mrr == pytest.approx(np.mean(1 / np.arange(1, 11)))


def test_a_query_needs_exactly_one_fitting_reply():
    rows = [pairs.LabelledPair("q", "a", 1), pairs.LabelledPair("q", "b", 1)]
    with pytest.raises(ValueError, match="2 fitting replies"):
        pairs.group_by_query(rows)
