"""What the server's Prometheus page says about batching, read before and after a run and subtracted, so that a
step of a sweep reports the batches of its own traffic: executed batches by padded size (TF Serving's
processed_batch_size_v2), rows per batch before padding (bertserve_batch_size) and answers by status."""

from __future__ import annotations

import collections
import dataclasses

from prometheus_client.parser import text_string_to_metric_families

PADDED_SIZES = ":tensorflow:serving:batching:processed_batch_size_v2"
REQUESTS = ":tensorflow:serving:request_count"
ROWS = "bertserve_batch_size"


@dataclasses.dataclass
class Snapshot:
    """Counters at one moment, keyed by model name."""

    padded: dict[str, collections.Counter] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(collections.Counter))  # model -> {padded size: batches}
    rows_le: dict[str, dict[float, float]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(dict))  # model -> {bucket upper bound: cumulative batches}
    rows_sum: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    batches: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    requests: dict[str, collections.Counter] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(collections.Counter))  # model -> {status: requests}


def parse(text: str) -> Snapshot:
    snap = Snapshot()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model_name", "")
            # The parser names a counter's samples <family>_total; TF Serving's counters have no suffix.
            if family.name == PADDED_SIZES:
                snap.padded[model][int(sample.labels["batch_size"])] += sample.value
            elif family.name == REQUESTS:
                snap.requests[model][sample.labels["status"]] += sample.value
            elif sample.name == ROWS + "_bucket":
                le = float(sample.labels["le"])
                snap.rows_le[model][le] = snap.rows_le[model].get(le, 0.0) + sample.value
            elif sample.name == ROWS + "_sum":
                snap.rows_sum[model] += sample.value
            elif sample.name == ROWS + "_count":
                snap.batches[model] += sample.value
    return snap


def batching_between(before: Snapshot, after: Snapshot, rows_per_query: int) -> dict:
    """Per model, what ran between the two snapshots: batches, mean rows and queries per batch, batches by padded
    size, batches by rows (histogram bucket upper bound -> batches in that bucket), answers by status."""
    out = {}
    for model in sorted(set(after.batches) | set(after.requests)):
        if model == "<unknown model>":
            continue
        batches = int(after.batches[model] - before.batches[model])
        rows = after.rows_sum[model] - before.rows_sum[model]
        padded = {size: int(n - before.padded[model][size]) for size, n in sorted(after.padded[model].items())
                  if n - before.padded[model][size] > 0}
        rows_hist, previous = {}, 0
        for le in sorted(after.rows_le[model]):
            cumulative = int(after.rows_le[model][le] - before.rows_le[model].get(le, 0.0))
            if cumulative > previous:
                rows_hist["+Inf" if le == float("inf") else f"{le:g}"] = cumulative - previous
            previous = cumulative
        statuses = {status: int(n - before.requests[model][status])
                    for status, n in sorted(after.requests[model].items()) if n - before.requests[model][status] > 0}
        out[model] = {"batches": batches,
                      "mean_rows_per_batch": round(rows / batches, 1) if batches else None,
                      "mean_queries_per_batch": round(rows / batches / rows_per_query, 2) if batches else None,
                      "batches_by_padded_size": padded, "batches_by_rows_upto": rows_hist,
                      "answers_by_status": statuses}
    return out
