"""RankerClient against a real `bertserve serve` through the official tensorflow_serving.apis stubs and REST."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bertserve.client.errors import ServingError
from bertserve.client.ranker import AsyncRankerClient, ClientOptions, RankerClient
from bertserve.client.retry import RetryPolicy
from bertserve.loadtest.server_process import free_port
from bertserve.client.transport import GrpcTransport
from bertserve.train.recipe import MODEL_NAME as MODEL

QUERY = "what should I eat for dinner tonight?"
REPLIES = ["How about a simple pasta with tomatoes and basil?", "The train leaves from platform four.",
           "Turn off the lights please.", "A curry with rice would be lovely.", "Why is the sky blue?",
           "My cat keeps scratching the sofa.", "Pizza night sounds great!", "I lost my umbrella."]
FAST_RETRY = RetryPolicy(max_retries=3, initial_backoff_s=0.01, max_backoff_s=0.05)


class CountingGrpcTransport(GrpcTransport):
    """The real transport, counting the Predict calls it makes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0
        self.rows: list[int] = []

    def predict(self, batch, spec, timeout_s):
        self.calls += 1
        self.rows.append(len(batch))
        return super().predict(batch, spec, timeout_s)


def _client(served, targets=None, **options) -> RankerClient:
    return RankerClient(targets or served.server.target, MODEL, served.tokenizer, ClientOptions(**options))


def test_rank_order_equals_score_order(served_ranker):
    with _client(served_ranker) as client:
        ranked = client.rank(QUERY, REPLIES)
        scores = client.score_pairs([(QUERY, r) for r in REPLIES])
    assert sorted(r.reply for r in ranked) == sorted(REPLIES)
    assert [r.score for r in ranked] == sorted((float(s) for s in scores), reverse=True)
    assert [r.reply for r in ranked] == [REPLIES[i] for i in np.argsort(-scores, kind="stable")]
    assert all(0.0 <= r.score <= 1.0 for r in ranked)


def test_long_candidate_lists_are_split_and_joined_in_order(served_ranker):
    replies = [f"{REPLIES[i % len(REPLIES)]} ({i})" for i in range(50)]
    with _client(served_ranker, max_pairs_per_request=64) as whole:
        expected = whole.score_pairs([(QUERY, r) for r in replies])
    with _client(served_ranker, max_pairs_per_request=8) as split:
        split.transport.close()
        split.transport = CountingGrpcTransport([served_ranker.server.target])
        got = split.score_pairs([(QUERY, r) for r in replies])
    assert split.transport.calls == 7 and sorted(split.transport.rows) == [2] + [8] * 6
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_rest_equals_grpc(served_ranker):
    with _client(served_ranker) as grpc_client:
        grpc_scores = grpc_client.score_pairs([(QUERY, r) for r in REPLIES])
    with _client(served_ranker, targets=served_ranker.server.rest_target, transport="rest") as rest_client:
        rest_scores = rest_client.score_pairs([(QUERY, r) for r in REPLIES])
    np.testing.assert_allclose(rest_scores, grpc_scores, atol=1e-6)


@pytest.mark.parametrize("transport", ["grpc", "rest"])
def test_async_client_equals_sync_client(served_ranker, transport):
    target = served_ranker.server.target if transport == "grpc" else served_ranker.server.rest_target
    with _client(served_ranker, targets=target, transport=transport) as client:
        expected = client.rank(QUERY, REPLIES)

    async def rank_concurrently():
        options = ClientOptions(transport=transport, max_pairs_per_request=3)
        async with AsyncRankerClient(target, MODEL, served_ranker.tokenizer, options) as client:
            return await asyncio.gather(*(client.rank(QUERY, REPLIES) for _ in range(4)))

    for ranked in asyncio.run(rank_concurrently()):
        assert [r.reply for r in ranked] == [r.reply for r in expected]
        np.testing.assert_allclose([r.score for r in ranked], [r.score for r in expected], atol=1e-5)


def test_over_long_inputs_are_truncated_and_counted(served_ranker):
    with _client(served_ranker) as client:
        client.rank("hi " * 40, ["fine " * 40, "ok"])
        assert client.truncation.pairs == 2
        assert client.truncation.queries_truncated == 2
        assert client.truncation.replies_truncated == 1


@pytest.mark.parametrize("transport", ["grpc", "rest"])
def test_server_errors_keep_tf_serving_codes(served_ranker, transport):
    target = served_ranker.server.target if transport == "grpc" else served_ranker.server.rest_target
    cases = [
        (dict(), "no_such_model", "NOT_FOUND", 404),
        (dict(version=7), MODEL, "NOT_FOUND", 404),
        (dict(signature="no_such_signature"), MODEL, "FAILED_PRECONDITION", 400),
    ]
    for options, model, code, http in cases:
        client = RankerClient(target, model, served_ranker.tokenizer, ClientOptions(transport=transport, **options))
        with client, pytest.raises(ServingError) as raised:
            client.rank(QUERY, REPLIES[:2])
        assert code in raised.value.code.split("|")
        assert raised.value.message
        assert raised.value.http_status == (http if transport == "rest" else None)


def test_deadline_exceeded_is_reported(served_ranker):
    with _client(served_ranker, timeout_s=1e-4) as client, pytest.raises(ServingError) as raised:
        client.rank(QUERY, REPLIES)
    assert raised.value.code == "DEADLINE_EXCEEDED"


def test_unavailable_is_retried_on_the_next_target(served_ranker):
    dead = f"localhost:{free_port()}"
    with _client(served_ranker, targets=[dead, served_ranker.server.target], retry=FAST_RETRY) as client:
        client.transport.close()
        client.transport = CountingGrpcTransport([dead, served_ranker.server.target])
        results = [client.rank(QUERY, REPLIES[:3]) for _ in range(4)]
    assert all(len(r) == 3 for r in results)
    assert client.transport.calls > 4  # some first attempts hit the dead target and were retried


def test_unavailable_is_raised_after_the_last_retry(served_ranker):
    dead = f"localhost:{free_port()}"
    with _client(served_ranker, targets=dead, retry=FAST_RETRY, timeout_s=2.0) as client:
        client.transport.close()
        client.transport = CountingGrpcTransport([dead])
        with pytest.raises(ServingError) as raised:
            client.rank(QUERY, REPLIES[:2])
    assert raised.value.code == "UNAVAILABLE"
    assert client.transport.calls == FAST_RETRY.max_retries + 1


def test_bad_client_input_is_named(served_ranker):
    with _client(served_ranker) as client:
        with pytest.raises(ValueError, match="replies list is empty"):
            client.rank(QUERY, [])
        with pytest.raises(TypeError, match="list of strings, got one string"):
            client.rank(QUERY, "one reply")
        with pytest.raises(TypeError, match="item 1 is int"):
            client.rank(QUERY, ["ok", 3])
        with pytest.raises(ValueError, match="pairs list is empty"):
            client.score_pairs([])
    with pytest.raises(ValueError, match="version or a version label, not both"):
        _client(served_ranker, version=1, version_label="stable")
    with pytest.raises(ValueError, match="max_pairs_per_request"):
        ClientOptions(max_pairs_per_request=0)
