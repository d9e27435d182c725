"""A Classify request whose tf.Examples its model cannot parse fails alone: the requests batched with it are
answered. No check before batching can know a model's feature spec, so a failed batch of several requests runs
each again alone."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from conftest import IRIS_SEED, tf_serving_config
from tf_serving_models import IRIS_FEATURES, IrisLikeClassifier, classification_request, example

BATCH_TIMEOUT_S = 2.0  # the first request's batch stays open this long, so the second surely joins it
MEET_DELAY_S = 0.5


def test_a_malformed_example_fails_only_its_request(tf_serving_models, models_dir, tmp_path, start_server):
    config = tf_serving_config(tf_serving_models, str(tmp_path / "models.config"), models_dir)
    (tmp_path / "batching.txt").write_text(
        f"max_batch_size {{ value: 16 }} batch_timeout_micros {{ value: {int(BATCH_TIMEOUT_S * 1e6)} }} "
        "num_batch_threads { value: 1 }")
    server = start_server(f"--model_config_file={config}", "--enable_batching",
                          f"--batching_parameters_file={tmp_path}/batching.txt")
    rows = np.array([[5.1, 3.5, 1.4, 0.2], [6.0, 2.2, 4.0, 1.0]], np.float32)
    good = server.predict.Classify.future(classification_request(
        "iris", [example(**dict(zip(IRIS_FEATURES, map(float, row)))) for row in rows]), timeout=60)
    time.sleep(MEET_DELAY_S)
    with pytest.raises(grpc.RpcError) as info:
        server.predict.Classify(classification_request("iris", [example(sepal_length=1.0)]), timeout=60)
    assert not good.done() or good.exception() is None
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is required but could not be found" in info.value.details()
    scores = [[c.score for c in e.classes] for e in good.result().result.classifications]
    np.testing.assert_allclose(scores, IrisLikeClassifier(IRIS_SEED).expected(rows)[0], rtol=1e-5)
