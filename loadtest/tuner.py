"""Batching parameter search: restart `bertserve serve` with each candidate set (TF Serving reads batching
parameters once, at start), sweep QPS against each, keep the set with the highest QPS within the P99 SLO."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

from google.protobuf import text_format

from bertserve.client.protocol import ModelSpec
from bertserve.loadtest.clients import LoadSpec, load_runner
from bertserve.loadtest.loadgen import RequestShape, RunStats
from bertserve.loadtest.report import machine_label
from bertserve.loadtest.server_process import running_server
from bertserve.loadtest.sweep import SweepConfig, best_within_slo, sweep
from bertserve.server.batching_parameters_pb2 import BatchingParameters


@dataclasses.dataclass(frozen=True)
class BatchingCandidate:
    max_batch_size: int
    batch_timeout_micros: int
    num_batch_threads: int
    allowed_batch_sizes: tuple[int, ...] = ()
    max_enqueued_batches: int = 100

    def to_proto(self) -> BatchingParameters:
        params = BatchingParameters()
        params.max_batch_size.value = self.max_batch_size
        params.batch_timeout_micros.value = self.batch_timeout_micros
        params.num_batch_threads.value = self.num_batch_threads
        params.max_enqueued_batches.value = self.max_enqueued_batches
        params.allowed_batch_sizes.extend(self.allowed_batch_sizes)
        return params

    def to_text(self) -> str:
        return text_format.MessageToString(self.to_proto())

    @classmethod
    def from_text(cls, text: str) -> "BatchingCandidate":
        """A BatchingParameters text file's shaping fields (TF Serving's defaults where one is unset)."""
        params = text_format.Parse(text, BatchingParameters())
        default = lambda field, value: getattr(params, field).value if params.HasField(field) else value  # noqa: E731
        return cls(default("max_batch_size", 1000), default("batch_timeout_micros", 0),
                   default("num_batch_threads", os.cpu_count() or 1), tuple(params.allowed_batch_sizes),
                   default("max_enqueued_batches", 10))

    def describe(self) -> str:
        allowed = ",".join(map(str, self.allowed_batch_sizes)) or "-"
        return (f"max_batch_size={self.max_batch_size} timeout_us={self.batch_timeout_micros} "
                f"threads={self.num_batch_threads} allowed={allowed}")


def default_candidates(replies_per_query: int) -> list[BatchingCandidate]:
    """A CPU-sized grid around one request per batch up to four, in rows of `replies_per_query`."""
    k = replies_per_query
    return [
        BatchingCandidate(k, 0, 1),
        BatchingCandidate(2 * k, 2_000, 1),
        BatchingCandidate(4 * k, 5_000, 1, (k, 2 * k, 4 * k)),
        BatchingCandidate(2 * k, 2_000, 2),
        BatchingCandidate(4 * k, 10_000, 2, (k, 2 * k, 4 * k)),
    ]


def read_candidates(path: str) -> list[BatchingCandidate]:
    """A JSON list of objects with BatchingCandidate's field names."""
    with open(path, encoding="utf-8") as f:
        items = json.load(f)
    fields = {f.name for f in dataclasses.fields(BatchingCandidate)}
    out = []
    for i, item in enumerate(items):
        unknown = set(item) - fields
        if unknown:
            raise ValueError(f"{path}: candidate {i} has unknown fields {sorted(unknown)} (known: {sorted(fields)})")
        item = dict(item, allowed_batch_sizes=tuple(item.get("allowed_batch_sizes", ())))
        out.append(BatchingCandidate(**item))
    return out


@dataclasses.dataclass
class TrialResult:
    candidate: BatchingCandidate
    runs: list[RunStats]
    stop_reason: str
    best: RunStats | None


def run_trial(candidate: BatchingCandidate, model_config_file: str, spec: ModelSpec, shape: RequestShape,
              sweep_config: SweepConfig, timeout_s: float, workdir: str, index: int,
              extra_flags: Sequence[str] = (), progress: bool = True, clients: int = 1) -> TrialResult:
    params_path = os.path.join(workdir, f"batching_parameters_{index}.txt")
    with open(params_path, "w", encoding="utf-8") as f:
        f.write(candidate.to_text())
    with running_server(model_config_file, [spec.name], os.path.join(workdir, f"serve_{index}.log"),
                        batching_parameters_file=params_path, extra_flags=extra_flags) as server:
        with load_runner(LoadSpec((server.target,), (spec,), shape, timeout_s), clients, progress) as load:
            runs, reason = sweep(load, sweep_config, progress)
    return TrialResult(candidate, runs, reason, best_within_slo(runs, sweep_config))


def trials_table(trials: Sequence[TrialResult], config: SweepConfig, shape: RequestShape) -> str:
    lines = [f"**Batching candidates, P99 SLO {config.slo_p99_ms:g} ms, {shape.replies_per_query} replies per "
             f"query, seq {shape.max_len}, {config.step_duration_s:g} s per step; {machine_label()}**", "",
             "| # | batching parameters | best QPS within SLO | pairs/s | P50 ms | P99 ms | sweep ended because |",
             "|---|---|---|---|---|---|---|"]
    for i, t in enumerate(trials):
        if t.best is None:
            cells = ["none", "-", "-", "-"]
        else:
            b = t.best
            cells = [f"{b.achieved_qps:.1f}", f"{b.pairs_per_s:.0f}", f"{b.percentile_ms(50):.1f}",
                     f"{b.percentile_ms(99):.1f}"]
        lines.append(f"| {i} | {t.candidate.describe()} | " + " | ".join(cells) + f" | {t.stop_reason} |")
    return "\n".join(lines) + "\n"


def pick_best(trials: Sequence[TrialResult]) -> TrialResult | None:
    """Highest offered QPS step within the SLO (achieved QPS is noisy around it); ties go to the lower P99."""
    within = [t for t in trials if t.best is not None]
    return max(within, key=lambda t: (t.best.load, -t.best.percentile_ms(99)), default=None)
