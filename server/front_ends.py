"""The server's front ends, gRPC and REST, on one asyncio event loop in a thread of its own.

One loop for both: a request is decoded, checked and queued on it and then awaited, so no thread is held per
request, and the only hand-offs are loop -> batch thread -> loop. Blocking work (unbatched model calls, JSON
parsing, config reloads) runs on `blocking_threads`. gRPC is terminated on this loop too (grpc_processes 1) or by
that many C++ front-end processes that forward each call's bytes to it (server/front_end_processes.py); either
way GrpcApi answers the call here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import Callable

from bertserve.server.front_end_processes import FrontEndProcesses
from bertserve.server.grpc_front_end import GrpcFrontEnd
from bertserve.server.grpc_service import GrpcApi
from bertserve.server.predict import Predictor
from bertserve.server.rest import RestApi, RestFrontEnd

log = logging.getLogger("bertserve.server")


@dataclasses.dataclass(frozen=True)
class FrontEndOptions:
    grpc_port: int  # 0: no gRPC
    rest_port: int  # 0: no REST
    max_in_flight: int  # inference RPCs in flight before gRPC refuses UNAVAILABLE
    rest_slots: int  # REST requests handled at once (--rest_api_num_threads)
    rest_timeout_seconds: float
    prometheus_path: str | None
    drain_grace_seconds: float
    grpc_socket_path: str = ""  # --grpc_socket_path: gRPC on this UNIX socket as well ("": none)
    grpc_processes: int = 1  # --grpc_front_end_processes: 1 terminates gRPC in this process, N > 1 in N others


class FrontEnds:
    """Starts the loop thread and both servers; `stop()` drains them and ends the thread."""

    def __init__(self, options: FrontEndOptions, predictor: Predictor, on_failure: Callable[[str], None]):
        """on_failure(reason): called (on the loop) when the gRPC front-end processes cannot be kept running;
        the server must stop."""
        self.options, self.predictor, self.on_failure = options, predictor, on_failure
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="front_ends", daemon=True)
        self._grpc: GrpcFrontEnd | FrontEndProcesses | None = None
        self._rest: RestFrontEnd | None = None

    def start(self) -> None:
        """Listens on the configured ports (health NOT_SERVING until `serving()`); OSError if a port is taken."""
        self._thread.start()
        try:
            self._call(self._start())
        except BaseException:
            self._call(self._stop())
            self._end_thread()
            raise

    def serving(self) -> None:
        """Health checks say SERVING (server/health.py decides when). From any thread but the loop's."""
        if self._grpc is not None:
            self._call(self._grpc.set_health(True))

    def not_serving(self) -> None:
        """Health checks say NOT_SERVING from now on. From any thread but the loop's."""
        if self._grpc is not None:
            self._call(self._grpc.set_health(False))

    def stop(self) -> None:
        """New requests refused, in-flight ones get the drain grace, then the loop thread ends."""
        self._call(self._stop())
        self._end_thread()

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _end_thread(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _start(self) -> None:
        options, threads = self.options, self.predictor.blocking_threads
        if options.grpc_port or options.grpc_socket_path:
            api = GrpcApi(self.predictor, options.max_in_flight)
            if options.grpc_processes > 1:
                processes = FrontEndProcesses(options.grpc_processes, options.grpc_port, options.grpc_socket_path,
                                              api, options.drain_grace_seconds, self.on_failure)
                await processes.start()
                self._grpc = processes
            else:
                self._grpc = await GrpcFrontEnd.start(options.grpc_port, options.grpc_socket_path, api.methods,
                                                      api.answer)
            log.info("Running gRPC ModelServer at 0.0.0.0:%d ...%s", options.grpc_port,
                     f" ({options.grpc_processes} front-end processes)" if options.grpc_processes > 1 else "")
        if options.rest_port:
            api = RestApi(self.predictor, self.predictor.metrics, options.prometheus_path,
                          options.rest_timeout_seconds, threads)
            self._rest = await RestFrontEnd.start(options.rest_port, api, options.rest_slots,
                                                  options.drain_grace_seconds)
            log.info("Exporting HTTP/REST API at:localhost:%d ...", options.rest_port)

    async def _stop(self) -> None:
        stops = []
        if self._grpc is not None:
            stops.append(self._grpc.stop(self.options.drain_grace_seconds))
        if self._rest is not None:
            stops.append(self._rest.stop())
        await asyncio.gather(*stops)
