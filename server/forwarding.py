"""The link between a gRPC front-end process (C++) and the main process: length-prefixed frames on a socketpair.

Calls go one way as (call id, seconds left, arrival time, method name, request bytes) and answers come back as
(call id, status code, details, response bytes): bytes as gRPC delivered them, never a parsed or pickled protobuf, so a
hand-off costs a few struct operations and a copy. Predict calls go taken apart instead (PREDICT: the model spec,
output filter and each input's dtype, shape and value bytes, which NumPy reads in place) and their successful
answers come back as arrays (OUTPUTS), which the front end encodes: the protobuf work of the hot path is C++
(server/cc/predict_codec.h). Frames queued in one pass of the event loop leave in one
write (a batch's answers, a burst of calls), and a reader parses every whole frame a read brought in.

The front-end end of the link is C++ (server/cc/front_end_process.cc), which keeps the same layouts.
"""

from __future__ import annotations

import asyncio
import enum
import struct
from typing import Callable, NamedTuple

import numpy as np

from bertserve.server.tensors import RAW_VALUE_DTYPES, RawTensor, dtype_enum_of
from bertserve.server.token_inputs import TokenRanges

LENGTH = struct.Struct("<I")  # bytes that follow the length field: the kind and the body
# call id, seconds left (negative: no deadline), arrival at the front end (time.monotonic()), method name length
CALL = struct.Struct("<IddH")
ANSWER = struct.Struct("<IBI")  # call id, gRPC status code number, length of the details
CALL_ID = struct.Struct("<I")
FLAG = struct.Struct("<B")
# call id, seconds left, arrival, has a version, the version, lengths of the model name, version label and signature
# name, number of output filter names, number of inputs; then the three names, the filter names (each NAME_LENGTH
# and its bytes), the inputs (each TENSOR, its name, its dims as int64, its value bytes) and TOKENS
PREDICT = struct.Struct("<IddBqHHHHH")
# name length, dtype, values are tensor_content (else the typed field's), rank, value bytes
TENSOR = struct.Struct("<HiBBI")
# after the inputs: the token inputs' summary (0: none, 1: mask valid, 2: mask refused), then the least and greatest
# input_ids and segment_ids at real positions (TokenRanges)
TOKENS = struct.Struct("<Biiii")
NAME_LENGTH = struct.Struct("<H")
# call id, version, encode as tensor_content, lengths of the model name and signature name, number of outputs; then
# the two names and the outputs, as the inputs of PREDICT
OUTPUTS = struct.Struct("<IqBHHH")
MAX_NAME = (1 << 16) - 1
MAX_RANK = (1 << 8) - 1  # NumPy's arrays have at most 64 dimensions
_DIMS = [struct.Struct(f"<{rank}q") for rank in range(MAX_RANK + 1)]


class Kind(enum.IntEnum):
    CALL = 1  # front end -> main: a call to answer
    CANCEL = 2  # front end -> main: the call ended on the client's side (cancelled, deadline passed)
    READY = 3  # front end -> main: listening
    ANSWER = 4  # main -> front end: a call's answer
    HEALTH = 5  # main -> front end: serving (1) or not (0)
    DRAIN = 6  # main -> front end: stop taking calls, finish those in flight, exit
    PREDICT = 7  # front end -> main: a Predict call, taken apart
    OUTPUTS = 8  # main -> front end: a PREDICT call's outputs, for the front end to encode as its response


_OUTPUTS_KIND = bytes((Kind.OUTPUTS,))


class DecodedPredict(NamedTuple):
    """A PREDICT frame: a PredictRequest as the front end took it apart."""
    call_id: int
    seconds_left: float | None
    arrived: float
    model_name: str
    version: int | None
    version_label: str
    signature_name: str
    output_filter: list[str]
    inputs: dict[str, RawTensor]
    token_ranges: TokenRanges | None = None


def _frame(kind: Kind, *parts: bytes) -> list[bytes]:
    return [LENGTH.pack(1 + sum(len(part) for part in parts)), bytes((kind,)), *parts]


def parse_call(frame: bytes, start: int, end: int) -> tuple[int, str, float | None, float, bytes]:
    """(call id, method, seconds left, arrival time, request bytes) of a CALL frame's body at frame[start:end]."""
    call_id, seconds_left, arrived, name_length = CALL.unpack_from(frame, start)
    name_start = start + CALL.size
    payload_start = name_start + name_length
    return (call_id, frame[name_start:payload_start].decode(), None if seconds_left < 0 else seconds_left, arrived,
            frame[payload_start:end])


def parse_predict(frame: bytes, start: int, end: int) -> DecodedPredict:
    """A PREDICT frame's body at frame[start:end]; its value bytes are views of `frame`, not copies."""
    (call_id, seconds_left, arrived, has_version, version, name_length, label_length, signature_length, filters,
     inputs) = PREDICT.unpack_from(frame, start)
    view = memoryview(frame)
    at = start + PREDICT.size
    model_name = str(view[at:at + name_length], "utf-8")
    at += name_length
    label = str(view[at:at + label_length], "utf-8")
    at += label_length
    signature_name = str(view[at:at + signature_length], "utf-8")
    at += signature_length
    output_filter = []
    for _ in range(filters):
        length, = NAME_LENGTH.unpack_from(frame, at)
        at += NAME_LENGTH.size
        output_filter.append(str(view[at:at + length], "utf-8"))
        at += length
    tensors = {}
    for _ in range(inputs):
        length, dtype, in_content, rank, data_length = TENSOR.unpack_from(frame, at)
        at += TENSOR.size
        alias = str(view[at:at + length], "utf-8")
        at += length
        dims = _DIMS[rank]
        shape = list(dims.unpack_from(frame, at))
        at += dims.size
        tensors[alias] = RawTensor(dtype, shape, view[at:at + data_length], bool(in_content))
        at += data_length
    state, *ranges = TOKENS.unpack_from(frame, at)
    at += TOKENS.size
    if at != end:
        raise ValueError(f"a PREDICT frame of {end - start} bytes describes {at - start}")
    return DecodedPredict(call_id, None if seconds_left < 0 else seconds_left, arrived, model_name,
                          version if has_version else None, label, signature_name, output_filter, tensors,
                          TokenRanges(state == 1, *ranges) if state else None)


def outputs_frame(call_id: int, model_name: str, version: int, signature_name: str, outputs: dict[str, np.ndarray],
                  as_tensor_content: bool) -> list[bytes] | None:
    """The OUTPUTS frame of a Predict's result; None when an output is of a dtype the front end does not encode
    (strings, halves, ...), whose response is then encoded here."""
    name, signature = model_name.encode(), signature_name.encode()
    if len(name) > MAX_NAME or len(signature) > MAX_NAME:
        return None
    body = [OUTPUTS.pack(call_id, version, as_tensor_content, len(name), len(signature), len(outputs)), name,
            signature]
    for alias, array in outputs.items():
        dtype = dtype_enum_of(array)
        alias_bytes = alias.encode()
        if dtype not in RAW_VALUE_DTYPES or len(alias_bytes) > MAX_NAME:
            return None
        values = array.tobytes()  # C order, whatever the array's layout
        body += (TENSOR.pack(len(alias_bytes), dtype, 0, array.ndim, len(values)), alias_bytes,
                 _DIMS[array.ndim].pack(*array.shape), values)
    joined = b"".join(body)
    return [LENGTH.pack(1 + len(joined)), _OUTPUTS_KIND, joined]


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
