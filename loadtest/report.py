"""Load test reports: a markdown table labelled with the machine, a JSON copy, and latency against QPS as PNG."""

from __future__ import annotations

import collections
import json
import os
import platform
from typing import Sequence

from bertserve.loadtest.loadgen import PERCENTILES, RunStats

COLUMNS = ("load", "sent_qps", "achieved_qps", "pairs_per_s", *(f"p{p:g}_ms" for p in PERCENTILES), "ok", "errors",
           "send_lag_p99_ms", "client_cpu_max")


def machine_label() -> str:
    """CPU model and core count: numbers on 2 shared cores and on a 64-core server are different facts."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def markdown_table(results: Sequence[RunStats], title: str) -> str:
    load_name = "offered QPS" if results and results[0].mode == "open" else "concurrency"
    header = [load_name, *COLUMNS[1:]]
    lines = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for stats in results:
        row = stats.row()
        row["client_cpu_max"] = max(row.get("client_cpu_cores") or [float("nan")])
        cells = [f"{row[c]:g}" if isinstance(row.get(c), float) else str(row.get(c, "-")) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    errors: collections.Counter[str] = collections.Counter()
    for stats in results:
        errors.update(stats.errors)
    if errors:
        lines += ["", "errors by status: " + ", ".join(f"{code} {n}" for code, n in sorted(errors.items()))]
    return "\n".join(lines) + "\n"


def write_json(results: Sequence[RunStats], path: str, extra: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**extra, "runs": [r.row() for r in results]}, f, indent=2)
        f.write("\n")


def plot_latency_vs_qps(results: Sequence[RunStats], path: str, title: str, slo_p99_ms: float | None,
                        reference: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None) -> None:
    """P50..P99.9 against achieved QPS; `reference`: other curves to compare with, label -> (QPS, latency ms)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qps = [r.achieved_qps for r in results]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p, style in zip(PERCENTILES, ("o-", "s-", "^-", "v--")):
        ax.plot(qps, [r.percentile_ms(p) for r in results], style, label=f"P{p:g}")
    for label, (xs, ys) in (reference or {}).items():
        ax.plot(xs, ys, "x:", label=label)
    if slo_p99_ms is not None:
        ax.axhline(slo_p99_ms, color="red", linestyle=":", label=f"P99 SLO {slo_p99_ms:g} ms")
    ax.set_xlabel("achieved QPS (queries/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title(title.replace("; ", "\n"), fontsize=9)  # the machine label on its own line
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
