"""Load generator: open loop (Poisson arrivals at a target QPS) and closed loop (N concurrent callers).

Open loop is the honest one for capacity planning: arrivals do not wait for answers, so a slow server shows up
as queueing in the latency, and each latency is measured from the request's scheduled arrival time (not from
when this process got round to sending it), so a stalled client cannot hide server queueing either.
Closed loop measures what N callers that wait for each other get, a lower bound on load.

Each request is one query with K candidate replies: one PredictRequest of K rows, padded to max_len. The
requests are built once, up front, from token lengths sampled from a file (default: the shipped pair set) or a
uniform range; ids are random word pieces, since cost depends on lengths, not on which tokens they are.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from typing import Sequence

import numpy as np
from tqdm import tqdm

from bertserve.client.errors import ServingError
from bertserve.client.padding import PaddedBatch
from bertserve.client.protocol import ModelSpec, grpc_request
from bertserve.client.transport import AsyncGrpcTransport

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
FIRST_WORD_PIECE_ID = 1000  # below: [PAD], [unusedN], [UNK], [CLS], [SEP], [MASK] and punctuation in BERT vocabs
CLS_ID, SEP_ID = 101, 102   # BERT's uncased/cased vocabs; pass others via RequestShape


@dataclasses.dataclass(frozen=True)
class RequestShape:
    """What one request looks like: K pairs, each of a length drawn from `lengths`, padded to max_len."""

    replies_per_query: int = 20
    max_len: int = 32
    lengths: tuple[int, ...] = (32,)
    vocab_size: int = 30522
    cls_id: int = CLS_ID
    sep_id: int = SEP_ID

    def __post_init__(self) -> None:
        if self.replies_per_query < 1:
            raise ValueError(f"replies per query must be >= 1, got {self.replies_per_query}")
        if not self.lengths or min(self.lengths) < 3:
            raise ValueError("pair lengths must be >= 3 ([CLS] x [SEP] y [SEP] needs at least 3 tokens)")
        if self.vocab_size <= FIRST_WORD_PIECE_ID:
            raise ValueError(f"vocab_size {self.vocab_size} is too small for synthetic word pieces")


def synthetic_batch(shape: RequestShape, rng: np.random.Generator) -> PaddedBatch:
    k, s = shape.replies_per_query, shape.max_len
    lengths = np.minimum(rng.choice(np.asarray(shape.lengths), size=k), s)
    ids = rng.integers(FIRST_WORD_PIECE_ID, shape.vocab_size, size=(k, s), dtype=np.int32)
    positions = np.arange(s)[None, :]
    mask = (positions < lengths[:, None]).astype(np.int32)
    query_end = np.maximum(1, lengths // 3)  # index of the first [SEP]
    ids[:, 0] = shape.cls_id
    ids[np.arange(k), query_end] = shape.sep_id
    ids[np.arange(k), lengths - 1] = shape.sep_id
    segments = ((positions > query_end[:, None]) & (mask == 1)).astype(np.int32)
    return PaddedBatch(np.where(mask == 1, ids, 0).astype(np.int32), mask, segments)


def build_requests(shape: RequestShape, spec: ModelSpec, count: int = 64, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [grpc_request(synthetic_batch(shape, rng), spec) for _ in range(count)]


@dataclasses.dataclass
class RunStats:
    """One run at one load level. Latencies in milliseconds, successful requests only."""

    mode: str
    load: float  # offered QPS (open loop) or concurrency (closed loop)
    sent: int
    duration_s: float  # the sending window
    elapsed_s: float  # until the last answer
    pairs_per_request: int
    latencies_ms: np.ndarray
    errors: dict[str, int]

    @property
    def ok(self) -> int:
        return int(self.latencies_ms.size)

    @property
    def achieved_qps(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def sent_qps(self) -> float:
        """The rate actually sent: Poisson arrivals over a short window differ from the offered rate."""
        return self.sent / self.duration_s

    @property
    def pairs_per_s(self) -> float:
        return self.achieved_qps * self.pairs_per_request

    def percentile_ms(self, p: float) -> float:
        return float(np.percentile(self.latencies_ms, p)) if self.ok else float("nan")

    def row(self) -> dict:
        row = {"mode": self.mode, "load": self.load, "sent_qps": round(self.sent_qps, 2), "ok": self.ok,
               "errors": sum(self.errors.values()), "achieved_qps": round(self.achieved_qps, 2),
               "pairs_per_s": round(self.pairs_per_s, 1)}
        row.update({f"p{p:g}_ms": round(self.percentile_ms(p), 2) for p in PERCENTILES})
        row["errors_by_status"] = dict(self.errors)
        return row


class _Recorder:
    def __init__(self):
        self.latencies: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.sent = 0

    async def call(self, transport: AsyncGrpcTransport, request, timeout_s: float, start: float) -> None:
        try:
            await transport.predict_request(request, timeout_s)
            self.latencies.append((time.perf_counter() - start) * 1e3)
        except ServingError as error:
            self.errors[error.code] += 1

    def describe(self) -> str:
        errors = sum(self.errors.values())
        return f"sent {self.sent} ok {len(self.latencies)} errors {errors}"


async def _show_progress(bar: tqdm, recorder: _Recorder, deadline: float) -> None:
    while True:
        now = time.perf_counter()
        bar.n = min(bar.total, round(bar.total - max(0.0, deadline - now), 1))
        bar.set_postfix_str(recorder.describe(), refresh=True)
        await asyncio.sleep(0.5)


async def _run(mode: str, load: float, driver, duration_s: float, pairs_per_request: int, label: str,
               progress: bool) -> RunStats:
    recorder = _Recorder()
    start = time.perf_counter()
    bar = tqdm(total=duration_s, desc=label, unit="s", disable=None if progress else True, leave=False,
               bar_format="{desc}: {n:.0f}/{total:.0f}s |{bar}| {postfix}")
    ticker = asyncio.create_task(_show_progress(bar, recorder, start + duration_s))
    try:
        await driver(recorder, start + duration_s)
    finally:
        ticker.cancel()
        bar.close()
    elapsed = max(duration_s, time.perf_counter() - start)  # the window, or longer if answers came late
    return RunStats(mode, load, recorder.sent, duration_s, elapsed, pairs_per_request,
                    np.asarray(recorder.latencies, dtype=np.float64), dict(recorder.errors))


async def open_loop(transport: AsyncGrpcTransport, requests: Sequence, qps: float, duration_s: float,
                    timeout_s: float, pairs_per_request: int, seed: int = 0, progress: bool = True) -> RunStats:
    """Poisson arrivals at `qps` for `duration_s`; waits for the stragglers before returning."""
    if qps <= 0:
        raise ValueError(f"target QPS must be positive, got {qps}")
    rng = np.random.default_rng(seed)

    async def drive(recorder: _Recorder, deadline: float) -> None:
        tasks = set()
        scheduled = time.perf_counter()
        while True:
            scheduled += rng.exponential(1.0 / qps)
            if scheduled >= deadline:
                break
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            request = requests[recorder.sent % len(requests)]
            recorder.sent += 1
            task = asyncio.create_task(recorder.call(transport, request, timeout_s, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    return await _run("open", qps, drive, duration_s, pairs_per_request, f"open loop {qps:g} QPS", progress)


async def closed_loop(transport: AsyncGrpcTransport, requests: Sequence, concurrency: int, duration_s: float,
                      timeout_s: float, pairs_per_request: int, progress: bool = True) -> RunStats:
    """`concurrency` callers, each sending its next request when the last one is answered."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")

    async def drive(recorder: _Recorder, deadline: float) -> None:
        async def caller() -> None:
            while time.perf_counter() < deadline:
                request = requests[recorder.sent % len(requests)]
                recorder.sent += 1
                await recorder.call(transport, request, timeout_s, time.perf_counter())

        await asyncio.gather(*(caller() for _ in range(concurrency)))

    return await _run("closed", concurrency, drive, duration_s, pairs_per_request,
                      f"closed loop x{concurrency}", progress)


async def warm_up(transport: AsyncGrpcTransport, requests: Sequence, timeout_s: float, count: int = 4) -> None:
    """Sequential requests, then a concurrent burst (merged batches of several sizes), so that connection setup
    and first-call costs per batch shape stay out of the numbers."""
    for request in requests[:count]:
        await transport.predict_request(request, timeout_s)
    await asyncio.gather(*(transport.predict_request(r, timeout_s) for r in requests[:2 * count]))
