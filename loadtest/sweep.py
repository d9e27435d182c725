"""QPS sweep: raise the open-loop rate step by step until the P99 SLO breaks (or errors appear, or the server
stops keeping up). The result is the table TF Serving users tune by: offered QPS against P99."""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

from bertserve.loadtest.loadgen import Phase, RunStats


class OpenLoad(Protocol):
    """What a sweep drives: clients.InProcessLoad or clients.ClientProcesses."""

    def open(self, phases: Sequence[Phase], seed: int = 0) -> RunStats: ...


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    slo_p99_ms: float
    start_qps: float = 1.0
    factor: float = 1.5
    max_steps: int = 12
    step_duration_s: float = 10.0
    max_error_rate: float = 0.01
    min_achieved_ratio: float = 0.9  # answering below this fraction of the sent rate: the server is saturated

    def __post_init__(self) -> None:
        if self.factor <= 1.0:
            raise ValueError(f"sweep factor must be > 1, got {self.factor}")
        if self.start_qps <= 0 or self.slo_p99_ms <= 0:
            raise ValueError("sweep start QPS and P99 SLO must be positive")


def _error_rate(stats: RunStats) -> float:
    total = stats.ok + sum(stats.errors.values())
    return sum(stats.errors.values()) / total if total else 1.0


def meets_slo(stats: RunStats, config: SweepConfig) -> bool:
    return (stats.ok > 0 and stats.percentile_ms(99) <= config.slo_p99_ms
            and _error_rate(stats) <= config.max_error_rate)


def saturation(stats: RunStats, config: SweepConfig) -> str | None:
    """Why the server did not keep up with this step (errors, or answering less than was sent), or None."""
    if _error_rate(stats) > config.max_error_rate:
        return f"error rate {_error_rate(stats):.1%} above {config.max_error_rate:.1%}"
    if stats.achieved_qps < config.min_achieved_ratio * stats.sent_qps:
        return f"saturated: answered {stats.achieved_qps:.1f} of {stats.sent_qps:.1f} QPS sent"
    return None


def stop_reason(stats: RunStats, config: SweepConfig) -> str | None:
    """Why the sweep ends after this step (saturation, or P99 over the SLO), or None to go on."""
    if stats.percentile_ms(99) > config.slo_p99_ms and _error_rate(stats) <= config.max_error_rate:
        return f"P99 {stats.percentile_ms(99):.1f} ms above the {config.slo_p99_ms:g} ms SLO"
    return saturation(stats, config)


def sweep(load: OpenLoad, config: SweepConfig, progress: bool = True) -> tuple[list[RunStats], str]:
    results: list[RunStats] = []
    qps = config.start_qps
    for step in range(config.max_steps):
        stats = load.open([Phase(qps, config.step_duration_s)], seed=step)
        results.append(stats)
        if progress:
            print(f"  step {step + 1}: offered {qps:g} QPS -> answered {stats.achieved_qps:.2f} QPS, "
                  f"P50 {stats.percentile_ms(50):.1f} ms, P99 {stats.percentile_ms(99):.1f} ms, "
                  f"{sum(stats.errors.values())} errors", flush=True)
        reason = stop_reason(stats, config)
        if reason:
            return results, reason
        qps = round(qps * config.factor, 2)
    return results, f"reached the last of {config.max_steps} steps within the SLO"


def best_within_slo(results: Sequence[RunStats], config: SweepConfig) -> RunStats | None:
    """The run with the highest achieved QPS that met the SLO."""
    good = [r for r in results if meets_slo(r, config)]
    return max(good, key=lambda r: r.achieved_qps, default=None)
