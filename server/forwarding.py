"""The link between a gRPC front-end process (C++) and the main process: length-prefixed frames on a socketpair.

Calls go one way as (call id, seconds left, arrival time, method name, request bytes) and answers come back as
(call id, status code, details, response bytes): bytes as gRPC delivered them, never a parsed or pickled protobuf, so a
hand-off costs a few struct operations and a copy. Frames queued in one pass of the event loop leave in one
write (a batch's answers, a burst of calls), and a reader parses every whole frame a read brought in.

The front-end end of the link is C++ (server/cc/front_end_process.cc), which keeps the same layouts.
"""

from __future__ import annotations

import asyncio
import enum
import struct
from typing import Callable

LENGTH = struct.Struct("<I")  # bytes that follow the length field: the kind and the body
# call id, seconds left (negative: no deadline), arrival at the front end (time.monotonic()), method name length
CALL = struct.Struct("<IddH")
ANSWER = struct.Struct("<IBI")  # call id, gRPC status code number, length of the details
CALL_ID = struct.Struct("<I")
FLAG = struct.Struct("<B")


class Kind(enum.IntEnum):
    CALL = 1  # front end -> main: a call to answer
    CANCEL = 2  # front end -> main: the call ended on the client's side (cancelled, deadline passed)
    READY = 3  # front end -> main: listening
    ANSWER = 4  # main -> front end: a call's answer
    HEALTH = 5  # main -> front end: serving (1) or not (0)
    DRAIN = 6  # main -> front end: stop taking calls, finish those in flight, exit


def _frame(kind: Kind, *parts: bytes) -> list[bytes]:
    return [LENGTH.pack(1 + sum(len(part) for part in parts)), bytes((kind,)), *parts]


def parse_call(frame: bytes, start: int, end: int) -> tuple[int, str, float | None, float, bytes]:
    """(call id, method, seconds left, arrival time, request bytes) of a CALL frame's body at frame[start:end]."""
    call_id, seconds_left, arrived, name_length = CALL.unpack_from(frame, start)
    name_start = start + CALL.size
    payload_start = name_start + name_length
    return (call_id, frame[name_start:payload_start].decode(), None if seconds_left < 0 else seconds_left, arrived,
            frame[payload_start:end])


def answer_frame(call_id: int, code: int, details: str, body: bytes) -> list[bytes]:
    text = details.encode()
    return _frame(Kind.ANSWER, ANSWER.pack(call_id, code, len(text)), text, body)


def flag_frame(kind: Kind, value: bool) -> list[bytes]:
    return _frame(kind, FLAG.pack(value))


def bare_frame(kind: Kind) -> list[bytes]:
    return _frame(kind)


class FrameLink(asyncio.Protocol):
    """One end of the link. `on_frame(kind, frame, start, end)` gets each frame's body as frame[start:end] (the
    kind byte excluded); `on_lost()` once the other end is gone."""

    def __init__(self, on_frame: Callable[[Kind, bytes, int, int], None], on_lost: Callable[[], None]):
        self._on_frame, self._on_lost = on_frame, on_lost
        self._transport: asyncio.Transport | None = None
        self._outgoing: list[bytes] = []
        self._partial = bytearray()  # the start of a frame that has not fully arrived
        self._needed = 0  # bytes _partial must hold before it is worth parsing again

    def connection_made(self, transport) -> None:
        self._transport = transport

    def connection_lost(self, exc) -> None:
        self._transport = None
        self._on_lost()

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def send(self, frame: list[bytes]) -> None:
        """Queues a frame; what is queued in this loop pass leaves in one write at the start of the next."""
        if not self.connected:
            return  # the other end is gone: its calls went with it
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.extend(frame)

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if self.connected:
            self._transport.write(b"".join(outgoing))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self._partial:
            # A large frame arrives in many reads: gather them and parse only once the frame is complete.
            self._partial += data
            if len(self._partial) < self._needed:
                return
            data, self._partial = bytes(self._partial), bytearray()
        offset, end = 0, len(data)
        while end - offset > LENGTH.size:
            length, = LENGTH.unpack_from(data, offset)
            frame_end = offset + LENGTH.size + length
            if frame_end > end:
                self._needed = frame_end - offset
                break
            self._on_frame(Kind(data[offset + LENGTH.size]), data, offset + LENGTH.size + 1, frame_end)
            offset = frame_end
        else:
            self._needed = LENGTH.size + 1
        if offset < end:
            self._partial = bytearray(data[offset:])
