"""A gRPC front-end process of `bertserve serve --grpc_front_end_processes=N` (N > 1).

It terminates gRPC on the shared port (SO_REUSEPORT: the kernel spreads new connections over the N processes)
and forwards every call, as bytes, over its socketpair to the main process, which owns the models, batchers,
metrics and REST and answers it (server/front_end_processes.py). It imports no TensorFlow and holds no state but
its calls in flight; health is what the main process last said.

The main process manages it: SIGTERM and SIGINT are ignored (a signal to the process group reaches the main
process, which drains the front ends itself), DRAIN makes it finish its calls in flight and exit, and a lost
link (the main process is gone) makes it exit at once.

Run by the main process as `python -m bertserve.server.front_end_process --link_fd=FD --port=P ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import signal
import socket
import sys

from bertserve.server import forwarding
from bertserve.server.forwarding import FrameLink, Kind
from bertserve.server.grpc_front_end import GrpcFrontEnd, RpcAnswer

log = logging.getLogger("bertserve.server")
EXIT_CANNOT_LISTEN = 3


class ForwardedCalls:
    """This process's calls in flight, each waiting for the main process's answer."""

    def __init__(self) -> None:
        self.link: FrameLink | None = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)

    async def answer(self, method: str, payload: bytes, seconds_left: float | None) -> RpcAnswer:
        """GrpcFrontEnd's `answer`: the main process's."""
        call_id = next(self._ids) & 0xFFFFFFFF
        answered = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = answered
        self.link.send(forwarding.call_frame(call_id, method, seconds_left, payload))
        try:
            return await answered
        except asyncio.CancelledError:  # the client cancelled or its deadline passed: the main process stops too
            if call_id in self._waiting:
                self.link.send(forwarding.call_id_frame(Kind.CANCEL, call_id))
            raise
        finally:
            self._waiting.pop(call_id, None)

    def answered(self, frame: bytes, start: int, end: int) -> None:
        call_id, code, details, body = forwarding.parse_answer(frame, start, end)
        waiting = self._waiting.pop(call_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(RpcAnswer(code, details, body))


class Health:
    """What the main process last said about health, applied to the gRPC server once it is up."""

    def __init__(self) -> None:
        self.serving = False
        self.front_end: GrpcFrontEnd | None = None
        self._updates: set[asyncio.Task] = set()  # referenced until done

    def set(self, serving: bool) -> None:
        self.serving = serving
        if self.front_end is not None:
            update = asyncio.get_running_loop().create_task(self.front_end.set_health(serving))
            self._updates.add(update)
            update.add_done_callback(self._updates.discard)

    async def started(self, front_end: GrpcFrontEnd) -> None:
        self.front_end = front_end
        await front_end.set_health(self.serving)


async def serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    calls, health = ForwardedCalls(), Health()
    drain, lost = asyncio.Event(), asyncio.Event()

    def on_frame(kind: Kind, frame: bytes, start: int, end: int) -> None:
        if kind == Kind.ANSWER:
            calls.answered(frame, start, end)
        elif kind == Kind.HEALTH:
            health.set(bool(frame[start]))
        elif kind == Kind.DRAIN:
            drain.set()

    _, calls.link = await loop.connect_accepted_socket(lambda: FrameLink(on_frame, lost.set),
                                                       sock=socket.socket(fileno=args.link_fd))
    try:
        front_end = await GrpcFrontEnd.start(args.port, args.grpc_socket_path, args.methods.split(","),
                                             calls.answer, reuse_port=True)
    except OSError as exc:
        log.error("front end %d: %s", args.index, exc)
        return EXIT_CANNOT_LISTEN
    await health.started(front_end)
    calls.link.send(forwarding.bare_frame(Kind.READY))
    log.info("gRPC front end %d listening on port %d%s", args.index, args.port,
             f" and {args.grpc_socket_path}" if args.grpc_socket_path else "")
    if await _first(drain.wait(), lost.wait()) == 0:
        await front_end.stop(args.drain_grace_seconds)
        calls.link.close()
        return 0
    log.error("front end %d: the main process is gone; exiting", args.index)
    await front_end.stop(0)
    return 1


async def _first(*waits) -> int:
    """Index of the first of `waits` to finish (the others are cancelled)."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return tasks.index(next(iter(done)))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bertserve.server.front_end_process")
    parser.add_argument("--link_fd", type=int, required=True, help="this end of the socketpair to the main process")
    parser.add_argument("--index", type=int, required=True, help="which front end (for the logs)")
    parser.add_argument("--port", type=int, required=True, help="the gRPC port, shared by the front ends")
    parser.add_argument("--grpc_socket_path", default="", help="also listen on this UNIX socket")
    parser.add_argument("--drain_grace_seconds", type=float, required=True)
    parser.add_argument("--methods", required=True, help="comma-separated full names of the methods to forward")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s[front end {args.index}]: %(message)s")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
