"""Model warmup: replay assets.extra/tf_serving_warmup_requests (TFRecord of PredictionLog) before serving."""

from __future__ import annotations

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from bertserve.model_dir import warmup_path
from bertserve.server.errors import invalid_argument
from bertserve.server.tensors import proto_to_ndarray

MAX_WARMUP_RECORDS = 1000  # TF Serving's limit


def replay_warmup(servable, iterations: int) -> int:
    """Runs every warmup Predict request `iterations` times; returns the number of records (0: no file).

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
        log_entry = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        if log_entry.WhichOneof("log_type") != "predict_log":
            raise invalid_argument(f"Unsupported log_type for warmup: {log_entry.WhichOneof('log_type')} in {path}")
        request = log_entry.predict_log.request
        signature = servable.signature(request.model_spec.signature_name)
        inputs = {name: proto_to_ndarray(name, proto) for name, proto in request.inputs.items()}
        signature.validate(inputs, list(request.output_filter))
        for _ in range(max(1, iterations)):
            signature.run(inputs)
    return count
