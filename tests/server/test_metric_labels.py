"""Metric labels come from the config, never from requests: invented model names cannot grow the metrics page."""

from __future__ import annotations

import grpc
import requests

from bertserve.server.metrics import UNKNOWN_MODEL_LABEL
from serving_harness import METRICS_PATH, metric_total
from tiny_models import predict_request, token_inputs

UNKNOWN_REQUESTS = 2000
CONCURRENT = 20


def test_unknown_model_names_share_one_label(models_dir, tmp_path, start_server):
    (tmp_path / "monitoring.config").write_text(f'prometheus_config {{ enable: true path: "{METRICS_PATH}" }}')
    server = start_server(f"--model_base_path={models_dir}/tiny", "--model_name=tiny",
                          f"--monitoring_config_file={tmp_path / 'monitoring.config'}")
    server.predict.Predict(predict_request("tiny", token_inputs(1, 8)), timeout=30)
    inputs = token_inputs(1, 4)
    codes, sizes = set(), []
    for start in range(0, UNKNOWN_REQUESTS, CONCURRENT):
        calls = [server.predict.Predict.future(predict_request(f"no-such-model-{i:05d}", inputs), timeout=60)
                 for i in range(start, start + CONCURRENT)]
        for call in calls:
            try:
                call.result()
            except grpc.RpcError as exc:
                codes.add(exc.code())
        reply = requests.post(f"{server.rest}/v1/models/rest-unknown-{start}:predict",  # names in the URL
                              json={"instances": [{"input_ids": [1], "input_mask": [1], "segment_ids": [0]}]},
                              timeout=30)
        assert reply.status_code == 404
        if start == 0:
            sizes.append(len(server.metrics_text()))
    assert codes == {grpc.StatusCode.NOT_FOUND}
    text = server.metrics_text()
    assert "no-such-model" not in text and "rest-unknown" not in text
    rest_requests = UNKNOWN_REQUESTS // CONCURRENT
    assert metric_total(text, ":tensorflow:serving:request_count", model_name=UNKNOWN_MODEL_LABEL,
                        status="NOT_FOUND") == UNKNOWN_REQUESTS + rest_requests
    assert metric_total(text, ":tensorflow:serving:request_count", model_name="tiny", status="OK") == 1
    # After the first unknown names the page only changes its counts: no growth per invented name.
    assert len(text) < sizes[0] + 200
