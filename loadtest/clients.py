"""Where the load comes from: one event loop in this process, or several client processes that split the rate.

One Python process sending gRPC from one event loop tops out at a few thousand requests/s; past that it is the
load generator, not the server, that sets the numbers. ClientProcesses runs one InProcessLoad per process (spawned:
gRPC does not survive fork), each with its share of every phase's rate, its own requests and arrival seed, then
pools their latencies and reports each process's CPU use, so that a result shows the generator's headroom.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import selectors
import traceback
from typing import Sequence

import numpy as np

from bertserve.client.protocol import ModelSpec, grpc_request
from bertserve.client.transport import AsyncGrpcTransport
from bertserve.loadtest.loadgen import Phase, RequestShape, RunStats, closed_loop, open_loop, synthetic_batch, warm_up
from bertserve.loadtest.rest_load import AsyncRestTransport, rest_request

APIS = ("grpc", "rest")
SEED_STRIDE = 1000  # client process i draws its requests and arrivals from seed + i * SEED_STRIDE


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    """What every client sends: the API and its targets (host:port), the models the traffic is spread over
    (round robin), the request shape, and the per-request timeout."""

    targets: tuple[str, ...]
    models: tuple[ModelSpec, ...]
    shape: RequestShape
    timeout_s: float = 5.0
    api: str = "grpc"
    seed: int = 0
    requests_per_model: int = 64

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {self.api!r}")
        if not self.targets or not self.models:
            raise ValueError("a load needs at least one target and one model")


def build_requests(spec: LoadSpec) -> list:
    """requests_per_model requests for each model, built once, interleaved so that traffic alternates models."""
    rng = np.random.default_rng(spec.seed)
    encode = grpc_request if spec.api == "grpc" else rest_request
    per_model = [[encode(synthetic_batch(spec.shape, rng), model) for _ in range(spec.requests_per_model)]
                 for model in spec.models]
    return [request for group in zip(*per_model) for request in group]


class InProcessLoad:
    """The load from this process: one event loop, one transport and its prebuilt requests, warmed up before the
    first measured run."""

    def __init__(self, spec: LoadSpec, progress: bool = True):
        self.spec, self.progress = spec, progress
        # select() sleeps to the microsecond; epoll, asyncio's default here, rounds every timer up to the next
        # millisecond, which sent open-loop arrivals 0.5-0.7 ms late at the median (the send lag), and that lag
        # counts in every latency, measured from the schedule.
        self.loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
        self.transport = (AsyncGrpcTransport(list(spec.targets)) if spec.api == "grpc"
                          else AsyncRestTransport(list(spec.targets)))
        self.requests = build_requests(spec)
        self.warmed = False

    def warm_up(self) -> None:
        if not self.warmed:
            self.loop.run_until_complete(warm_up(self.transport, self.requests, self.spec.timeout_s))
            self.warmed = True

    def open(self, phases: Sequence[Phase], seed: int = 0) -> RunStats:
        self.warm_up()
        return self.loop.run_until_complete(open_loop(self.transport, self.requests, phases, self.spec.timeout_s,
                                                      self.spec.shape.replies_per_query, seed, self.progress))

    def closed(self, concurrency: int, duration_s: float) -> RunStats:
        self.warm_up()
        return self.loop.run_until_complete(closed_loop(self.transport, self.requests, concurrency, duration_s,
                                                        self.spec.timeout_s, self.spec.shape.replies_per_query,
                                                        self.progress))

    def close(self) -> None:
        self.loop.run_until_complete(self.transport.close())
        self.loop.close()

    def __enter__(self) -> "InProcessLoad":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _client_process(spec: LoadSpec, conn, cpus: Sequence[int] | None) -> None:
    """A client process: builds its load, then runs the parent's commands until told to stop."""
    try:
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
            except OSError:
                pass  # pinning refused here: the ready message says which cores the process has
        load = InProcessLoad(spec, progress=False)
        conn.send(("ready", sorted(os.sched_getaffinity(0))))
    except BaseException:  # noqa: BLE001 - whatever failed is sent to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    with load:
        while True:
            command, args = conn.recv()
            if command == "stop":
                return
            try:
                conn.send(("ok", getattr(load, command)(*args)))
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))


class ClientProcesses:
    """`processes` client processes (optionally pinned to `cpus`), each offering 1/processes of the load."""

    def __init__(self, spec: LoadSpec, processes: int, cpus: Sequence[int] | None = None,
                 start_timeout_s: float = 300.0):
        if processes < 1:
            raise ValueError(f"client processes must be >= 1, got {processes}")
        self.spec, self.start_timeout_s = spec, start_timeout_s
        context = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for i in range(processes):
            parent, child = context.Pipe()
            own = dataclasses.replace(spec, seed=spec.seed + i * SEED_STRIDE)
            proc = context.Process(target=_client_process, args=(own, child, list(cpus) if cpus else None),
                                   name=f"loadtest-client-{i}", daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        self.ready = False
        self.warmed = False
        self.cores: list[list[int]] = []  # each process's CPU affinity, once ready

    def _answer(self, i: int, timeout_s: float):
        conn = self.conns[i]
        if not conn.poll(timeout_s):
            raise TimeoutError(f"client process {i} gave no answer within {timeout_s:.0f} s")
        status, value = conn.recv()
        if status == "error":
            raise RuntimeError(f"client process {i} failed:\n{value}")
        return value

    def _all(self, commands: Sequence[tuple[str, tuple]], timeout_s: float) -> list:
        if not self.ready:
            self.cores = [self._answer(i, self.start_timeout_s) for i in range(len(self.conns))]
            self.ready = True
        for conn, command in zip(self.conns, commands):
            conn.send(command)
        return [self._answer(i, timeout_s) for i in range(len(self.conns))]

    def warm_up(self) -> None:
        if not self.warmed:
            self._all([("warm_up", ())] * len(self.conns), 60.0 + 10 * self.spec.timeout_s)
            self.warmed = True

    def _run_timeout(self, seconds: float) -> float:
        return seconds + 2 * self.spec.timeout_s + 60.0

    def open(self, phases: Sequence[Phase], seed: int = 0) -> RunStats:
        self.warm_up()
        n, phases = len(self.conns), tuple(phases)
        share = [Phase(p.qps / n, p.seconds) for p in phases]
        runs = self._all([("open", (share, seed + i * SEED_STRIDE)) for i in range(n)],
                         self._run_timeout(sum(p.seconds for p in phases)))
        total = sum(p.seconds for p in phases)
        return RunStats.merge(runs, round(sum(p.qps * p.seconds for p in phases) / total, 3), phases)

    def closed(self, concurrency: int, duration_s: float) -> RunStats:
        n = len(self.conns)
        if concurrency < n:
            raise ValueError(f"closed loop with {n} client processes needs concurrency >= {n}, got {concurrency}")
        self.warm_up()
        shares = [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
        runs = self._all([("closed", (c, duration_s)) for c in shares], self._run_timeout(duration_s))
        return RunStats.merge(runs, concurrency)

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            if proc.is_alive():
                try:
                    conn.send(("stop", ()))
                except OSError:
                    pass
        for proc in self.procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()

    def __enter__(self) -> "ClientProcesses":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def load_runner(spec: LoadSpec, processes: int, progress: bool = True) -> InProcessLoad | ClientProcesses:
    """One process: the load from this one (with a progress bar); more: client processes."""
    return InProcessLoad(spec, progress) if processes == 1 else ClientProcesses(spec, processes)
