"""The Predict path shared by gRPC, REST and warmup: resolve version, validate, batch (or run), filter outputs."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from bertserve.server.batcher import wait_for
from bertserve.server.errors import ServingError, from_exception
from bertserve.server.manager import ModelManager
from bertserve.server.metrics import ServerMetrics
from bertserve.server.servable import Signature


@dataclasses.dataclass(frozen=True)
class PredictResult:
    model_name: str
    version: int
    signature_name: str
    outputs: dict[str, np.ndarray]


class Predictor:
    def __init__(self, manager: ModelManager, metrics: ServerMetrics):
        self.manager, self.metrics = manager, metrics

    def predict(self, *, model_name: str, version: int | None, label: str | None, signature_name: str,
                inputs_of: Callable[[Signature], dict[str, np.ndarray]], output_filter: list[str], deadline: float | None,
                entrypoint: str) -> PredictResult:
        """`inputs_of(signature)` decodes the request for that signature (protos or JSON); errors are statuses."""
        started = time.monotonic()
        status = "OK"
        try:
            with self.manager.serving(model_name, version, label) as handle:
                signature = handle.servable.signature(signature_name)
                inputs = inputs_of(signature)
                rows = signature.validate(inputs, output_filter)
                queue = handle.queues.get(signature.key)
                if queue is None or rows == 0:
                    outputs = signature.run(inputs)
                else:
                    outputs = wait_for(queue.submit(inputs, rows, deadline), deadline)
                if output_filter:
                    outputs = {name: outputs[name] for name in output_filter}
                return PredictResult(model_name, handle.servable.version, signature.key, outputs)
        except ServingError as exc:
            status = exc.code_name
            raise
        except Exception as exc:  # noqa: BLE001 - anything unexpected is INTERNAL, never a crash
            error = from_exception(exc)
            status = error.code_name
            raise error from exc
        finally:
            self.metrics.request_done(model_name, "predict", entrypoint, status, time.monotonic() - started)
