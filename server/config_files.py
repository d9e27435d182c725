"""The text-format config files tensorflow_model_server takes, parsed as the real protos, with TF Serving defaults."""

from __future__ import annotations

import dataclasses
import os

from google.protobuf import message, text_format
from tensorflow_serving.config import model_server_config_pb2

from bertserve.server import base_paths, batching_parameters_pb2, monitoring_config_pb2

DEFAULT_PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
# A batch timeout above an hour is a unit mistake (the field is microseconds) and would hold every batch past any
# request's deadline; a batch thread pool above this many threads is a typo, each being an OS thread started at once.
MAX_BATCH_TIMEOUT_MICROS = 3600 * 1000 * 1000
MAX_BATCH_THREADS = 1024


class ConfigError(ValueError):
    """A config file that cannot be read or breaks one of TF Serving's load-time checks."""


def parse_text_proto(path: str, proto: message.Message) -> message.Message:
    try:
        with open(path, encoding="utf-8") as handle:
            return text_format.Parse(handle.read(), proto)
    except (OSError, text_format.ParseError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Invalid protobuf file: '{path}': {exc}") from exc


def read_model_server_config(path: str) -> model_server_config_pb2.ModelServerConfig:
    """The --model_config_file; an empty file means no models yet (HandleReloadConfigRequest adds them)."""
    config = parse_text_proto(path, model_server_config_pb2.ModelServerConfig())
    if config.WhichOneof("config") is None:
        config.model_config_list.SetInParent()
    check_model_server_config(config)
    return config


def single_model_config(name: str, base_path: str) -> model_server_config_pb2.ModelServerConfig:
    """What --model_name/--model_base_path mean: a one-entry model_config_list."""
    config = model_server_config_pb2.ModelServerConfig()
    entry = config.model_config_list.config.add()
    entry.name, entry.base_path, entry.model_platform = name, base_path, "tensorflow"
    return config


def check_model_server_config(config: model_server_config_pb2.ModelServerConfig) -> None:
    """TF Serving's ServerCore checks, with its messages: a model_config_list, unique names, absolute base paths
    (or URIs), and a platform given one way only (model_platform, or the deprecated model_type)."""
    if config.WhichOneof("config") not in (None, "model_config_list"):
        raise ConfigError("only model_config_list is supported (custom_model_config is not)")
    seen: set[str] = set()
    for entry in config.model_config_list.config:
        if not entry.name:
            raise ConfigError("a model config has an empty name")
        if entry.name in seen:
            raise ConfigError(f"Illegal to list model {entry.name} multiple times in config list")
        seen.add(entry.name)
        if not base_paths.is_absolute(entry.base_path):
            raise ConfigError(f"Expected model {entry.name} to have an absolute path or URI; "
                              f"found: {entry.base_path!r}")
        if entry.model_type != model_server_config_pb2.MODEL_TYPE_UNSPECIFIED:
            if entry.model_platform:
                raise ConfigError(f"model {entry.name}: Illegal setting both ModelServerConfig::model_type "
                                  f"(deprecated) and ModelServerConfig::model_platform.")
            if entry.model_type != model_server_config_pb2.TENSORFLOW:
                raise ConfigError(f"model {entry.name}: ModelServerConfig::model_type choice "
                                  f"{model_server_config_pb2.ModelType.Name(entry.model_type)} not supported.")
        elif entry.model_platform not in ("", "tensorflow"):
            raise ConfigError(f"model {entry.name}: unsupported model_platform {entry.model_platform!r}")


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """BatchingParameters with every unset field replaced by TF Serving's default."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    thread_pool_name: str = "model_server_batch_threads"
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int = 1000

    @property
    def execution_limit(self) -> int:
        """Largest batch ever run: max_execution_batch_size when splitting, else max_batch_size."""
        return self.max_execution_batch_size if self.enable_large_batch_splitting else self.max_batch_size


def batching_options_from_proto(params: batching_parameters_pb2.BatchingParameters) -> BatchingOptions:
    """Applies TF Serving's defaults and load-time checks (allowed_batch_sizes increasing, last == limit)."""
    defaults = BatchingOptions()
    max_batch_size = params.max_batch_size.value if params.HasField("max_batch_size") else defaults.max_batch_size
    splitting = params.HasField("enable_large_batch_splitting") and params.enable_large_batch_splitting.value
    options = BatchingOptions(
        max_batch_size=max_batch_size,
        batch_timeout_micros=(params.batch_timeout_micros.value if params.HasField("batch_timeout_micros")
                              else defaults.batch_timeout_micros),
        max_enqueued_batches=(params.max_enqueued_batches.value if params.HasField("max_enqueued_batches")
                              else defaults.max_enqueued_batches),
        num_batch_threads=(params.num_batch_threads.value if params.HasField("num_batch_threads")
                           else defaults.num_batch_threads),
        thread_pool_name=(params.thread_pool_name.value if params.HasField("thread_pool_name")
                          else defaults.thread_pool_name),
        allowed_batch_sizes=tuple(params.allowed_batch_sizes),
        pad_variable_length_inputs=params.pad_variable_length_inputs,
        enable_large_batch_splitting=splitting,
        # Upstream: with splitting and no max_execution_batch_size, batches execute at max_batch_size.
        max_execution_batch_size=(params.max_execution_batch_size.value
                                  if params.HasField("max_execution_batch_size") else max_batch_size),
    )
    check_batching_options(options)
    return options


def check_batching_options(options: BatchingOptions) -> None:
    """TF Serving's checks (SharedBatchScheduler, BatchingSession) with its messages, plus upper bounds on what
    would otherwise start a thread per unit or wait past any deadline: a file failing them stops the server at
    start, so no batch thread can be started with values it cannot run."""
    for name in ("max_batch_size", "num_batch_threads", "max_enqueued_batches", "max_execution_batch_size"):
        if getattr(options, name) < 1:
            raise ConfigError(f"BatchingParameters.{name} must be positive; was {getattr(options, name)}")
    if not 0 <= options.batch_timeout_micros <= MAX_BATCH_TIMEOUT_MICROS:
        raise ConfigError(f"BatchingParameters.batch_timeout_micros must be non-negative and at most "
                          f"{MAX_BATCH_TIMEOUT_MICROS} (an hour); was {options.batch_timeout_micros}")
    if options.num_batch_threads > MAX_BATCH_THREADS:
        raise ConfigError(f"BatchingParameters.num_batch_threads must be at most {MAX_BATCH_THREADS}; "
                          f"was {options.num_batch_threads}")
    if options.enable_large_batch_splitting and options.max_execution_batch_size > options.max_batch_size:
        raise ConfigError(f"When enable_large_batch_splitting is true, max_batch_size ({options.max_batch_size}) "
                          f"must be greater than or equal to max_execution_batch_size "
                          f"({options.max_execution_batch_size})")
    sizes = options.allowed_batch_sizes
    if sizes:
        if any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] < 1:
            raise ConfigError(f"allowed_batch_sizes entries must be positive and monotonically increasing: "
                              f"{list(sizes)}")
        limit_name = "max_execution_batch_size" if options.enable_large_batch_splitting else "max_batch_size"
        if sizes[-1] != options.execution_limit:
            raise ConfigError(f"final entry in allowed_batch_sizes ({sizes[-1]}) must equal {limit_name} "
                              f"({options.execution_limit})")


def read_batching_options(path: str) -> BatchingOptions:
    return batching_options_from_proto(parse_text_proto(path, batching_parameters_pb2.BatchingParameters()))


def read_prometheus_path(path: str) -> str | None:
    """The Prometheus endpoint path if the MonitoringConfig enables it, else None."""
    config = parse_text_proto(path, monitoring_config_pb2.MonitoringConfig())
    if not config.prometheus_config.enable:
        return None
    return config.prometheus_config.path or DEFAULT_PROMETHEUS_PATH
