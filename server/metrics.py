"""Prometheus metrics under TF Serving's names (so existing dashboards work) plus batch size / queue delay.

TF Serving exports its monitoring counters as `counter` type without prometheus_client's `_total` suffix
(e.g. `:tensorflow:serving:request_count{model_name,status}`); those few counters are rendered here exactly.
The histograms are recorded here too (LabelledHistogram: several observations per request, on the hot path) and
exported through prometheus_client's registry as its own histograms are.

Label values come from the configuration, never from a request: a request naming a model the config does not
list is counted under UNKNOWN_MODEL_LABEL, so a client cannot grow the metrics page by inventing names.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from typing import Iterator

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics import disable_created_metrics
from prometheus_client.utils import floatToGoString

disable_created_metrics()

UNKNOWN_MODEL_LABEL = "<unknown model>"


def _exponential(start: float, factor: float, count: int) -> list[float]:
    return [start * factor ** i for i in range(count)]


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class ExactNameCounter:
    """A labelled counter rendered as TF Serving renders it: TYPE counter, no `_total` suffix."""

    def __init__(self, name: str, documentation: str, label_names: tuple[str, ...]):
        self.name, self.documentation, self.label_names = name, documentation, label_names
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, *labels: str) -> float:
        with self._lock:
            return self._values.get(labels, 0.0)

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.documentation}", f"# TYPE {self.name} counter"]
        with self._lock:
            items = sorted(self._values.items())
        for labels, value in items:
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(self.label_names, labels))
            lines.append(f"{self.name}{{{label_text}}} {floatToGoString(value)}")
        return "\n".join(lines) + "\n"


class LabelledHistogram:
    """A labelled histogram, exported as prometheus_client exports its own (`_bucket{le}`, `_count`, `_sum`), but
    recorded with one bisect and two additions under one lock. prometheus_client's Histogram scans its buckets in
    Python and takes a lock per counter it touches; its observations were a fifth of the GIL time of a batched
    Predict (event loop and batch threads together: bench/serve_overhead.py's main-process ceiling)."""

    def __init__(self, name: str, documentation: str, label_names: tuple[str, ...], buckets: list[float]):
        self.name, self.documentation, self.label_names = name, documentation, label_names
        self._bounds = sorted(float(bound) for bound in buckets)
        self._le = [floatToGoString(bound) for bound in self._bounds] + ["+Inf"]
        self._series: dict[tuple[str, ...], list[float]] = {}  # labels -> per-bucket counts, then the sum
        self._lock = threading.Lock()

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        """Label values come from the configuration (see the module docstring): the series stay few."""
        bucket = bisect.bisect_left(self._bounds, value)  # the first bound >= value: Prometheus's `le`
        with self._lock:
            series = self._series.get(labels)
            if series is None:
                series = self._series[labels] = [0] * len(self._le) + [0.0]
            series[bucket] += 1
            series[-1] += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.label_names)
        with self._lock:
            items = [(labels, list(series)) for labels, series in self._series.items()]  # first seen first
        for labels, series in items:
            cumulative = list(itertools.accumulate(series[:-1]))
            family.add_metric(list(labels), list(zip(self._le, cumulative)), series[-1])
        yield family


class ServerMetrics:
    """Every metric the server exports; also the batcher's BatchObserver."""

    def __init__(self, max_batch_size: int = 1000):
        self.registry = CollectorRegistry(auto_describe=False)
        self.request_count = ExactNameCounter(
            ":tensorflow:serving:request_count", "The total number of requests.", ("model_name", "status"))
        self.processed_batch_size = ExactNameCounter(
            ":tensorflow:serving:batching:processed_batch_size_v2",
            "Tracks the batch size on processing by model_name and op name.", ("model_name", "op_name", "batch_size"))
        self.load_count = ExactNameCounter(
            ":tensorflow:serving:load_attempt_count", "The number of times a servable load was attempted.",
            ("model_path", "status"))
        self.request_latency = LabelledHistogram(
            ":tensorflow:serving:request_latency", "Distribution of wall time (in microseconds) for requests.",
            ("model_name", "API", "entrypoint"), buckets=_exponential(10, 1.8, 33))
        self.queuing_latency = LabelledHistogram(
            ":tensorflow:serving:batching_session:queuing_latency",
            "Distribution of wall time spent (in microseconds) in queuing.", ("thread_pool_name",),
            buckets=_exponential(100, 1.2, 52))
        self.input_batch_size = LabelledHistogram(
            ":tensorflow:serving:batching:input_batch_size_v2",
            "Tracks the batch size distribution on the inputs by model_name.", ("model_name", "op_name"),
            buckets=_exponential(1, 2, 14))
        self.batch_size = LabelledHistogram(
            ":tensorflow:serving:batching:batch_size",
            "Tracks the batch size distribution on the batch result by model_name.", ("model_name", "op_name"),
            buckets=_exponential(1, 1.5, 20))
        self.padding_size = LabelledHistogram(
            ":tensorflow:serving:batching:padding_size_v2",
            "Tracks the padding size distribution on batches by model_name.",
            ("model_name", "execution_batch_size", "op_name"), buckets=_exponential(1, 2, 14))
        self.batch_delay = LabelledHistogram(
            ":tensorflow:serving:batching:batch_delay_us_v2",
            "Tracks the batching delay (in microseconds) for inputs by model_name.", ("model_name", "op_name"),
            buckets=_exponential(1, 2, 27))
        # Exact per-size buckets so the batch-size distribution reads directly (1, 2, 3, ... max_batch_size).
        self.bertserve_batch_size = LabelledHistogram(
            "bertserve_batch_size", "Rows per executed batch, before padding.", ("model_name", "signature"),
            buckets=[float(b) for b in _batch_buckets(max_batch_size)])
        self.bertserve_queue_delay = LabelledHistogram(
            "bertserve_queue_delay_seconds", "Time a request waited in the batching queue.",
            ("model_name", "signature"), buckets=_exponential(25e-6, 2, 16))
        self.thread_pool_name = "model_server_batch_threads"
        self._model_names: frozenset[str] = frozenset()
        for histogram in (self.request_latency, self.queuing_latency, self.input_batch_size, self.batch_size,
                          self.padding_size, self.batch_delay, self.bertserve_batch_size, self.bertserve_queue_delay):
            self.registry.register(histogram)
        self.model_versions = Gauge("bertserve_available_model_versions", "Versions serving per model.",
                                    ("model_name",), registry=self.registry)

    def set_model_names(self, names: frozenset[str]) -> None:
        """The models the config lists now (the manager calls this on every config change)."""
        self._model_names = names

    def model_label(self, name: str) -> str:
        return name if name in self._model_names else UNKNOWN_MODEL_LABEL

    def request_done(self, model: str, api: str, entrypoint: str, status: str, seconds: float) -> None:
        """`model` is what the request named; `status` a gRPC code name (a closed set)."""
        model = self.model_label(model)
        self.request_count.inc(model, status)
        self.request_latency.observe((model, api, entrypoint), seconds * 1e6)

    def batch_done(self, model: str, signature: str, rows: int, padded_rows: int) -> None:
        self.processed_batch_size.inc(model, signature, str(padded_rows))
        self.batch_size.observe((model, signature), rows)
        self.padding_size.observe((model, str(padded_rows), signature), padded_rows - rows)
        self.bertserve_batch_size.observe((model, signature), rows)

    def task_dequeued(self, model: str, signature: str, task_rows: int, queued_seconds: float) -> None:
        self.input_batch_size.observe((model, signature), task_rows)
        self.batch_delay.observe((model, signature), queued_seconds * 1e6)
        self.queuing_latency.observe((self.thread_pool_name,), queued_seconds * 1e6)
        self.bertserve_queue_delay.observe((model, signature), queued_seconds)

    def exposition(self) -> bytes:
        counters = "".join(c.render() for c in (self.request_count, self.processed_batch_size, self.load_count))
        return counters.encode("utf-8") + generate_latest(self.registry)


def _batch_buckets(max_batch_size: int) -> list[int]:
    """Every size up to 64, then powers of two up to the largest batch."""
    buckets = list(range(1, min(max_batch_size, 64) + 1))
    size = 128
    while buckets[-1] < max_batch_size:
        buckets.append(min(size, max_batch_size))
        size *= 2
    return buckets
