"""Model registry: which versions of which models serve, following ModelServerConfig and the file system.

Mirrors TF Serving's ServerCore with the AvailabilityPreservingPolicy: a poll lists each base path's version
directories (base_paths: int64 names, through tf.io.gfile), applies the model's version policy, loads (and warms
up) new versions first, and only then unloads versions no longer wanted, each after its in-flight requests
finish. A version that fails to load is kept in the status table with its error; other models and versions keep
serving. Like TF Serving's ServableStateMonitor, the table outlives the config: a version unloaded because its
model left the config reports END, not NOT_FOUND.

Version labels are their own table, replaced only when every label of a new config passes TF Serving's checks
(check_labels), so a refused reload leaves the labels requests resolve unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import threading
import time
from typing import Callable, Iterator, NamedTuple

from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.config import model_server_config_pb2

from bertserve.server import base_paths
from bertserve.server.batcher import BatchingQueue, BatchScheduler
from bertserve.server.config_files import BatchingOptions, check_model_server_config
from bertserve.server.errors import ServingError, failed_precondition, from_exception, invalid_argument, not_found
from bertserve.server.metrics import ServerMetrics
from bertserve.server.servable import LoadedVersion
from bertserve.server.warmup import replay_warmup

log = logging.getLogger("bertserve.server")
State = get_model_status_pb2.ModelVersionStatus.State
_AVAILABLE = State.AVAILABLE  # read per request: the enum wrapper's attribute lookup is slow


@dataclasses.dataclass
class VersionRecord:
    version: int
    state: int = State.START
    error: ServingError | None = None
    servable: LoadedVersion | None = None
    queues: dict[str, BatchingQueue] = dataclasses.field(default_factory=dict)
    failed_attempts: int = 0
    failed_at: float = 0.0

    def should_retry(self, max_retries: int, interval_seconds: float) -> bool:
        """A failed load is retried on later polls, at most max_retries times, interval apart (never blocking)."""
        return (self.state == State.END and self.error is not None and self.failed_attempts <= max_retries
                and time.monotonic() - self.failed_at >= interval_seconds)


    def failed_for_good(self, max_retries: int) -> bool:
        """A failed load with no retry left."""
        return self.state == State.END and self.error is not None and self.failed_attempts > max_retries


@dataclasses.dataclass
class ModelEntry:
    config: model_server_config_pb2.ModelConfig
    versions: dict[int, VersionRecord] = dataclasses.field(default_factory=dict)
    source_error: str = ""
    aspired: list[int] = dataclasses.field(default_factory=list)  # what the last poll wanted
    in_config: bool = True  # False once a reload removed the model: its statuses stay, it serves nothing


class StartupError(RuntimeError):
    """A model of the startup config cannot serve: tensorflow_model_server exits in that case."""


class Handle(NamedTuple):  # one per request: a tuple is cheaper to build than a frozen dataclass
    """What one request holds while it runs: the version and its queues (if batching)."""

    servable: LoadedVersion
    queues: dict[str, BatchingQueue]


@dataclasses.dataclass(frozen=True)
class ManagerOptions:
    saved_model_tags: frozenset[str]
    enable_model_warmup: bool
    warmup_iterations: int
    allow_labels_for_unavailable: bool
    batching: BatchingOptions | None
    max_load_retries: int = 5
    load_retry_interval_seconds: float = 60.0
    gpu_memory_fraction: float = 0.0  # --per_process_gpu_memory_fraction


def aspired_versions(policy: model_server_config_pb2.FileSystemStoragePathSourceConfig.ServableVersionPolicy,
                     found: list[int]) -> list[int]:
    kind = policy.WhichOneof("policy_choice")
    if kind == "all":
        return found
    if kind == "specific":
        return [v for v in found if v in set(policy.specific.versions)]
    count = policy.latest.num_versions if kind == "latest" and policy.latest.num_versions > 0 else 1
    return found[-count:]


def settle_heap() -> None:
    """Collects what a load or an unload left in reference cycles, then moves every object alive now out of the
    cyclic collector's scans (gc.freeze). A loaded TensorFlow model is a few hundred thousand Python objects
    that live as long as their version: a full collection over them holds the GIL for ~250 ms (2-core EPYC, two
    small models), a stall of every request in flight, and the collector's scans cost the request loop ~10-20 %
    of its CPU (bench/serve_overhead.py). With them frozen, collections see only what requests create."""
    gc.collect()
    gc.freeze()


class ModelManager:
    def __init__(self, options: ManagerOptions, metrics: ServerMetrics,
                 on_batch_failure: Callable[[str], None] = lambda reason: None):
        """on_batch_failure(reason): the batch scheduler died; the server must stop reporting SERVING."""
        self.options, self.metrics = options, metrics
        self._models: dict[str, ModelEntry] = {}
        self._labels: dict[str, dict[str, int]] = {}  # model -> label -> version, as check_labels last accepted
        self._lock = threading.Lock()          # guards the tables; never held while loading
        self._poll_lock = threading.Lock()     # one poll / config change at a time
        batching = options.batching
        self._scheduler = (BatchScheduler(batching.num_batch_threads, batching.thread_pool_name, on_batch_failure)
                           if batching is not None else None)
        if batching is not None:
            metrics.thread_pool_name = batching.thread_pool_name

    # ---- configuration and polling -------------------------------------------------------------------------

    def apply_config(self, config: model_server_config_pb2.ModelServerConfig) -> None:
        """Adds, updates and removes models; removed models' versions unload (their statuses stay, END). Loads
        happen on the next poll; labels change with check_labels."""
        check_model_server_config(config)
        wanted = {entry.name: entry for entry in config.model_config_list.config}
        with self._poll_lock:
            with self._lock:
                removed = [entry for name, entry in self._models.items() if name not in wanted and entry.in_config]
                for entry in removed:
                    entry.in_config = False
                    self._labels.pop(entry.config.name, None)
                for name, entry in wanted.items():
                    if name in self._models:
                        self._models[name].config, self._models[name].in_config = entry, True
                    else:
                        self._models[name] = ModelEntry(config=entry)
            self.metrics.set_model_names(frozenset(wanted))
            self._unload_and_settle([(entry.config.name, record) for entry in removed
                                     for record in list(entry.versions.values())])

    def poll(self) -> None:
        """One pass over every base path: load newly aspired versions, then unload the ones no longer aspired."""
        with self._poll_lock:
            with self._lock:
                entries = [entry for entry in self._models.values() if entry.in_config]
            for entry in entries:
                self._poll_model(entry)

    def load_startup_models(self, stop: threading.Event, poll_seconds: float = 0.5) -> None:
        """TF Serving's start: polls until every configured model serves all the versions its policy wants.

        Waits while a base path is missing or has no version yet (TF Serving waits too, logging why), and while
        a failed load still has retries left. Raises StartupError once a wanted version failed for good, so the
        process exits instead of serving with a model missing.
        """
        waiting_logged: set[str] = set()
        while True:
            self.poll()
            pending = []
            with self._lock:
                for name, entry in sorted(self._models.items()):
                    if not entry.in_config:
                        continue
                    for version in entry.aspired:
                        record = entry.versions.get(version)
                        if record is not None and record.failed_for_good(self.options.max_load_retries):
                            raise StartupError(f"Loading servable {{name: {name} version: {version}}} failed: "
                                               f"{record.error}")
                    if not entry.aspired or any(entry.versions[v].state != State.AVAILABLE for v in entry.aspired
                                                if v in entry.versions):
                        pending.append((name, entry.source_error))
            if not pending:
                return
            for name, why in pending:
                if why and name not in waiting_logged:
                    waiting_logged.add(name)
                    log.warning("waiting for model %s: %s", name, why)
            if stop.wait(poll_seconds):
                raise StartupError(f"stopped while waiting for models {', '.join(n for n, _ in pending)}")

    def check_labels(self) -> None:
        """TF Serving's label rules, then the config's labels become the ones requests resolve (all or none).

        A label must name an available version, unless --allow_version_labels_for_unavailable_models is set and
        the label is new or keeps its version: an existing label never moves onto an unavailable version.
        Raises FAILED_PRECONDITION naming the first label that breaks them; the previous labels then stay.
        """
        with self._lock:
            labels: dict[str, dict[str, int]] = {}
            for name, entry in self._models.items():
                if not entry.in_config:
                    continue
                current = self._labels.get(name, {})
                for label, version in entry.config.version_labels.items():
                    moves = label in current and current[label] != version
                    if self.options.allow_labels_for_unavailable and not moves:
                        continue
                    record = entry.versions.get(version)
                    if record is None or record.state != State.AVAILABLE:
                        raise failed_precondition(
                            f"Request to assign label to version {version} of model {name}, which is not "
                            f"currently available for inference")
                labels[name] = dict(entry.config.version_labels)
            self._labels = labels

    def _poll_model(self, entry: ModelEntry) -> None:
        name, base_path = entry.config.name, entry.config.base_path
        try:
            found = base_paths.list_version_dirs(base_path)
        except OSError as exc:
            if entry.source_error != str(exc):
                log.error("model %s: %s", name, exc)
            entry.source_error = str(exc)
            return
        entry.source_error = "" if found else f"No versions of servable {name} found under base path {base_path}"
        wanted = aspired_versions(entry.config.model_version_policy, sorted(found))
        entry.aspired = wanted
        for version in wanted:
            record = entry.versions.get(version)
            if (record is None or record.state == State.END and record.error is None
                    or record.should_retry(self.options.max_load_retries, self.options.load_retry_interval_seconds)):
                self._load(entry, version, found[version], record.failed_attempts if record is not None else 0)
        # Availability preserving: old versions go only once a wanted one serves (a failed new version leaves
        # the old one serving).
        if any(entry.versions[v].state == State.AVAILABLE for v in wanted if v in entry.versions):
            self._unload_and_settle([(name, record) for version, record in list(entry.versions.items())
                                     if version not in wanted and record.state == State.AVAILABLE])

    # ---- load / unload -------------------------------------------------------------------------------------

    def _load(self, entry: ModelEntry, version: int, path: str, failed_attempts: int) -> None:
        """Loads from the directory's own name (00000123 stays 00000123; version 123 is only its number)."""
        name = entry.config.name
        record = VersionRecord(version=version, state=State.LOADING, failed_attempts=failed_attempts)
        with self._lock:
            entry.versions[version] = record
        try:
            servable = LoadedVersion(name, version, path, set(self.options.saved_model_tags),
                                     self.options.gpu_memory_fraction)
            if self.options.enable_model_warmup:
                count = replay_warmup(servable, self.options.warmup_iterations)
                if count:
                    log.info("model %s version %d: warmed up with %d requests", name, version, count)
            queues = self._make_queues(name, servable)
        except Exception as exc:  # noqa: BLE001 - a bad model is reported, never fatal to the server
            error = from_exception(exc)
            with self._lock:
                record.state, record.error = State.END, error
                record.failed_attempts, record.failed_at = record.failed_attempts + 1, time.monotonic()
            self.metrics.load_count.inc(path, "error")
            log.error("Loading servable {name: %s version: %d} failed (attempt %d): %s",
                      name, version, record.failed_attempts, error)
            return
        settle_heap()
        with self._lock:
            record.servable, record.queues, record.state = servable, queues, State.AVAILABLE
        self.metrics.load_count.inc(path, "ok")
        self._update_version_gauge(entry)
        log.info("Successfully loaded servable version {name: %s version: %d} from %s (%s)",
                 name, version, path, servable.limits.describe())

    def _make_queues(self, name: str, servable: LoadedVersion) -> dict[str, BatchingQueue]:
        if self._scheduler is None:
            return {}
        return {key: self._scheduler.add_queue(self.options.batching, signature.run, signature.tensor_names, name, key,
                                               self.metrics)
                for key, signature in servable.signatures.items()}

    def _unload_and_settle(self, versions: list[tuple[str, VersionRecord]]) -> None:
        """Unloads these (model name, version) records while serving, then collects what they left in reference
        cycles, once (see settle_heap; the server's shutdown unloads without it)."""
        if any([self._unload(name, record) for name, record in versions]):
            gc.unfreeze()  # the unloaded versions' objects become collectable again, cycles included
            settle_heap()

    def _unload(self, name: str, record: VersionRecord) -> bool:
        """True when the version was AVAILABLE and is now unloaded."""
        with self._lock:
            if record.state != State.AVAILABLE:
                return False
            record.state = State.UNLOADING
        record.servable.wait_idle()
        for queue in record.queues.values():
            queue.close()
            self._scheduler.remove_queue(queue)
        record.servable.release_model()
        with self._lock:
            record.state, record.servable, record.queues = State.END, None, {}
            entry = self._models.get(name)
        if entry is not None:
            self._update_version_gauge(entry)
        log.info("Unloaded servable version {name: %s version: %d}", name, record.version)
        return True

    def _update_version_gauge(self, entry: ModelEntry) -> None:
        with self._lock:
            count = sum(1 for r in entry.versions.values() if r.state == State.AVAILABLE)
        self.metrics.model_versions.labels(entry.config.name).set(count)

    def shutdown(self) -> None:
        """Unloads everything after in-flight requests end, then stops the batch threads."""
        with self._poll_lock:
            with self._lock:
                entries = list(self._models.values())
            for entry in entries:
                for record in list(entry.versions.values()):
                    self._unload(entry.config.name, record)
        if self._scheduler is not None:
            self._scheduler.stop()

    # ---- request side --------------------------------------------------------------------------------------

    def _entry(self, name: str) -> ModelEntry:
        entry = self._models.get(name)
        if entry is None or not entry.in_config:
            raise not_found(f"Servable not found for request: Latest({name})")
        return entry

    def _resolve_version(self, entry: ModelEntry, version: int | None, label: str | None) -> int | None:
        if label:
            labels = self._labels.get(entry.config.name, {})
            if label not in labels:
                raise invalid_argument(f"Unrecognized servable version label: {label}")
            return labels[label]
        return version

    @contextlib.contextmanager
    def serving(self, name: str, version: int | None = None, label: str | None = None) -> Iterator[Handle]:
        """Holds one available version for the duration of a request (it cannot unload meanwhile)."""
        handle = self.acquire(name, version, label)
        try:
            yield handle
        finally:
            handle.servable.release()

    def acquire(self, name: str, version: int | None = None, label: str | None = None) -> Handle:
        """The available version a request names, held (it cannot unload) until `handle.servable.release()`."""
        with self._lock:
            entry = self._entry(name)
            wanted = self._resolve_version(entry, version, label)
            record = None
            for candidate in entry.versions.values():
                if candidate.state != _AVAILABLE:
                    continue
                if (candidate.version == wanted) if wanted is not None else (
                        record is None or candidate.version > record.version):
                    record = candidate
            if record is None:
                if wanted is None:
                    raise not_found(f"Servable not found for request: Latest({name})")
                raise not_found(f"Servable not found for request: Specific({name}, {wanted})")
            record.servable.acquire()
            return Handle(record.servable, record.queues)

    def version_statuses(self, name: str, version: int | None = None,
                         label: str | None = None) -> list[get_model_status_pb2.ModelVersionStatus]:
        """GetModelStatus: every known version (or the one asked for) with its state and last error."""
        with self._lock:
            entry = self._models.get(name)
            if entry is None:
                raise not_found(f"Could not find any versions of model {name}")
            wanted = self._resolve_version(entry, version, label)
            records = sorted(entry.versions.values(), key=lambda r: r.version)
            if wanted is not None:
                records = [r for r in records if r.version == wanted]
                if not records:
                    raise not_found(f"Could not find version {wanted} of model {name}")
            if not records:
                raise not_found(f"Could not find any versions of model {name}"
                                + (f": {entry.source_error}" if entry.source_error else ""))
            statuses = []
            for record in records:
                status = get_model_status_pb2.ModelVersionStatus(version=record.version, state=record.state)
                status.status.SetInParent()
                if record.error is not None:
                    status.status.error_code = record.error.code.value[0]
                    status.status.error_message = record.error.message
                statuses.append(status)
            return statuses

    def model_names(self) -> list[str]:
        """The models the config lists now."""
        with self._lock:
            return sorted(name for name, entry in self._models.items() if entry.in_config)

