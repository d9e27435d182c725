"""Flags and config files parse exactly as tensorflow_model_server's, with TF Serving's defaults and checks."""

from __future__ import annotations

import os

import pytest
from tensorflow.python.eager import context
from google.protobuf import text_format

from bertserve.server.config_files import (DEFAULT_PROMETHEUS_PATH, ConfigError, batching_options_from_proto,
                                           read_batching_options, read_model_server_config, read_prometheus_path)
from bertserve.server.flags import FlagError, parse_flags
from bertserve.server import batching_parameters_pb2, monitoring_config_pb2
from serving_harness import REPO_ROOT

def parse_flags_only(argv: list[str]):
    return parse_flags(argv)[0]


def test_flag_defaults_match_tensorflow_model_server():
    options = parse_flags_only(["--model_base_path=/models/x"])
    assert (options.port, options.rest_api_port, options.model_name) == (8500, 0, "default")
    assert options.file_system_poll_wait_seconds == 1 and options.model_config_file_poll_wait_seconds == 0
    assert options.enable_batching is False and options.enable_model_warmup is True


@pytest.mark.parametrize("spelling, expected", [
    (["--enable_batching"], True), (["--enable_batching=true"], True), (["--enable_batching=false"], False),
    (["--enable_batching=1"], True), (["--enable_batching=False"], False)])
def test_boolean_flag_spellings(spelling, expected):
    assert parse_flags_only(["--model_base_path=/m", *spelling]).enable_batching is expected


def test_batching_parameters_file_requires_enable_batching():
    with pytest.raises(FlagError, match="--enable_batching"):
        parse_flags_only(["--model_base_path=/m", "--batching_parameters_file=/b.txt"])
    assert parse_flags_only(["--model_base_path=/m", "--enable_batching", "--batching_parameters_file=/b.txt"])


def test_a_model_source_is_required():
    with pytest.raises(FlagError, match="model_base_path"):
        parse_flags_only(["--port=9000"])


def test_unknown_flag_is_refused():
    with pytest.raises(SystemExit):
        parse_flags_only(["--model_base_path=/m", "--no_such_flag=1"])
    with pytest.raises(SystemExit):  # TLS must not be silently dropped
        parse_flags_only(["--model_base_path=/m", "--ssl_config_file=/ssl.txt"])


def test_tuning_flags_without_effect_are_accepted_and_reported():
    options, ignored = parse_flags(["--model_base_path=/m", "--num_load_threads=4", "--flush_filesystem_caches",
                                    "--grpc_channel_arguments=grpc.max_connection_age_ms=2000"])
    assert options.model_base_path == "/m"
    assert ignored == ["--grpc_channel_arguments", "--flush_filesystem_caches", "--num_load_threads"]


def test_batching_proto_keeps_upstream_field_numbers_and_wrappers():
    fields = {f.name: (f.number, f.message_type.full_name if f.message_type else f.type)
              for f in batching_parameters_pb2.BatchingParameters.DESCRIPTOR.fields}
    assert fields == {
        "max_batch_size": (1, "google.protobuf.Int64Value"),
        "batch_timeout_micros": (2, "google.protobuf.Int64Value"),
        "max_enqueued_batches": (3, "google.protobuf.Int64Value"),
        "num_batch_threads": (4, "google.protobuf.Int64Value"),
        "thread_pool_name": (5, "google.protobuf.StringValue"),
        "allowed_batch_sizes": (6, 3),  # repeated int64
        "pad_variable_length_inputs": (7, 8),  # bool
        "enable_large_batch_splitting": (8, "google.protobuf.BoolValue"),
        "max_execution_batch_size": (9, "google.protobuf.Int64Value"),
    }
    assert batching_parameters_pb2.BatchingParameters.DESCRIPTOR.full_name == "tensorflow.serving.BatchingParameters"
    monitoring = monitoring_config_pb2.MonitoringConfig.DESCRIPTOR
    assert monitoring.fields_by_name["prometheus_config"].number == 1
    prometheus = monitoring_config_pb2.PrometheusConfig.DESCRIPTOR
    assert (prometheus.fields_by_name["enable"].number, prometheus.fields_by_name["path"].number) == (1, 2)


def _options(text: str):
    return batching_options_from_proto(text_format.Parse(text, batching_parameters_pb2.BatchingParameters()))


def test_unset_batching_fields_take_tf_serving_defaults():
    options = _options("")
    assert (options.max_batch_size, options.batch_timeout_micros, options.max_enqueued_batches) == (1000, 0, 10)
    assert options.num_batch_threads == (os.cpu_count() or 1)
    assert options.allowed_batch_sizes == () and not options.pad_variable_length_inputs
    assert not options.enable_large_batch_splitting and options.execution_limit == 1000
    split = _options("max_batch_size { value: 64 } enable_large_batch_splitting { value: true }")
    assert split.max_execution_batch_size == 64  # upstream: defaults to max_batch_size


@pytest.mark.parametrize("text, message", [
    ("max_batch_size { value: 32 } allowed_batch_sizes: 8 allowed_batch_sizes: 4 allowed_batch_sizes: 32",
     "monotonically increasing"),
    ("max_batch_size { value: 32 } allowed_batch_sizes: 8 allowed_batch_sizes: 16", "must equal max_batch_size"),
    ("max_batch_size { value: 64 } enable_large_batch_splitting { value: true } max_execution_batch_size "
     "{ value: 16 } allowed_batch_sizes: 8 allowed_batch_sizes: 64", "must equal max_execution_batch_size"),
    ("num_batch_threads { value: 0 }", "num_batch_threads must be positive"),
    ("batch_timeout_micros { value: -5 }", "batch_timeout_micros"),
])
def test_batching_load_time_checks(text, message):
    with pytest.raises(ConfigError, match=message):
        _options(text)


def test_committed_serving_config_files_parse():
    config_dir = os.path.join(REPO_ROOT, "serving_config")
    options = read_batching_options(os.path.join(config_dir, "batching_parameters.txt"))
    assert options.allowed_batch_sizes[-1] == options.execution_limit
    assert read_prometheus_path(os.path.join(config_dir, "monitoring.config")) == DEFAULT_PROMETHEUS_PATH
    config = read_model_server_config(os.path.join(config_dir, "models.config"))
    assert [m.name for m in config.model_config_list.config]


def test_bad_config_files_name_the_problem(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("max_batch_size: 7")  # a wrapper field written as a scalar
    with pytest.raises(ConfigError, match="Invalid protobuf file"):
        read_batching_options(str(bad))
    duplicate = tmp_path / "models.config"
    duplicate.write_text('model_config_list { config { name: "a" base_path: "/x" } config { name: "a" base_path: "/y" } }')
    with pytest.raises(ConfigError, match="multiple times"):
        read_model_server_config(str(duplicate))


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan"])
def test_gpu_memory_fraction_outside_zero_to_one_is_refused(value):
    with pytest.raises(FlagError, match="per_process_gpu_memory_fraction"):
        parse_flags_only(["--model_base_path=/m", f"--per_process_gpu_memory_fraction={value}"])


def test_gil_switch_interval_is_zero_for_pythons_default_or_a_positive_number():
    assert parse_flags_only(["--model_base_path=/m"]).gil_switch_interval_micros == 0
    assert parse_flags_only(["--model_base_path=/m", "--gil_switch_interval_micros=250"]
                            ).gil_switch_interval_micros == 250
    with pytest.raises(FlagError, match="gil_switch_interval_micros must be 0"):
        parse_flags_only(["--model_base_path=/m", "--gil_switch_interval_micros=-1"])


def test_gpu_memory_fraction_reaches_every_session_with_the_process_settings(models_dir):
    """TF Serving puts the fraction in each session's config; the thread settings stay those of the process."""
    from bertserve.server.servable import LoadedVersion

    assert parse_flags_only(["--model_base_path=/m", "--per_process_gpu_memory_fraction=0.25"]
                            ).per_process_gpu_memory_fraction == 0.25
    version = LoadedVersion("tiny", 1, os.path.join(models_dir, "tiny", "1"), {"serve"}, gpu_memory_fraction=0.25)
    try:
        config = version.bundle.session._config  # what the C++ session was created with
        assert config.gpu_options.per_process_gpu_memory_fraction == pytest.approx(0.25)
        process = context.context().config  # what a Session without a config would have taken
        process.gpu_options.per_process_gpu_memory_fraction = config.gpu_options.per_process_gpu_memory_fraction
        assert config == process
        assert version.signatures["serving_default"] is not None
    finally:
        version.release_model()
