"""tensorflow_model_server's command line: same flag names, defaults and `--flag` / `--flag=true|false` syntax."""

from __future__ import annotations

import argparse
import dataclasses
import os


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    port: int = 8500
    grpc_socket_path: str = ""
    rest_api_port: int = 0
    rest_api_num_threads: int = 0
    rest_api_timeout_in_ms: int = 30000
    model_name: str = "default"
    model_base_path: str = ""
    model_config_file: str = ""
    model_config_file_poll_wait_seconds: int = 0
    file_system_poll_wait_seconds: int = 1
    enable_batching: bool = False
    batching_parameters_file: str = ""
    monitoring_config_file: str = ""
    enable_model_warmup: bool = True
    num_request_iterations_for_warmup: int = 1
    allow_version_labels_for_unavailable_models: bool = False
    saved_model_tags: str = "serve"
    grpc_max_threads: int = 0
    tensorflow_session_parallelism: int = 0
    tensorflow_intra_op_parallelism: int = 0
    tensorflow_inter_op_parallelism: int = 0
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60 * 1000 * 1000
    prefer_tflite_model: bool = False
    enable_serialization_as_tensor_content: bool = False
    per_process_gpu_memory_fraction: float = 0.0
    grpc_front_end_processes: int = 1  # bertserve's own flag (serving_config/README.md)
    gil_switch_interval_micros: int = 0  # bertserve's own flag (serving_config/README.md)

    def effective_grpc_threads(self, max_batch_size: int) -> int:
        """TF Serving's default is 4 x CPUs; its handlers are asynchronous. Here a handler thread waits while its
        request is queued, so a full batch needs that many threads: the default also covers 2 x max_batch_size
        (the client concurrency TF Serving's batching guide recommends)."""
        if self.grpc_max_threads > 0:
            return self.grpc_max_threads
        return max(4 * (os.cpu_count() or 1), 2 * max_batch_size)

    def effective_rest_threads(self) -> int:
        """TF Serving's default: 4 x CPUs."""
        return self.rest_api_num_threads if self.rest_api_num_threads > 0 else 4 * (os.cpu_count() or 1)


_HELP = {
    "port": "TCP port for the gRPC API (0 disables it)",
    "grpc_socket_path": "also serve the gRPC API on this UNIX socket (empty: no socket)",
    "rest_api_port": "TCP port for the HTTP/REST API (0 disables it); must differ from --port",
    "rest_api_num_threads": "threads for the HTTP/REST API (0: auto)",
    "rest_api_timeout_in_ms": "timeout for HTTP/REST API calls",
    "model_name": "name of the model (ignored if --model_config_file is set)",
    "model_base_path": "path holding numbered version directories (ignored if --model_config_file is set)",
    "model_config_file": "ascii ModelServerConfig protobuf naming the models to serve",
    "model_config_file_poll_wait_seconds": "seconds between re-reads of --model_config_file (0: read once)",
    "file_system_poll_wait_seconds": "seconds between polls of base paths for new versions (0: poll once)",
    "enable_batching": "batch requests on the server",
    "batching_parameters_file": "ascii BatchingParameters protobuf (requires --enable_batching)",
    "monitoring_config_file": "ascii MonitoringConfig protobuf (Prometheus endpoint on the REST port)",
    "enable_model_warmup": "replay assets.extra/tf_serving_warmup_requests before a version takes traffic",
    "num_request_iterations_for_warmup": "times each warmup request is replayed",
    "allow_version_labels_for_unavailable_models": "allow labels naming versions that are not loaded yet",
    "saved_model_tags": "comma-separated MetaGraphDef tags to load",
    "grpc_max_threads": "gRPC server threads (0: the larger of 4 x CPUs and 2 x max_batch_size)",
    "tensorflow_session_parallelism": "TensorFlow threads for both pools (0: auto)",
    "tensorflow_intra_op_parallelism": "threads inside one op (0: auto)",
    "tensorflow_inter_op_parallelism": "ops run at once (0: auto)",
    "max_num_load_retries": "retries after a failed load of a version",
    "load_retry_interval_micros": "wait between load retries",
    "prefer_tflite_model": "load model.tflite instead of the SavedModel (not supported here: only false)",
    "enable_serialization_as_tensor_content": "Predict outputs in tensor_content instead of the typed fields "
                                              "(float_val, ...)",
    "per_process_gpu_memory_fraction": "fraction of each GPU's memory this process allocates, between 0.0 and "
                                       "1.0 (0.0: TensorFlow's default)",
    "grpc_front_end_processes": "not in tensorflow_model_server: processes that terminate gRPC on --port and "
                                "forward the calls to this one (1: gRPC in this process)",
    "gil_switch_interval_micros": "not in tensorflow_model_server: how long a thread may hold Python's interpreter "
                                  "lock while another waits (0: Python's default, 5000)",
}


# tensorflow_model_server tuning flags with no counterpart here: accepted (so a deployment's command line keeps
# working) and reported by a warning. Flags that change security or the API (TLS, platforms) are not in this
# list and are refused as unknown.
TUNING_FLAGS_WITHOUT_EFFECT = (
    "grpc_channel_arguments", "flush_filesystem_caches", "num_load_threads", "num_unload_threads",
    "remove_unused_fields_from_bundle_metagraph", "xla_cpu_compilation_enabled",
    "enable_per_model_batching_parameters",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertserve serve", allow_abbrev=False,
                                     description="TF-Serving-compatible model server (tensorflow_model_server flags)")
    for name in TUNING_FLAGS_WITHOUT_EFFECT:
        parser.add_argument(f"--{name}", nargs="?", const="true", default=None,
                            help="accepted for tensorflow_model_server compatibility; no effect here")
    for field in dataclasses.fields(ServerOptions):
        flag = f"--{field.name}"
        if field.type == "bool":
            parser.add_argument(flag, type=_parse_bool, nargs="?", const=True, default=field.default,
                                metavar="true|false", help=_HELP[field.name])
        else:
            kind = {"int": int, "float": float}.get(field.type, str)
            parser.add_argument(flag, type=kind, default=field.default, help=_HELP[field.name])
    return parser


class FlagError(ValueError):
    """A flag combination tensorflow_model_server refuses."""


def parse_flags(argv: list[str]) -> tuple[ServerOptions, list[str]]:
    """Parses argv into options and the tuning flags that were given but have no effect here.

    Raises FlagError for combinations TF Serving rejects (it exits non-zero too)."""
    values = vars(build_parser().parse_args(argv))
    ignored = [f"--{name}" for name in TUNING_FLAGS_WITHOUT_EFFECT if values.pop(name) is not None]
    options = ServerOptions(**values)
    if options.batching_parameters_file and not options.enable_batching:
        raise FlagError("--batching_parameters_file requires --enable_batching (as in tensorflow_model_server)")
    if not options.model_config_file and not options.model_base_path:
        raise FlagError("Both server_options.model_base_path and server_options.model_config_file are empty!")
    if options.port == 0 and options.rest_api_port == 0 and not options.grpc_socket_path:
        raise FlagError("at least one of --port, --grpc_socket_path and --rest_api_port must be set")
    if options.prefer_tflite_model:
        raise FlagError("--prefer_tflite_model=true is not supported: this server loads SavedModels only "
                        "(TensorFlow Lite models need a tensorflow_model_server build with TFLite)")
    if not 0.0 <= options.per_process_gpu_memory_fraction <= 1.0:
        raise FlagError(f"--per_process_gpu_memory_fraction must be between 0.0 and 1.0, got "
                        f"{options.per_process_gpu_memory_fraction}")
    if options.grpc_front_end_processes < 1:
        raise FlagError(f"--grpc_front_end_processes must be at least 1, got {options.grpc_front_end_processes}")
    if options.gil_switch_interval_micros < 0:
        raise FlagError(f"--gil_switch_interval_micros must be 0 (Python's default) or more, got "
                        f"{options.gil_switch_interval_micros}")
    if options.grpc_front_end_processes > 1 and options.port == 0:
        raise FlagError("--grpc_front_end_processes above 1 needs --port: the processes share a TCP port (a UNIX "
                        "socket cannot be shared; the first of them also serves --grpc_socket_path)")
    if options.rest_api_port and options.rest_api_port == options.port:
        raise FlagError("--rest_api_port must differ from --port")
    return options, ignored
