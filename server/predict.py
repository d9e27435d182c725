"""The signature path shared by Predict, Classify and Regress over gRPC and REST: resolve version, decode and
check inputs, batch (or run), filter outputs; and Predict's response encoding.

A coroutine on the front ends' event loop: a batched request waits in its queue without holding a thread, an
unbatched one runs the model on `blocking_threads`, so the loop stays free for other requests and health probes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from typing import Callable, Iterator, NamedTuple

import numpy as np
from tensorflow_serving.apis import predict_pb2

from bertserve.server.batcher import wait_async
from bertserve.server.errors import ServingError, from_exception
from bertserve.server.manager import ModelManager
from bertserve.server.metrics import ServerMetrics
from bertserve.server.servable import LoadedVersion, Signature, batch_rows
from bertserve.server.tensors import fill_tensor_proto


class PredictResult(NamedTuple):  # a tuple: built once per request, cheaper than a frozen dataclass
    model_name: str
    version: int
    signature_name: str
    outputs: dict[str, np.ndarray]


class Predictor:
    def __init__(self, manager: ModelManager, metrics: ServerMetrics,
                 blocking_threads: concurrent.futures.ThreadPoolExecutor, tensor_content: bool = False):
        """tensor_content: --enable_serialization_as_tensor_content (Predict outputs as tensor_content, not the
        typed fields)."""
        self.manager, self.metrics, self.blocking_threads = manager, metrics, blocking_threads
        self.tensor_content = tensor_content

    @contextlib.contextmanager
    def recorded(self, model_name: str, api: str, entrypoint: str) -> Iterator[None]:
        """Counts one request in TF Serving's metrics under its final status; anything unexpected is INTERNAL."""
        started = time.monotonic()
        status = "OK"
        try:
            yield
        except ServingError as exc:
            status = exc.code_name
            raise
        except asyncio.CancelledError:  # the client went away or its deadline passed
            status = "CANCELLED"
            raise
        except Exception as exc:  # noqa: BLE001 - anything unexpected is INTERNAL, never a crash
            error = from_exception(exc)
            status = error.code_name
            raise error from exc
        finally:
            self.metrics.request_done(model_name, api, entrypoint, status, time.monotonic() - started)

    async def predict(self, *, model_name: str, version: int | None, label: str | None, signature_name: str,
                      inputs_of: Callable[[Signature], dict[str, np.ndarray]], output_filter: list[str],
                      deadline: float | None, entrypoint: str, api: str = "predict",
                      select_signature: Callable[[LoadedVersion, str], Signature] = LoadedVersion.signature
                      ) -> PredictResult:
        """`select_signature` finds the signature (Classify and Regress check theirs by their own rules) and
        `inputs_of(signature)` decodes the request for it (protos, JSON or tf.Examples); errors are statuses."""
        with self.recorded(model_name, api, entrypoint):
            with self.manager.serving(model_name, version, label) as handle:
                signature = select_signature(handle.servable, signature_name)
                signature.check_output_filter(output_filter)
                inputs = signature.complete(inputs_of(signature))
                signature.check_inputs(inputs)
                queue = handle.queues.get(signature.key)
                rows = batch_rows(inputs) if queue is not None else 0
                if rows == 0:
                    outputs = await asyncio.get_running_loop().run_in_executor(self.blocking_threads, signature.run,
                                                                               inputs)
                else:
                    outputs = await wait_async(queue, inputs, rows, deadline)
                if output_filter:
                    outputs = {name: outputs[name] for name in output_filter}
                return PredictResult(model_name, handle.servable.version, signature.key, outputs)

    def predict_response(self, result: PredictResult) -> predict_pb2.PredictResponse:
        """TF Serving's PredictResponse: outputs in the typed fields unless tensor_content was asked for."""
        response = predict_pb2.PredictResponse()
        response.model_spec.name = result.model_name
        response.model_spec.version.value = result.version
        response.model_spec.signature_name = result.signature_name
        outputs = response.outputs
        for name, value in result.outputs.items():
            fill_tensor_proto(outputs[name], value, self.tensor_content)
        return response
