"""Prometheus metrics under TF Serving's names (so existing dashboards work) plus batch size / queue delay.

TF Serving exports its monitoring counters as `counter` type without prometheus_client's `_total` suffix
(e.g. `:tensorflow:serving:request_count{model_name,status}`); those few counters are rendered here exactly,
the histograms go through prometheus_client.

Label values come from the configuration, never from a request: a request naming a model the config does not
list is counted under UNKNOWN_MODEL_LABEL, so a client cannot grow the metrics page by inventing names.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
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


class _Children:
    """A labelled histogram's children by label values, looked up without prometheus_client's `labels()` (its
    argument checks and lock cost more than the observation itself, several times per request)."""

    def __init__(self, histogram: Histogram):
        self._histogram = histogram
        self._children: dict[tuple[str, ...], Histogram] = {}

    def __call__(self, *labels: str) -> Histogram:
        child = self._children.get(labels)
        if child is None:  # label values come from the config (see the module docstring): the dict stays small
            child = self._children[labels] = self._histogram.labels(*labels)
        return child


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
        self.request_latency = Histogram(
            ":tensorflow:serving:request_latency", "Distribution of wall time (in microseconds) for requests.",
            ("model_name", "API", "entrypoint"), buckets=_exponential(10, 1.8, 33), registry=self.registry)
        self.queuing_latency = Histogram(
            ":tensorflow:serving:batching_session:queuing_latency",
            "Distribution of wall time spent (in microseconds) in queuing.", ("thread_pool_name",),
            buckets=_exponential(100, 1.2, 52), registry=self.registry)
        self.input_batch_size = Histogram(
            ":tensorflow:serving:batching:input_batch_size_v2",
            "Tracks the batch size distribution on the inputs by model_name.", ("model_name", "op_name"),
            buckets=_exponential(1, 2, 14), registry=self.registry)
        self.batch_size = Histogram(
            ":tensorflow:serving:batching:batch_size",
            "Tracks the batch size distribution on the batch result by model_name.", ("model_name", "op_name"),
            buckets=_exponential(1, 1.5, 20), registry=self.registry)
        self.padding_size = Histogram(
            ":tensorflow:serving:batching:padding_size_v2",
            "Tracks the padding size distribution on batches by model_name.",
            ("model_name", "execution_batch_size", "op_name"), buckets=_exponential(1, 2, 14), registry=self.registry)
        self.batch_delay = Histogram(
            ":tensorflow:serving:batching:batch_delay_us_v2",
            "Tracks the batching delay (in microseconds) for inputs by model_name.", ("model_name", "op_name"),
            buckets=_exponential(1, 2, 27), registry=self.registry)
        # Exact per-size buckets so the batch-size distribution reads directly (1, 2, 3, ... max_batch_size).
        self.bertserve_batch_size = Histogram(
            "bertserve_batch_size", "Rows per executed batch, before padding.", ("model_name", "signature"),
            buckets=[float(b) for b in _batch_buckets(max_batch_size)], registry=self.registry)
        self.bertserve_queue_delay = Histogram(
            "bertserve_queue_delay_seconds", "Time a request waited in the batching queue.",
            ("model_name", "signature"), buckets=_exponential(25e-6, 2, 16), registry=self.registry)
        self.thread_pool_name = "model_server_batch_threads"
        self._model_names: frozenset[str] = frozenset()
        self._request_latency, self._queuing_latency = _Children(self.request_latency), _Children(self.queuing_latency)
        self._input_batch_size, self._batch_size = _Children(self.input_batch_size), _Children(self.batch_size)
        self._padding_size, self._batch_delay = _Children(self.padding_size), _Children(self.batch_delay)
        self._bertserve_batch_size = _Children(self.bertserve_batch_size)
        self._bertserve_queue_delay = _Children(self.bertserve_queue_delay)
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
        self._request_latency(model, api, entrypoint).observe(seconds * 1e6)

    def batch_done(self, model: str, signature: str, rows: int, padded_rows: int) -> None:
        self.processed_batch_size.inc(model, signature, str(padded_rows))
        self._batch_size(model, signature).observe(rows)
        self._padding_size(model, str(padded_rows), signature).observe(padded_rows - rows)
        self._bertserve_batch_size(model, signature).observe(rows)

    def task_dequeued(self, model: str, signature: str, task_rows: int, queued_seconds: float) -> None:
        self._input_batch_size(model, signature).observe(task_rows)
        self._batch_delay(model, signature).observe(queued_seconds * 1e6)
        self._queuing_latency(self.thread_pool_name).observe(queued_seconds * 1e6)
        self._bertserve_queue_delay(model, signature).observe(queued_seconds)

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
