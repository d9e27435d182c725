"""ModelService after HandleReloadConfigRequest, as TF Serving answers: a version unloaded by a reload reports END
(not NOT_FOUND), and an existing label never moves onto an unavailable version, even with
--allow_version_labels_for_unavailable_models (new labels may name one)."""

from __future__ import annotations

import os

import grpc
import pytest
from tensorflow_serving.apis import get_model_status_pb2, model_management_pb2
from tensorflow_serving.config import model_server_config_pb2

from tiny_models import predict_request, token_inputs

State = get_model_status_pb2.ModelVersionStatus.State


def _config(models_dir: str, labels: dict[str, int], versions=(1,)) -> model_server_config_pb2.ModelServerConfig:
    config = model_server_config_pb2.ModelServerConfig()
    entry = config.model_config_list.config.add(name="tiny", base_path=os.path.join(models_dir, "tiny"))
    entry.model_version_policy.specific.versions.extend(versions)
    for label, version in labels.items():
        entry.version_labels[label] = version
    config.model_config_list.config.add(name="kept", base_path=os.path.join(models_dir, "tiny"))
    return config


def _reload(server, config) -> None:
    server.models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=120)


def _statuses(server, name: str) -> dict[int, int]:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    return {s.version: s.state for s in server.models.GetModelStatus(request, timeout=30).model_version_status}


def _labelled_version(server, label: str) -> int:
    return server.predict.Predict(predict_request("tiny", token_inputs(1, 8), label=label),
                                  timeout=30).model_spec.version.value


def test_labels_and_statuses_across_reloads(models_dir, tmp_path, start_server):
    config_file = tmp_path / "models.config"
    config_file.write_text(str(_config(models_dir, {"stable": 1})))
    server = start_server(f"--model_config_file={config_file}", "--allow_version_labels_for_unavailable_models")
    assert _labelled_version(server, "stable") == 1

    # A new label may name a version not loaded yet (the flag's purpose: label before the version arrives).
    _reload(server, _config(models_dir, {"stable": 1, "canary": 2}))
    # An existing label may not move onto a version that is not available, flag or not.
    with pytest.raises(grpc.RpcError) as info:
        _reload(server, _config(models_dir, {"stable": 2, "canary": 2}))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ("Request to assign label to version 2 of model tiny, which is not currently available for inference"
            in info.value.details())
    assert _labelled_version(server, "stable") == 1  # the refused reload left the labels as they were

    # Once version 2 serves, the label may move onto it.
    _reload(server, _config(models_dir, {"stable": 2, "canary": 2}, versions=(1, 2)))
    assert _labelled_version(server, "stable") == 2

    # Version 1 unloaded by a reload, then the whole model removed: END, not NOT_FOUND.
    _reload(server, _config(models_dir, {"stable": 2}, versions=(2,)))
    assert _statuses(server, "tiny") == {1: State.END, 2: State.AVAILABLE}
    removed = model_server_config_pb2.ModelServerConfig()
    removed.model_config_list.config.add().CopyFrom(_config(models_dir, {}).model_config_list.config[1])
    _reload(server, removed)
    assert _statuses(server, "tiny") == {1: State.END, 2: State.END}
    with pytest.raises(grpc.RpcError) as info:
        server.predict.Predict(predict_request("tiny", token_inputs(1, 8)), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert server.predict.Predict(predict_request("kept", token_inputs(1, 8)), timeout=30).model_spec.name == "kept"
