"""The ranking API: a query and its candidate replies in, replies sorted by the ranker's score out.

Long candidate lists are split into requests of at most `max_pairs_per_request` pairs, sent concurrently, and
joined back in order: smaller requests batch better on the server and bound the cost of one retry.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from typing import Sequence

import numpy as np

from bertserve.client.padding import DEFAULT_BUCKETS, PaddedBatch, PaddingMode, pad
from bertserve.client.protocol import ModelSpec
from bertserve.client.retry import RetryPolicy, acall_with_retries, call_with_retries
from bertserve.client.tokenization import EncodedPairs, PairTokenizer, TruncationStats
from bertserve.client.transport import (DEFAULT_CHANNEL_OPTIONS, AsyncGrpcTransport, GrpcTransport, RestTransport,
                                        Transport)
from bertserve.model_dir import SIGNATURE_NAME

TRANSPORTS = ("grpc", "rest")


@dataclasses.dataclass(frozen=True)
class RankedReply:
    reply: str
    score: float


@dataclasses.dataclass(frozen=True)
class ClientOptions:
    """Everything about how requests are made, in one place (the CLI builds one from its flags)."""

    signature: str = SIGNATURE_NAME
    version: int | None = None
    version_label: str | None = None
    timeout_s: float = 5.0
    retry: RetryPolicy = RetryPolicy()
    max_pairs_per_request: int = 32
    max_concurrent_requests: int = 4
    padding: PaddingMode = "fixed"
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    transport: str = "grpc"
    channel_options: tuple[tuple[str, int], ...] = DEFAULT_CHANNEL_OPTIONS

    def __post_init__(self) -> None:
        if self.max_pairs_per_request < 1:
            raise ValueError(f"max_pairs_per_request must be >= 1, got {self.max_pairs_per_request}")
        if self.max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {self.transport!r} (choose from {', '.join(TRANSPORTS)})")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


def _targets_list(targets: str | Sequence[str]) -> list[str]:
    return [t.strip() for t in targets.split(",")] if isinstance(targets, str) else list(targets)


def _check_texts(query: str, replies: Sequence[str]) -> None:
    if not isinstance(query, str):
        raise TypeError(f"query must be a string, got {type(query).__name__}")
    if isinstance(replies, str):
        raise TypeError("replies must be a list of strings, got one string")
    if len(replies) == 0:
        raise ValueError("no candidate replies to rank: the replies list is empty")
    bad = [i for i, r in enumerate(replies) if not isinstance(r, str)]
    if bad:
        raise TypeError(f"replies must be strings; item {bad[0]} is {type(replies[bad[0]]).__name__}")


def _sorted(replies: Sequence[str], scores: np.ndarray) -> list[RankedReply]:
    order = np.argsort(-scores, kind="stable")
    return [RankedReply(replies[i], float(scores[i])) for i in order]


class _RankerCore:
    """Tokenize, pad and split: the request-independent half shared by the sync and asyncio clients."""

    def __init__(self, model: str, tokenizer: PairTokenizer, options: ClientOptions):
        self.tokenizer = tokenizer
        self.options = options
        self.spec = ModelSpec(model, options.signature, options.version, options.version_label)
        self.truncation = TruncationStats()

    def _requests(self, queries: Sequence[str], replies: Sequence[str]) -> list[PaddedBatch]:
        encoded = self.tokenizer.encode_pairs(queries, replies)
        self.truncation.add(encoded.truncation)
        size = self.options.max_pairs_per_request
        return [pad(EncodedPairs(encoded.ids[i:i + size], encoded.first_segment_len[i:i + size], encoded.truncation),
                    self.tokenizer.max_len, self.options.padding, self.options.buckets)
                for i in range(0, len(encoded.ids), size)]


class RankerClient(_RankerCore):
    """Blocking client. `targets`: "host:port" or several (list or comma-separated), used round robin."""

    def __init__(self, targets: str | Sequence[str], model: str, tokenizer: PairTokenizer,
                 options: ClientOptions = ClientOptions()):
        super().__init__(model, tokenizer, options)
        targets = _targets_list(targets)
        self.transport: Transport = (GrpcTransport(targets, options.channel_options) if options.transport == "grpc"
                                     else RestTransport(targets))
        self._pool = concurrent.futures.ThreadPoolExecutor(options.max_concurrent_requests)

    def _send(self, batch: PaddedBatch) -> np.ndarray:
        return call_with_retries(lambda: self.transport.predict(batch, self.spec, self.options.timeout_s),
                                 self.options.retry)

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Scores (query, reply) pairs in input order."""
        if len(pairs) == 0:
            raise ValueError("no pairs to score: the pairs list is empty")
        queries, replies = zip(*pairs)
        batches = self._requests(queries, replies)
        if len(batches) == 1:
            return self._send(batches[0])
        return np.concatenate(list(self._pool.map(self._send, batches)))

    def rank(self, query: str, replies: Sequence[str]) -> list[RankedReply]:
        """Replies sorted best first (ties keep input order)."""
        _check_texts(query, replies)
        return _sorted(replies, self.score_pairs([(query, r) for r in replies]))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.transport.close()

    def __enter__(self) -> "RankerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncRankerClient(_RankerCore):
    """asyncio client: gRPC through grpc.aio; REST runs the blocking transport in a worker thread."""

    def __init__(self, targets: str | Sequence[str], model: str, tokenizer: PairTokenizer,
                 options: ClientOptions = ClientOptions()):
        super().__init__(model, tokenizer, options)
        targets = _targets_list(targets)
        self._grpc = AsyncGrpcTransport(targets, options.channel_options) if options.transport == "grpc" else None
        self._rest = RestTransport(targets) if options.transport == "rest" else None
        self._slots = asyncio.Semaphore(options.max_concurrent_requests)

    async def _predict_once(self, batch: PaddedBatch) -> np.ndarray:
        if self._grpc is not None:
            return await self._grpc.predict(batch, self.spec, self.options.timeout_s)
        return await asyncio.to_thread(self._rest.predict, batch, self.spec, self.options.timeout_s)

    async def _send(self, batch: PaddedBatch) -> np.ndarray:
        async with self._slots:
            return await acall_with_retries(lambda: self._predict_once(batch), self.options.retry)

    async def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        if len(pairs) == 0:
            raise ValueError("no pairs to score: the pairs list is empty")
        queries, replies = zip(*pairs)
        batches = self._requests(queries, replies)
        return np.concatenate(await asyncio.gather(*(self._send(b) for b in batches)))

    async def rank(self, query: str, replies: Sequence[str]) -> list[RankedReply]:
        _check_texts(query, replies)
        return _sorted(replies, await self.score_pairs([(query, r) for r in replies]))

    async def close(self) -> None:
        if self._grpc is not None:
            await self._grpc.close()
        if self._rest is not None:
            self._rest.close()

    async def __aenter__(self) -> "AsyncRankerClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
