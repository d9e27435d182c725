"""Model warmup: replay assets.extra/tf_serving_warmup_requests (TFRecord of PredictionLog) before serving.

Every log type TF Serving replays (Predict, Classify, Regress, MultiInference) runs through the version's own
Session callables, the path its requests will take, with the same checks.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from bertserve.model_dir import warmup_path
from bertserve.server.errors import invalid_argument
from bertserve.server.inference import (MultiInferencePlan, classification_result, classification_signature,
                                        example_feed, regression_result, regression_signature)
from bertserve.server.servable import LoadedVersion
from bertserve.server.tensors import decode_inputs

MAX_WARMUP_RECORDS = 1000  # TF Serving's limit


def _replay(servable: LoadedVersion, entry: prediction_log_pb2.PredictionLog) -> None:
    kind = entry.WhichOneof("log_type")
    if kind == "predict_log":
        request = entry.predict_log.request
        signature = servable.signature(request.model_spec.signature_name)
        signature.check_output_filter(list(request.output_filter))
        inputs = signature.complete(decode_inputs(signature, request.inputs))
        signature.check_inputs(inputs)
        signature.run(inputs)
    elif kind in ("classify_log", "regress_log"):
        request = getattr(entry, kind).request
        select, result = ((classification_signature, classification_result) if kind == "classify_log"
                          else (regression_signature, regression_result))
        signature = select(servable, request.model_spec.signature_name)
        feed = example_feed(signature, request.input)
        result(signature.run(feed), len(next(iter(feed.values()))))
    elif kind == "multi_inference_log":
        request = entry.multi_inference_log.request
        MultiInferencePlan(servable, request).run(request.input)
    else:
        raise invalid_argument(f"Unsupported log_type for warmup: {kind}")


def replay_warmup(servable: LoadedVersion, iterations: int) -> int:
    """Runs every warmup request `iterations` times; returns the number of records (0: no file).

    A malformed record fails the load, as in TF Serving: a version that cannot answer its own warmup requests
    must not take traffic.
    """
    path = warmup_path(servable.path)
    if not tf.io.gfile.exists(path):
        return 0
    count = 0
    for record in tf.data.TFRecordDataset(path):
        count += 1
        if count > MAX_WARMUP_RECORDS:
            raise invalid_argument(f"Number of warmup records exceeds the maximum ({MAX_WARMUP_RECORDS}) at {path}")
        entry = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        for _ in range(max(1, iterations)):
            _replay(servable, entry)
    return count
