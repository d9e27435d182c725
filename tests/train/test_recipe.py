"""The recipe's ranker (fine-tuned for the session's short run and served), scored on the held-out queries."""

from __future__ import annotations

from bertserve.client.ranker import RankerClient
from bertserve.train import pairs
from bertserve.train.recipe import MODEL_NAME as MODEL


def test_heldout_ranking_beats_chance(served_ranker):
    with RankerClient(served_ranker.server.target, MODEL, served_ranker.tokenizer) as client:
        metrics = pairs.heldout_metrics(client.score_pairs)
    assert metrics.queries == 44
    assert abs(metrics.chance_accuracy_at_1 - 0.1) < 1e-9
    # Chance gets >= 0.3 accuracy@1 on 44 queries with probability < 1e-3 (binomial, p = 0.1).
    assert metrics.accuracy_at_1 >= 0.3, metrics
    assert metrics.mrr >= metrics.chance_mrr + 0.2, metrics
