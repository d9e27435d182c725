"""The signature path shared by Predict, Classify and Regress over gRPC and REST: resolve version, decode and
check inputs, batch (or run), filter outputs; and Predict's response encoding.

Driven by callbacks on the front ends' event loop (`Predictor.start`): a batched request waits in its queue without
holding a thread, an unbatched one runs the model on `blocking_threads`, so the loop stays free for other requests
and health probes. Callbacks rather than a coroutine per request: the Predict calls the gRPC front-end processes
hand over run from frame to answer with no task, future or context manager of their own, which took the event
loop's cost per 32-row Predict from 106-113 to 87-92 CPU-us (2-core EPYC); `Predictor.predict` awaits the same
path for the callers that are coroutines (REST, the in-process gRPC server, Classify and Regress).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from typing import Callable, Iterator, NamedTuple

import numpy as np
from tensorflow_serving.apis import predict_pb2

from bertserve.server.batcher import submit_on_loop
from bertserve.server.errors import ServingError, from_exception
from bertserve.server.manager import Handle, ModelManager
from bertserve.server.metrics import ServerMetrics
from bertserve.server.servable import LoadedVersion, Signature, batch_rows
from bertserve.server.tensors import fill_tensor_proto
from bertserve.server.token_inputs import TokenRanges

log = logging.getLogger("bertserve.server")
CANCELLED = "CANCELLED"


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
        """Counts one request run as a coroutine (MultiInference) under its final status, as `start` counts its
        own; anything unexpected is INTERNAL."""
        started, status = time.monotonic(), "OK"
        try:
            yield
        except ServingError as exc:
            status = exc.code_name
            raise
        except asyncio.CancelledError:  # the client went away or its deadline passed
            status = CANCELLED
            raise
        except Exception as exc:  # noqa: BLE001 - anything unexpected is INTERNAL, never a crash
            error = from_exception(exc)
            status = error.code_name
            raise error from exc
        finally:
            self.metrics.request_done(model_name, api, entrypoint, status, time.monotonic() - started)

    def start(self, *, model_name: str, version: int | None, label: str | None, signature_name: str,
              inputs_of: Callable[[Signature], dict[str, np.ndarray]], output_filter: list[str],
              deadline: float | None, entrypoint: str,
              on_done: Callable[[PredictResult | None, ServingError | None], None], api: str = "predict",
              select_signature: Callable[[LoadedVersion, str], Signature] = LoadedVersion.signature,
              token_ranges: TokenRanges | None = None) -> Callable[[], None]:
        """Starts one prediction on the running event loop. `on_done(result, error)` runs once, on the loop (at
        once if the request is refused before it queues); every failure is a ServingError with its status.
        `select_signature` finds the signature (Classify and Regress check theirs by their own rules) and
        `inputs_of(signature)` decodes the request for it (protos, raw tensors, JSON or tf.Examples);
        `token_ranges`, what a front end measured of its token inputs (Signature.check_inputs). Returns
        `cancel`, for a caller whose client went away: its queued rows are dropped, it counts as CANCELLED in the
        metrics, and on_done is not called."""
        return _Prediction(self, model_name, api, entrypoint, on_done).start(
            version, label, signature_name, inputs_of, output_filter, deadline, select_signature, token_ranges)

    async def predict(self, **arguments) -> PredictResult:
        """`start`'s prediction, awaited: raises its ServingError; cancelling the awaiting task cancels it."""
        answered = asyncio.get_running_loop().create_future()

        def on_done(result: PredictResult | None, error: ServingError | None) -> None:
            if error is None:
                answered.set_result(result)
            else:
                answered.set_exception(error)

        cancel = self.start(on_done=on_done, **arguments)
        try:
            return await answered
        except asyncio.CancelledError:
            cancel()
            raise

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


class _Prediction:
    """One prediction in flight: holds its version until it is answered, then counts it in TF Serving's metrics
    and tells `on_done`, once; or, cancelled first, counts CANCELLED and tells no one."""

    __slots__ = ("predictor", "model_name", "api", "entrypoint", "on_done", "started", "handle", "signature",
                 "output_filter", "abandon", "running", "finished")

    def __init__(self, predictor: Predictor, model_name: str, api: str, entrypoint: str,
                 on_done: Callable[[PredictResult | None, ServingError | None], None]):
        self.predictor, self.model_name, self.api, self.entrypoint = predictor, model_name, api, entrypoint
        self.on_done = on_done
        self.started = time.monotonic()
        self.handle: Handle | None = None
        self.signature: Signature | None = None
        self.output_filter: list[str] = []
        self.abandon: Callable[[], None] | None = None  # a batched request's: drops its queued rows
        self.running: concurrent.futures.Future | None = None  # an unbatched request's run
        self.finished = False

    def start(self, version: int | None, label: str | None, signature_name: str,
              inputs_of: Callable[[Signature], dict[str, np.ndarray]], output_filter: list[str],
              deadline: float | None, select_signature: Callable[[LoadedVersion, str], Signature],
              token_ranges: TokenRanges | None) -> Callable[[], None]:
        try:
            self.handle = handle = self.predictor.manager.acquire(self.model_name, version, label)
            self.signature = signature = select_signature(handle.servable, signature_name)
            signature.check_output_filter(output_filter)
            self.output_filter = output_filter
            inputs = signature.complete(inputs_of(signature))
            signature.check_inputs(inputs, token_ranges)
            queue = handle.queues.get(signature.key)
            rows = batch_rows(inputs) if queue is not None else 0
            if rows:
                self.abandon = submit_on_loop(queue, inputs, rows, deadline, self._answered)
            else:
                loop = asyncio.get_running_loop()
                self.running = self.predictor.blocking_threads.submit(signature.run, inputs)
                self.running.add_done_callback(lambda ran: loop.call_soon_threadsafe(self._ran, ran))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status, never a crash
            self._finish(None, exc)
        return self.cancel

    def cancel(self) -> None:
        if self.finished:
            return
        if self.running is not None:
            # A run not started yet never starts; one under way holds the version until its thread returns (_ran).
            self.running.cancel()
            self._finish(None, None, status=CANCELLED, release=False)
            return
        if self.abandon is not None:
            self.abandon()
        self._finish(None, None, status=CANCELLED)

    def _ran(self, ran: concurrent.futures.Future) -> None:
        if self.finished:  # cancelled meanwhile: only the version is left to let go
            self._release()
            return
        error = ran.exception()
        if error is not None:
            self._finish(None, error)
        else:
            self._answered(ran.result(), None)

    def _answered(self, outputs: dict[str, np.ndarray] | None, error: ServingError | None) -> None:
        if error is not None:
            self._finish(None, error)
            return
        if self.output_filter:
            outputs = {name: outputs[name] for name in self.output_filter}
        self._finish(PredictResult(self.model_name, self.handle.servable.version, self.signature.key, outputs),
                     None)

    def _finish(self, result: PredictResult | None, exc: BaseException | None, status: str = "OK",
                release: bool = True) -> None:
        self.finished = True
        if release:
            self._release()
        error = None
        if exc is not None:
            error = from_exception(exc)
            if not isinstance(exc, ServingError):
                log.error("%s of %s failed unexpectedly", self.api, self.model_name, exc_info=exc)
            status = error.code_name
        self.predictor.metrics.request_done(self.model_name, self.api, self.entrypoint, status,
                                            time.monotonic() - self.started)
        if status != CANCELLED:
            self.on_done(result, error)

    def _release(self) -> None:
        if self.handle is not None:
            self.handle.servable.release()
            self.handle = None
