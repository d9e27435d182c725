"""Load generator: open loop (Poisson arrivals at a target QPS, in phases) and closed loop (N concurrent callers).

Open loop is the honest one for capacity planning: arrivals do not wait for answers, so a slow server shows up
as queueing in the latency, and each latency is measured from the request's scheduled arrival time (not from
when this process got round to sending it), so a stalled client cannot hide server queueing either. How late each
request left against its schedule is recorded beside it (the send lag): that is the client's own delay, and the
proof that the load generator was not the limit. Phases of different rates in one run show what happens when the
load drops after an overload (recovery).
Closed loop measures what N callers that wait for each other get, a lower bound on load.

Each request is one query with K candidate replies: one PredictRequest of K rows, padded to max_len. The
requests are built once, up front, from token lengths sampled from a file (default: the shipped pair set) or a
uniform range; ids are random word pieces, since cost depends on lengths, not on which tokens they are.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import time
from typing import Any, Protocol, Sequence

import numpy as np
from tqdm import tqdm

from bertserve.client.errors import ServingError
from bertserve.client.padding import PaddedBatch
from bertserve.client.retry import RetryPolicy, acall_with_retries

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# Warm-up requests refused for load are retried, with up to ~8.5 s of backoff in all, before the warm-up gives up.
_WARM_UP_RETRIES = RetryPolicy(max_retries=12, initial_backoff_s=0.05, max_backoff_s=1.0)
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
    """One request: replies_per_query pairs of lengths drawn from shape.lengths."""
    lengths = rng.choice(np.asarray(shape.lengths), size=shape.replies_per_query)
    return batch_of_lengths(shape, lengths, rng)


def batch_of_lengths(shape: RequestShape, lengths: np.ndarray, rng: np.random.Generator) -> PaddedBatch:
    """Pairs of exactly these token lengths (capped at max_len), random word pieces between [CLS] and [SEP]s."""
    k, s = len(lengths), shape.max_len
    lengths = np.minimum(np.asarray(lengths), s)
    ids = rng.integers(FIRST_WORD_PIECE_ID, shape.vocab_size, size=(k, s), dtype=np.int32)
    positions = np.arange(s)[None, :]
    mask = (positions < lengths[:, None]).astype(np.int32)
    query_end = np.maximum(1, lengths // 3)  # index of the first [SEP]
    ids[:, 0] = shape.cls_id
    ids[np.arange(k), query_end] = shape.sep_id
    ids[np.arange(k), lengths - 1] = shape.sep_id
    segments = ((positions > query_end[:, None]) & (mask == 1)).astype(np.int32)
    return PaddedBatch(np.where(mask == 1, ids, 0).astype(np.int32), mask, segments)


class Transport(Protocol):
    """What the load generator sends through: a prebuilt request (gRPC PredictRequest or REST body) in, the
    answer or a ServingError out."""

    async def predict_request(self, request: Any, timeout_s: float) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Phase:
    """Open-loop arrivals at `qps` for `seconds`."""

    qps: float
    seconds: float

    def __post_init__(self) -> None:
        if self.qps <= 0:
            raise ValueError(f"target QPS must be positive, got {self.qps}")
        if self.seconds <= 0:
            raise ValueError(f"a load phase must last > 0 s, got {self.seconds}")


def poisson_arrivals(phases: Sequence[Phase], rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s from the start) of a Poisson process whose rate changes at each phase boundary."""
    out, start = [], 0.0
    for phase in phases:
        end, t = start + phase.seconds, start
        while True:
            gaps = rng.exponential(1.0 / phase.qps, size=int(phase.qps * phase.seconds) + 16)
            times = t + np.cumsum(gaps)
            out.append(times[times < end])
            if times[-1] >= end:
                break
            t = float(times[-1])
        start = end
    return np.concatenate(out) if out else np.zeros(0)


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.float64)


@dataclasses.dataclass
class RunStats:
    """One run at one load level, from one client process or merged over several. Latencies in milliseconds,
    answered requests only; `*_at_s` are scheduled times from the run's start (for the per-second timeline)."""

    mode: str
    load: float  # offered QPS (open loop: the mean over its phases) or concurrency (closed loop)
    sent: int
    duration_s: float  # the sending window
    elapsed_s: float  # until the last answer
    pairs_per_request: int
    latencies_ms: np.ndarray
    errors: dict[str, int]
    send_lag_ms: np.ndarray = dataclasses.field(default_factory=_empty)  # per answered request, aligned
    latency_at_s: np.ndarray = dataclasses.field(default_factory=_empty)
    error_at_s: np.ndarray = dataclasses.field(default_factory=_empty)
    client_cpu_s: list[float] = dataclasses.field(default_factory=list)  # CPU seconds per client process
    phases: tuple[Phase, ...] = ()
    error_examples: dict[str, str] = dataclasses.field(default_factory=dict)  # the first message of each code

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

    def client_cpu_cores(self) -> list[float]:
        """Each client process's CPU use over the run, in cores (1.0: one core busy the whole time)."""
        return [round(cpu / self.elapsed_s, 3) for cpu in self.client_cpu_s] if self.elapsed_s > 0 else []

    def row(self) -> dict:
        row = {"mode": self.mode, "load": self.load, "sent_qps": round(self.sent_qps, 2), "ok": self.ok,
               "errors": sum(self.errors.values()), "achieved_qps": round(self.achieved_qps, 2),
               "pairs_per_s": round(self.pairs_per_s, 1)}
        row.update({f"p{p:g}_ms": round(self.percentile_ms(p), 2) for p in PERCENTILES})
        row["errors_by_status"] = dict(self.errors)
        if self.error_examples:
            row["error_examples"] = dict(self.error_examples)
        if self.send_lag_ms.size:
            row["send_lag_p50_ms"] = round(float(np.percentile(self.send_lag_ms, 50)), 3)
            row["send_lag_p99_ms"] = round(float(np.percentile(self.send_lag_ms, 99)), 3)
            # Latency from when the request actually left: what the server and network took.
            row["p50_from_send_ms"] = round(float(np.percentile(self.latencies_ms - self.send_lag_ms, 50)), 3)
        if self.client_cpu_s:
            row["client_processes"] = len(self.client_cpu_s)
            row["client_cpu_cores"] = self.client_cpu_cores()
        if len(self.phases) > 1:
            row["phases"] = [dataclasses.asdict(p) for p in self.phases]
        return row

    def timeline(self, bin_s: float = 1.0) -> list[dict]:
        """Per `bin_s` of scheduled arrival time: answered, failed, P50 and P99 (ms)."""
        bins = int(np.ceil(self.duration_s / bin_s))
        ok_bin = np.minimum((self.latency_at_s // bin_s).astype(int), bins - 1)
        error_bin = np.minimum((self.error_at_s // bin_s).astype(int), bins - 1)
        out = []
        for b in range(bins):
            latencies = self.latencies_ms[ok_bin == b]
            out.append({"t_s": round(b * bin_s, 3), "ok": int(latencies.size), "errors": int((error_bin == b).sum()),
                        "p50_ms": round(float(np.percentile(latencies, 50)), 2) if latencies.size else None,
                        "p99_ms": round(float(np.percentile(latencies, 99)), 2) if latencies.size else None})
        return out

    @classmethod
    def merge(cls, runs: Sequence["RunStats"], load: float, phases: tuple[Phase, ...] = ()) -> "RunStats":
        """Several client processes' runs of the same window as one (`load` and `phases`: what they offered
        together): latencies pooled, errors summed."""
        errors: collections.Counter[str] = collections.Counter()
        examples: dict[str, str] = {}
        for run in runs:
            errors.update(run.errors)
            examples = {**run.error_examples, **examples}
        return cls(runs[0].mode, load, sum(r.sent for r in runs), runs[0].duration_s,
                   max(r.elapsed_s for r in runs), runs[0].pairs_per_request,
                   np.concatenate([r.latencies_ms for r in runs]), dict(errors),
                   np.concatenate([r.send_lag_ms for r in runs]), np.concatenate([r.latency_at_s for r in runs]),
                   np.concatenate([r.error_at_s for r in runs]), [c for r in runs for c in r.client_cpu_s], phases,
                   examples)


class _Recorder:
    def __init__(self, origin: float):
        self.origin = origin
        self.latencies: list[float] = []
        self.lags: list[float] = []
        self.latency_at: list[float] = []
        self.error_at: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.error_examples: dict[str, str] = {}
        self.sent = 0

    async def call(self, transport: Transport, request, timeout_s: float, scheduled: float) -> None:
        sent = time.perf_counter()
        try:
            await transport.predict_request(request, timeout_s)
            self.latencies.append((time.perf_counter() - scheduled) * 1e3)
            self.lags.append((sent - scheduled) * 1e3)
            self.latency_at.append(scheduled - self.origin)
        except ServingError as error:
            self.errors[error.code] += 1
            self.error_examples.setdefault(error.code, error.message[:300])
            self.error_at.append(scheduled - self.origin)

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
               progress: bool, phases: tuple[Phase, ...] = ()) -> RunStats:
    cpu_start = time.process_time()  # every thread of this process: gRPC's own threads as well as the loop
    start = time.perf_counter()
    recorder = _Recorder(start)
    bar = tqdm(total=duration_s, desc=label, unit="s", disable=None if progress else True, leave=False,
               bar_format="{desc}: {n:.0f}/{total:.0f}s |{bar}| {postfix}")
    ticker = asyncio.create_task(_show_progress(bar, recorder, start + duration_s))
    try:
        await driver(recorder, start)
    finally:
        ticker.cancel()
        bar.close()
    elapsed = max(duration_s, time.perf_counter() - start)  # the window, or longer if answers came late
    array = lambda values: np.asarray(values, dtype=np.float64)  # noqa: E731
    return RunStats(mode, load, recorder.sent, duration_s, elapsed, pairs_per_request, array(recorder.latencies),
                    dict(recorder.errors), array(recorder.lags), array(recorder.latency_at), array(recorder.error_at),
                    [time.process_time() - cpu_start], phases, recorder.error_examples)


async def open_loop(transport: Transport, requests: Sequence, phases: Sequence[Phase], timeout_s: float,
                    pairs_per_request: int, seed: int = 0, progress: bool = True) -> RunStats:
    """Poisson arrivals through `phases` (one Phase: a steady rate); waits for the stragglers before returning."""
    phases = tuple(phases)
    if not phases:
        raise ValueError("an open-loop run needs at least one phase")
    arrivals = poisson_arrivals(phases, np.random.default_rng(seed))
    duration = sum(p.seconds for p in phases)
    mean_qps = sum(p.qps * p.seconds for p in phases) / duration

    async def drive(recorder: _Recorder, start: float) -> None:
        tasks = set()
        for offset in arrivals:
            scheduled = start + offset
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            request = requests[recorder.sent % len(requests)]
            recorder.sent += 1
            task = asyncio.create_task(recorder.call(transport, request, timeout_s, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        remaining = start + duration - time.perf_counter()
        if remaining > 0:
            await asyncio.sleep(remaining)
        if tasks:
            await asyncio.gather(*tasks)

    label = f"open loop {' -> '.join(f'{p.qps:g}' for p in phases)} QPS"
    return await _run("open", round(mean_qps, 3), drive, duration, pairs_per_request, label, progress, phases)


async def closed_loop(transport: Transport, requests: Sequence, concurrency: int, duration_s: float,
                      timeout_s: float, pairs_per_request: int, progress: bool = True) -> RunStats:
    """`concurrency` callers, each sending its next request when the last one is answered."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")

    async def drive(recorder: _Recorder, start: float) -> None:
        deadline = start + duration_s

        async def caller() -> None:
            while time.perf_counter() < deadline:
                request = requests[recorder.sent % len(requests)]
                recorder.sent += 1
                await recorder.call(transport, request, timeout_s, time.perf_counter())

        await asyncio.gather(*(caller() for _ in range(concurrency)))

    return await _run("closed", concurrency, drive, duration_s, pairs_per_request,
                      f"closed loop x{concurrency}", progress)


async def warm_up(transport: Transport, requests: Sequence, timeout_s: float, count: int = 4) -> None:
    """Sequential requests, then a concurrent burst (merged batches of several sizes), so that connection setup
    and first-call costs per batch shape stay out of the numbers. A burst request refused for load (UNAVAILABLE:
    a small batch queue) has done its job; any other error is raised. The sequential requests are retried when
    refused for load, since other client processes may be bursting at the same time."""
    for request in requests[:count]:
        await acall_with_retries(functools.partial(transport.predict_request, request, timeout_s), _WARM_UP_RETRIES)
    answers = await asyncio.gather(*(transport.predict_request(r, timeout_s) for r in requests[:2 * count]),
                                   return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException) and not (isinstance(answer, ServingError) and answer.retryable):
            raise answer
