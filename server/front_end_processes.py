"""--grpc_front_end_processes=N (N > 1): N gRPC front-end processes on the gRPC port, answered by this process.

grpc.aio's own per-call work (HTTP/2, its Cython layer) costs more CPU than what this server does with a
request, and one Python process runs it on one core. So N processes of a small C++ program
(server/cc/front_end_process.cc, built by `make setup`) terminate gRPC on the same port (SO_REUSEPORT) and forward
each call's bytes here (server/forwarding.py); this process parses and answers them with the same GrpcApi as the
single-process mode, on the front ends' event loop beside REST, so models, batch queues, the in-flight bound,
metrics and health stay in one place. Predict calls, the hot path, come taken apart and leave as arrays: the front
ends parse and serialize their protobufs (server/cc/predict_codec.h), with the descriptors this process's
tensorflow_serving.apis package was generated from, handed over on their standard input.

A front-end process that exits or whose link breaks is noticed at once: its calls here are cancelled and it is
started again. More than MAX_RESTARTS restarts within RESTART_WINDOW_SECONDS, or a replacement that cannot
listen, is a failure of the server: health turns NOT_SERVING and `on_failure` is told (the server then exits
non-zero), rather than a server that looks healthy while its port drops calls.

When this process falls behind reading the links (its Python is the limit on a fast GPU), calls would queue
there without bound, past the batch queue's own limit, until their deadlines. An inference call read more than
LINK_BACKLOG_LIMIT_SECONDS after its front end got it is refused UNAVAILABLE unparsed, a few microseconds each,
as TF Serving's handlers would have found its batch queue full; so the backlog drains and latency stays bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import signal
import socket
import subprocess
import time
from typing import Callable

import grpc
from google.protobuf import descriptor_pb2
from tensorflow_serving.apis import predict_pb2

from bertserve.server import forwarding
from bertserve.server.forwarding import DecodedPredict, FrameLink, Kind
from bertserve.server.grpc_front_end import RpcAnswer
from bertserve.server.grpc_service import PREDICT_METHOD, GrpcApi, failed_answer
from bertserve.server.predict import PredictResult

log = logging.getLogger("bertserve.server")
FRONT_END_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cc", "bertserve_front_end")
START_TIMEOUT_SECONDS = 60.0
MAX_RESTARTS, RESTART_WINDOW_SECONDS = 5, 60.0
# After the drain grace, time for the front ends to close their calls and exit before they are killed.
EXIT_MARGIN_SECONDS = 5.0
# Far above a read's normal delay (under a millisecond) and the pauses of a version swap under load: the collection
# of the new version's objects before they are frozen holds the interpreter lock for 100-250 ms (at 100 ms, 20-117
# calls of a swap under 250-2,000 queries/s were refused on the GPU machine).
LINK_BACKLOG_LIMIT_SECONDS = 0.5


def predict_descriptor_set() -> bytes:
    """TF Serving's predict.proto and its imports as a FileDescriptorSet, imports before the files that use them."""
    files, seen = descriptor_pb2.FileDescriptorSet(), set()

    def add(file) -> None:
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            add(dependency)
        file.CopyToProto(files.file.add())

    add(predict_pb2.DESCRIPTOR)
    return files.SerializeToString()


@dataclasses.dataclass
class _FrontEnd:
    index: int
    process: asyncio.subprocess.Process
    ready: asyncio.Future  # set when it listens
    # Killed through a pidfd, not Process.kill(): Popen.kill() first polls, and a poll that reaps an exited process
    # before asyncio's child watcher does makes the watcher report exit code 255 instead of the real one.
    pidfd: int | None = None
    link: FrameLink | None = None
    # call id -> what cancels its answering (a task's cancel, or a decoded Predict's)
    calls: dict[int, Callable[[], object]] = dataclasses.field(default_factory=dict)

    def kill(self) -> None:
        """SIGKILL, unless it has exited already; never reaps, so its watcher gets its true exit status."""
        if self.pidfd is None or self.process.returncode is not None:
            return
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class FrontEndProcesses:
    """Starts, watches, restarts and drains the front-end processes; answers their calls on this loop."""

    def __init__(self, count: int, port: int, unix_socket: str, api: GrpcApi, drain_grace_seconds: float,
                 on_failure: Callable[[str], None]):
        self.count, self.port, self.unix_socket, self.api = count, port, unix_socket, api
        self.drain_grace_seconds, self.on_failure = drain_grace_seconds, on_failure
        self._front_ends: dict[int, _FrontEnd] = {}
        self._watchers: set[asyncio.Task] = set()
        self._restarts: list[float] = []
        self._serving = False
        self._stopping = False
        self._descriptor_set = predict_descriptor_set()

    async def start(self) -> None:
        """Starts every front end and waits until each listens; OSError (after stopping them) if one cannot."""
        if not os.access(FRONT_END_PROGRAM, os.X_OK):
            raise OSError(f"--grpc_front_end_processes needs the front-end program {FRONT_END_PROGRAM}: "
                          f"`make setup` builds it (Debian's libgrpc++-dev)")
        try:
            for index in range(self.count):
                await self._spawn(index)
            await self._wait_ready(list(self._front_ends.values()))
        except BaseException:
            await self.stop(0)
            raise

    async def set_health(self, serving: bool) -> None:
        self._serving = serving
        for front_end in self._front_ends.values():
            front_end.link.send(forwarding.flag_frame(Kind.HEALTH, serving))

    async def stop(self, grace_seconds: float) -> None:
        """Each front end refuses new calls and gets `grace_seconds` for those in flight (answered here
        meanwhile), then exits; one that does not exit in time is killed."""
        self._stopping = True
        front_ends = list(self._front_ends.values())
        for front_end in front_ends:
            front_end.link.send(forwarding.bare_frame(Kind.DRAIN))
        exits = [asyncio.ensure_future(front_end.process.wait()) for front_end in front_ends]
        if exits:
            await asyncio.wait(exits, timeout=grace_seconds + EXIT_MARGIN_SECONDS)
            for front_end in front_ends:
                if front_end.process.returncode is None:
                    log.error("gRPC front end %d did not exit after the drain; killing it", front_end.index)
                    front_end.kill()
            await asyncio.gather(*exits)
        for front_end in front_ends:
            front_end.link.close()
        for watcher in list(self._watchers):
            await watcher

    async def _spawn(self, index: int) -> _FrontEnd:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                FRONT_END_PROGRAM, f"--link_fd={theirs.fileno()}",
                f"--index={index}", f"--port={self.port}",
                # a UNIX socket cannot be shared: the first front end serves it
                f"--grpc_socket_path={self.unix_socket if index == 0 else ''}",
                f"--drain_grace_seconds={self.drain_grace_seconds}", f"--methods={','.join(self.api.methods)}",
                pass_fds=(theirs.fileno(),), stdin=subprocess.PIPE)
        finally:
            theirs.close()
        process.stdin.write(self._descriptor_set)
        process.stdin.close()  # the end of the descriptors; a front end that exits early is its watcher's to report
        front_end = _FrontEnd(index, process, loop.create_future())
        try:
            front_end.pidfd = os.pidfd_open(process.pid)
        except ProcessLookupError:
            pass  # it has exited and been reaped already: its watcher reports how
        on_frame, on_lost = functools.partial(self._on_frame, front_end), functools.partial(self._link_lost, front_end)
        _, front_end.link = await loop.connect_accepted_socket(lambda: FrameLink(on_frame, on_lost), sock=ours)
        self._front_ends[index] = front_end
        front_end.link.send(forwarding.flag_frame(Kind.HEALTH, self._serving))
        watcher = loop.create_task(self._watch(front_end))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return front_end

    async def _wait_ready(self, front_ends: list[_FrontEnd]) -> None:
        try:
            await asyncio.wait_for(asyncio.gather(*(front_end.ready for front_end in front_ends)),
                                   START_TIMEOUT_SECONDS)
        except asyncio.TimeoutError:
            raise OSError(f"gRPC front-end processes not listening after {START_TIMEOUT_SECONDS:.0f} s") from None

    def _on_frame(self, front_end: _FrontEnd, kind: Kind, frame: bytes, start: int, end: int) -> None:
        if kind == Kind.PREDICT:
            call = forwarding.parse_predict(frame, start, end)
            if not self._refused_as_late(front_end, call.call_id, call.arrived):
                self._start_decoded(front_end, call)
        elif kind == Kind.CALL:
            call_id, method, seconds_left, arrived, payload = forwarding.parse_call(frame, start, end)
            if not (self.api.is_inference(method) and self._refused_as_late(front_end, call_id, arrived)):
                front_end.calls[call_id] = asyncio.get_running_loop().create_task(
                    self._answer(front_end, call_id, method, payload, seconds_left)).cancel
        elif kind == Kind.CANCEL:
            cancel = front_end.calls.pop(forwarding.CALL_ID.unpack_from(frame, start)[0], None)
            if cancel is not None:
                cancel()
        elif kind == Kind.READY and not front_end.ready.done():
            front_end.ready.set_result(None)

    def _refused_as_late(self, front_end: _FrontEnd, call_id: int, arrived: float) -> bool:
        """Refuses an inference call UNAVAILABLE when it waited in the link past LINK_BACKLOG_LIMIT_SECONDS."""
        waited = time.monotonic() - arrived
        if waited <= LINK_BACKLOG_LIMIT_SECONDS:
            return False
        front_end.link.send(forwarding.answer_frame(
            call_id, grpc.StatusCode.UNAVAILABLE.value[0],
            f"The server is overloaded: this request waited {waited * 1e3:.0f} ms for the server to read it "
            f"(limit {LINK_BACKLOG_LIMIT_SECONDS * 1e3:.0f} ms); retry later", b""))
        return True

    def _start_decoded(self, front_end: _FrontEnd, call: DecodedPredict) -> None:
        pending = True

        def answered(answer: RpcAnswer | PredictResult) -> None:
            nonlocal pending
            pending = False
            front_end.calls.pop(call.call_id, None)
            front_end.link.send(self._decoded_answer_frame(call.call_id, answer))

        cancel = self.api.start_decoded(call, answered)
        if pending:  # not refused at once
            front_end.calls[call.call_id] = cancel

    def _decoded_answer_frame(self, call_id: int, answer: RpcAnswer | PredictResult) -> list[bytes]:
        """A failure's status, or the outputs for the front end to encode (here, for dtypes it does not encode)."""
        if isinstance(answer, RpcAnswer):
            return forwarding.answer_frame(call_id, *answer)
        predictor = self.api.predictor
        frame = forwarding.outputs_frame(call_id, answer.model_name, answer.version, answer.signature_name,
                                         answer.outputs, predictor.tensor_content)
        if frame is not None:
            return frame
        try:
            body = predictor.predict_response(answer).SerializeToString()
        except Exception as exc:  # noqa: BLE001 - an output that cannot be encoded fails its call, nothing else
            return forwarding.answer_frame(call_id, *failed_answer(PREDICT_METHOD, exc))
        return forwarding.answer_frame(call_id, grpc.StatusCode.OK.value[0], "", body)

    async def _answer(self, front_end: _FrontEnd, call_id: int, method: str, payload: bytes,
                      seconds_left: float | None) -> None:
        try:
            answer = await self.api.answer(method, payload, seconds_left)
        finally:
            front_end.calls.pop(call_id, None)
        front_end.link.send(forwarding.answer_frame(call_id, *answer))

    def _link_lost(self, front_end: _FrontEnd) -> None:
        """Its calls cannot be answered any more; a process without its link is of no use, so it goes too."""
        for cancel in front_end.calls.values():
            cancel()
        front_end.calls.clear()
        if not self._stopping:  # when stopping, it closes it as it exits
            front_end.kill()

    async def _watch(self, front_end: _FrontEnd) -> None:
        code = await front_end.process.wait()
        front_end.close_pidfd()
        front_end.link.close()
        if not front_end.ready.done():
            # It never listened: whoever waits for it (start, or the watcher restarting it) reports that.
            front_end.ready.set_exception(OSError(
                f"gRPC front end {front_end.index} exited with code {code} before it listened (see its log above)"))
            front_end.ready.exception()  # marked retrieved: during a stop nobody waits for it
            return
        if self._stopping:
            return
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_SECONDS] + [now]
        if len(self._restarts) > MAX_RESTARTS:
            await self._fail(f"gRPC front end {front_end.index} {how}, its restart number {len(self._restarts)} "
                             f"within {RESTART_WINDOW_SECONDS:.0f} s")
            return
        log.error("gRPC front end %d (pid %d) %s; starting it again", front_end.index, front_end.process.pid, how)
        try:
            await self._wait_ready([await self._spawn(front_end.index)])
        except OSError as exc:
            if not self._stopping:
                await self._fail(str(exc))

    async def _fail(self, reason: str) -> None:
        log.error("%s: the server stops", reason)
        await self.set_health(False)
        self.on_failure(reason)
