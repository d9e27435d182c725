"""`bertserve serve`: the model server's process: flags, config files, front ends, polling, graceful stop."""

from __future__ import annotations

import concurrent.futures
import importlib
import logging
import signal
import sys
import threading

from bertserve.server.process_imports import refuse_jax

refuse_jax()  # before TensorFlow, which would import it

import tensorflow as tf

from bertserve.server.batcher import requests_held
from bertserve.server.config_files import (ConfigError, read_batching_options, read_model_server_config,
                                           read_prometheus_path, single_model_config, BatchingOptions)
from bertserve.server.flags import FlagError, ServerOptions, parse_flags
from bertserve.server.front_ends import FrontEndOptions, FrontEnds
from bertserve.server.errors import ServingError
from bertserve.server.health import ServingHealth
from bertserve.server.manager import ManagerOptions, ModelManager, StartupError
from bertserve.server.metrics import ServerMetrics
from bertserve.server.predict import Predictor

log = logging.getLogger("bertserve.server")
DRAIN_GRACE_SECONDS = 30.0
# Inference RPCs in flight beyond what the batch queues hold: unbatched calls waiting for one of the gRPC threads.
UNBATCHED_WAITING_PER_THREAD = 8


def _load_custom_ops() -> None:
    """Registers bertserve's fused ops before any SavedModel loads, as a TF Serving build links them in.

    A missing op library must not stop the server: stock-op models still serve, and a fused model then fails
    to load with TensorFlow's "Op type not registered" error in its status.
    """
    try:
        custom_ops = importlib.import_module("bertserve.custom_ops")
        custom_ops.load_op_library()
    except Exception as exc:  # noqa: BLE001 - any failure is reported, not fatal
        log.warning("bertserve fused ops not loaded (%s: %s); SavedModels using them will fail to load",
                    type(exc).__name__, exc)
        return
    log.info("bertserve fused ops loaded from %s", custom_ops.library_path())


def _configure_tensorflow(options: ServerOptions) -> None:
    intra = options.tensorflow_intra_op_parallelism or options.tensorflow_session_parallelism
    inter = options.tensorflow_inter_op_parallelism or options.tensorflow_session_parallelism
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)


def _poll_forever(stop: threading.Event, every_seconds: int, action, what: str) -> threading.Thread:
    def loop() -> None:
        while not stop.wait(every_seconds):
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - a failed poll is logged and retried next time
                log.error("%s failed: %s", what, exc)
    thread = threading.Thread(target=loop, name=what, daemon=True)
    thread.start()
    return thread


class _ConfigFileWatcher:
    """--model_config_file_poll_wait_seconds: re-reads the file, applies it when its text changed."""

    def __init__(self, path: str, manager: ModelManager):
        self.path, self.manager = path, manager
        self._last = open(path, encoding="utf-8").read()

    def check(self) -> None:
        text = open(self.path, encoding="utf-8").read()
        if text == self._last:
            return
        self._last = text
        self.manager.apply_config(read_model_server_config(self.path))
        self.manager.poll()
        self.manager.check_labels()
        log.info("model config file %s reloaded", self.path)


def run(options: ServerOptions, stop: threading.Event) -> int:
    """Serves until `stop` is set, then drains in-flight requests and unloads. Returns the exit code."""
    _configure_tensorflow(options)
    _load_custom_ops()
    try:
        config = (read_model_server_config(options.model_config_file) if options.model_config_file
                  else single_model_config(options.model_name, options.model_base_path))
        batching: BatchingOptions | None = None
        if options.enable_batching:
            batching = (read_batching_options(options.batching_parameters_file) if options.batching_parameters_file
                        else BatchingOptions())
            if batching.pad_variable_length_inputs:
                log.warning("pad_variable_length_inputs pads every input with its own first element; pad on the "
                            "client to a fixed length instead (padding with real token ids changes nothing only "
                            "where the mask is 0)")
        prometheus_path = read_prometheus_path(options.monitoring_config_file) if options.monitoring_config_file \
            else None
    except ConfigError as exc:
        log.error("%s", exc)
        return 1
    metrics = ServerMetrics(batching.max_batch_size if batching else 1000)
    health = ServingHealth()
    manager = ModelManager(ManagerOptions(
        saved_model_tags=frozenset(t.strip() for t in options.saved_model_tags.split(",") if t.strip()),
        enable_model_warmup=options.enable_model_warmup,
        warmup_iterations=options.num_request_iterations_for_warmup,
        allow_labels_for_unavailable=options.allow_version_labels_for_unavailable_models,
        batching=batching, max_load_retries=options.max_num_load_retries,
        load_retry_interval_seconds=max(0.0, options.load_retry_interval_micros / 1e6),
        gpu_memory_fraction=options.per_process_gpu_memory_fraction), metrics,
        on_batch_failure=health.batch_scheduler_failed)
    # As tensorflow_model_server: start only once every configured model serves; a model that cannot load (or
    # a label that cannot apply) ends the process rather than leaving it up without that model.
    try:
        manager.apply_config(config)
        manager.load_startup_models(stop)
        manager.check_labels()
    except (StartupError, ServingError, ConfigError) as exc:
        log.error("%s", exc)
        manager.shutdown()
        return 1
    grpc_threads = options.effective_grpc_threads(batching.max_batch_size if batching else 0)
    blocking_threads = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(grpc_threads, options.effective_rest_threads()), thread_name_prefix="blocking")
    predictor = Predictor(manager, metrics, blocking_threads,
                          tensor_content=options.enable_serialization_as_tensor_content)
    failures: list[str] = []  # why the front ends could not go on (the server then exits non-zero)
    front_ends = FrontEnds(FrontEndOptions(
        grpc_port=options.port, rest_port=options.rest_api_port,
        max_in_flight=UNBATCHED_WAITING_PER_THREAD * grpc_threads + (requests_held(batching) if batching else 0),
        rest_slots=options.effective_rest_threads(), rest_timeout_seconds=options.rest_api_timeout_in_ms / 1000.0,
        prometheus_path=prometheus_path, drain_grace_seconds=DRAIN_GRACE_SECONDS,
        grpc_socket_path=options.grpc_socket_path, grpc_processes=options.grpc_front_end_processes), predictor,
        on_failure=lambda reason: (failures.append(reason), stop.set()))
    try:
        front_ends.start()
    except OSError as exc:
        log.error("%s", exc)
        manager.shutdown()
        return 1
    health.start_serving(front_ends)
    if options.file_system_poll_wait_seconds > 0:
        _poll_forever(stop, options.file_system_poll_wait_seconds, manager.poll, "file system poll")
    if options.model_config_file and options.model_config_file_poll_wait_seconds > 0:
        watcher = _ConfigFileWatcher(options.model_config_file, manager)
        _poll_forever(stop, options.model_config_file_poll_wait_seconds, watcher.check, "model config poll")
    while not stop.wait(0.5):
        pass
    log.info("stopping: draining in-flight requests")
    front_ends.stop()
    manager.shutdown()
    blocking_threads.shutdown()
    if failures:
        log.error("stopped: %s", failures[0])
        return 1
    log.info("stopped")
    return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        options, ignored = parse_flags(argv)
    except FlagError as exc:
        log.error("%s", exc)
        return 2
    except SystemExit as exc:  # argparse already printed the usage error
        return int(exc.code or 0)
    if ignored:
        log.warning("accepted for tensorflow_model_server compatibility, no effect here: %s", " ".join(ignored))
    if options.gil_switch_interval_micros:
        # A batch thread back from the session waits for the interpreter lock while the event loop runs requests;
        # Python makes it wait up to the switch interval, which then bounds each batch's turnaround.
        sys.setswitchinterval(options.gil_switch_interval_micros / 1e6)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    return run(options, stop)
