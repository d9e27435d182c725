"""Version directories as TF Serving reads them: int64 names (leading zeros allowed) loaded from their own
directory, every other name skipped without harm to other names or models, base paths listed through
tf.io.gfile (file:// URIs as well as local paths)."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest
from tensorflow_serving.apis import get_model_status_pb2

from bertserve.server import base_paths
from tiny_models import direct_scores, predict_request, tensor, token_inputs

State = get_model_status_pb2.ModelVersionStatus.State


@pytest.mark.parametrize("name, version", [
    ("1", 1), ("0", 0), ("007", 7), ("00000123", 123), ("9223372036854775807", (1 << 63) - 1),
    ("9223372036854775808", None), ("18446744073709551616", None), ("²", None), ("١٢", None), ("１２", None),
    ("-3", None), ("+3", None), (" 3", None), ("3 ", None), ("3.0", None), ("0x10", None), ("latest", None),
    ("", None),
])
def test_only_ascii_int64_names_are_versions(name, version):
    assert base_paths.parse_version(name) == version


def test_listing_keeps_real_names_and_skips_the_rest(tmp_path):
    for name in ("00000123", "7", "007", "²", "18446744073709551616", "-1", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "9").write_text("a file is no version")
    expected = {123: f"{tmp_path}/00000123", 7: f"{tmp_path}/007"}  # "007" and "7": the first name in order
    assert base_paths.list_version_dirs(str(tmp_path)) == expected
    uri = f"file://{tmp_path}"
    assert base_paths.list_version_dirs(uri) == {123: f"{uri}/00000123", 7: f"{uri}/007"}
    with pytest.raises(OSError, match="Could not list base path"):
        base_paths.list_version_dirs(str(tmp_path / "missing"))


@pytest.mark.parametrize("path, absolute", [
    ("/models/x", True), ("file:///models/x", True), ("gs://bucket/x", True), ("s3://bucket/x", True),
    ("models/x", False), ("./x", False), ("", False), ("x:/y", False)])
def test_base_paths_must_be_absolute_or_uris(path, absolute):
    assert base_paths.is_absolute(path) is absolute


def _status(server, name):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    return {s.version: s.state for s in server.models.GetModelStatus(request, timeout=30).model_version_status}


def test_server_loads_zero_padded_versions_from_their_directories_and_skips_hostile_names(
        models_dir, tmp_path, start_server):
    """'²' (int() accepts it) and an overflowing name used to stop listing or become the latest version; a
    zero-padded name was loaded from base/123, which does not exist."""
    padded = tmp_path / "padded"
    shutil.copytree(os.path.join(models_dir, "tiny", "1"), padded / "00000123")
    for hostile in ("²", "18446744073709551616", "-5", "١٢"):
        shutil.copytree(os.path.join(models_dir, "tiny", "2"), padded / hostile)
    neighbour = tmp_path / "neighbour"
    shutil.copytree(os.path.join(models_dir, "tiny", "2"), neighbour / "0002")
    config = tmp_path / "models.config"
    config.write_text(f"""model_config_list {{
  config {{ name: "padded" base_path: "{padded}" model_platform: "tensorflow" }}
  config {{ name: "neighbour" base_path: "file://{neighbour}" model_platform: "tensorflow" }}
}}""")
    server = start_server(f"--model_config_file={config}", "--file_system_poll_wait_seconds=1")
    inputs = token_inputs(3, 8, seed=4)

    reply = server.predict.Predict(predict_request("padded", inputs), timeout=30)
    assert reply.model_spec.version.value == 123
    np.testing.assert_allclose(tensor(reply.outputs["scores"]),
                               direct_scores(os.path.join(models_dir, "tiny", "1"), inputs), atol=1e-6)
    assert server.predict.Predict(predict_request("padded", inputs, version=123), timeout=30).model_spec.version.value \
        == 123
    assert _status(server, "padded") == {123: State.AVAILABLE}
    assert f"from {padded}/00000123" in server.log()

    # The file:// base path is listed and loaded through tf.io.gfile like a local one.
    reply = server.predict.Predict(predict_request("neighbour", inputs), timeout=30)
    assert reply.model_spec.version.value == 2
    np.testing.assert_allclose(tensor(reply.outputs["scores"]),
                               direct_scores(os.path.join(models_dir, "tiny", "2"), inputs), atol=1e-6)

    # A new hostile name while serving changes nothing; a new int64 version still loads, for every model.
    shutil.copytree(os.path.join(models_dir, "tiny", "2"), padded / "9223372036854775808")
    shutil.copytree(os.path.join(models_dir, "tiny", "2"), tmp_path / "staging")
    os.rename(tmp_path / "staging", padded / "00000124")
    deadline = time.monotonic() + 60
    while _status(server, "padded").get(124) != State.AVAILABLE and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _status(server, "padded") == {123: State.END, 124: State.AVAILABLE}
    assert server.predict.Predict(predict_request("padded", inputs), timeout=30).model_spec.version.value == 124
    assert server.predict.Predict(predict_request("neighbour", inputs), timeout=30).model_spec.version.value == 2
