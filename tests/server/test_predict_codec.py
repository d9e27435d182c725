"""The front end's Predict codec (server/cc/predict_codec.h), driven as the main process drives it: the real
front-end program on a socketpair, TF Serving's descriptors on its standard input, the official stubs as the
client. This test plays the main process: it reads the frames the front end sends and answers them.

A Predict in the forms the codec takes apart arrives as a PREDICT frame whose tensors decode to the arrays the
TensorProtos decode to (server/tensors.py, the same checks for both); any other request arrives as its own bytes;
an OUTPUTS answer reaches the client as the PredictResponse the main process would have serialized."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bertserve.server import forwarding
from bertserve.server.forwarding import Kind
from bertserve.server.front_end_processes import FRONT_END_PROGRAM, predict_descriptor_set
from bertserve.server.predict import PredictResult, Predictor
from bertserve.server.errors import ServingError
from bertserve.server.tensors import proto_to_ndarray, raw_to_ndarray
from bertserve.server.token_inputs import TokenInputRules, TokenLimits, TokenRanges

PREDICT = "/tensorflow.serving.PredictionService/Predict"
pytestmark = pytest.mark.skipif(not os.access(FRONT_END_PROGRAM, os.X_OK), reason="`make setup` builds the front end")


class PlayedMainProcess:
    """The main process's end of one front end's link, read and written by the test."""

    def __init__(self, descriptors: bytes):
        ours, theirs = socket.socketpair()
        with socket.socket() as probe:
            probe.bind(("localhost", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [FRONT_END_PROGRAM, f"--link_fd={theirs.fileno()}", "--index=0", f"--port={self.port}",
             "--grpc_socket_path=", "--drain_grace_seconds=1", f"--methods={PREDICT}"],
            pass_fds=(theirs.fileno(),), stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        theirs.close()
        self.process.stdin.write(descriptors)
        self.process.stdin.close()
        self.link = ours
        self.link.settimeout(30)
        assert self.next_frame()[0] == Kind.READY
        self.send(forwarding.flag_frame(Kind.HEALTH, True))
        self.channel = grpc.insecure_channel(f"localhost:{self.port}")
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.link.recv(size - len(data))
            assert chunk, "the front end closed its link"
            data += chunk
        return data

    def next_frame(self) -> tuple[Kind, bytes]:
        length, = forwarding.LENGTH.unpack(self._read(forwarding.LENGTH.size))
        frame = self._read(length)
        return Kind(frame[0]), frame

    def send(self, frame: list[bytes]) -> None:
        self.link.sendall(b"".join(frame))

    def close(self) -> str:
        self.channel.close()
        self.send(forwarding.bare_frame(Kind.DRAIN))
        assert self.process.wait(timeout=30) == 0
        return self.process.stderr.read().decode()


@pytest.fixture(scope="module")
def main_process():
    played = PlayedMainProcess(predict_descriptor_set())
    yield played
    played.close()


def _call(main_process: PlayedMainProcess, request: bytes | predict_pb2.PredictRequest):
    """Starts the Predict (bytes go as they are) and returns its future and the frame the front end sent."""
    predict = main_process.channel.unary_unary(PREDICT, request_serializer=None,
                                              response_deserializer=predict_pb2.PredictResponse.FromString)
    payload = request if isinstance(request, bytes) else request.SerializeToString()
    future = predict.future(payload, timeout=30)
    kind, frame = main_process.next_frame()
    return future, kind, frame, payload


def _info(dtype: int) -> meta_graph_pb2.TensorInfo:
    return meta_graph_pb2.TensorInfo(dtype=dtype)


def _request(**inputs: tensor_pb2.TensorProto) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ranker"
    for name, proto in inputs.items():
        request.inputs[name].CopyFrom(proto)
    return request


def _typed(dtype: int, field: str, values: list, dims: list[int]) -> tensor_pb2.TensorProto:
    proto = tensor_pb2.TensorProto(dtype=dtype)
    proto.tensor_shape.dim.extend(tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims)
    getattr(proto, field).extend(values)
    return proto


DECODED_CASES = {
    "tensor_content int32": _request(ids=tf.make_tensor_proto(np.arange(64, dtype=np.int32).reshape(2, 32))),
    "tensor_content float64": _request(x=tf.make_tensor_proto(np.linspace(-1, 1, 6).reshape(3, 2))),
    "int_val": _request(ids=_typed(types_pb2.DT_INT32, "int_val", [3, -7, 2 ** 31 - 1, -2 ** 31], [2, 2])),
    "int_val, fewer values than the shape (the last repeats)": _request(
        ids=_typed(types_pb2.DT_INT32, "int_val", [5], [4, 8])),
    "float_val": _request(x=_typed(types_pb2.DT_FLOAT, "float_val", [0.5, -1.25, 3e38], [3])),
    "double_val": _request(x=_typed(types_pb2.DT_DOUBLE, "double_val", [1e-300, 2.5], [2, 1])),
    "int64_val": _request(x=_typed(types_pb2.DT_INT64, "int64_val", [2 ** 62, -1], [2])),
    "scalar": _request(x=tf.make_tensor_proto(np.float32(4.5))),
    "empty, no values": _request(x=_typed(types_pb2.DT_FLOAT, "float_val", [], [0, 3])),
    "no values, zeros fill": _request(x=_typed(types_pb2.DT_INT64, "int64_val", [], [2, 2])),
    "several inputs": _request(a=tf.make_tensor_proto(np.ones((2, 3), np.float32)),
                               b=_typed(types_pb2.DT_INT32, "int_val", [1, 2], [2]),
                               c=tf.make_tensor_proto(np.zeros((1,), np.int64))),
}


@pytest.mark.parametrize("case", sorted(DECODED_CASES))
def test_predict_arrives_taken_apart_and_decodes_as_its_protos(main_process, case):
    request = predict_pb2.PredictRequest()
    request.CopyFrom(DECODED_CASES[case])
    request.model_spec.signature_name = "serving_default"
    request.model_spec.version.value = 7
    request.output_filter.append("scores")
    future, kind, frame, _ = _call(main_process, request)
    assert kind == Kind.PREDICT
    call = forwarding.parse_predict(frame, 1, len(frame))
    assert (call.model_name, call.version, call.version_label, call.signature_name, call.output_filter) == (
        "ranker", 7, "", "serving_default", ["scores"])
    assert call.seconds_left is not None and 0 < call.seconds_left <= 31  # gRPC rounds deadlines up
    assert call.inputs.keys() == request.inputs.keys()
    for name, proto in request.inputs.items():
        expected = proto_to_ndarray(name, _info(proto.dtype), proto)
        decoded = raw_to_ndarray(name, _info(proto.dtype), call.inputs[name])
        assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
        np.testing.assert_array_equal(decoded, expected)
    main_process.send(forwarding.answer_frame(call.call_id, 0, "", b""))  # an empty response: OK
    assert future.result() == predict_pb2.PredictResponse()


def test_a_label_and_merged_messages_keep_protobuf_semantics(main_process):
    """Two serialized requests back to back are one merged request (protobuf's rule): the later input of a name
    wins, the model spec's fields merge. The codec parses with protobuf, so it sees what Python sees."""
    first = _request(ids=tf.make_tensor_proto(np.ones((1, 4), np.int32)), x=tf.make_tensor_proto(np.float32(1)))
    first.model_spec.version_label = "canary"
    second = _request(ids=tf.make_tensor_proto(np.full((2, 2), 9, np.int32)))
    second.model_spec.name = "other"
    payload = first.SerializeToString() + second.SerializeToString()
    future, kind, frame, _ = _call(main_process, payload)
    assert kind == Kind.PREDICT
    call = forwarding.parse_predict(frame, 1, len(frame))
    merged = predict_pb2.PredictRequest.FromString(payload)
    assert (call.model_name, call.version, call.version_label) == ("other", None, "canary")
    assert call.inputs.keys() == merged.inputs.keys()
    for name, proto in merged.inputs.items():
        np.testing.assert_array_equal(raw_to_ndarray(name, _info(proto.dtype), call.inputs[name]),
                                      proto_to_ndarray(name, _info(proto.dtype), proto))
    main_process.send(forwarding.answer_frame(call.call_id, 5, "not found", b""))
    with pytest.raises(grpc.RpcError) as failure:
        future.result()
    assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.NOT_FOUND, "not found")


def _unknown_rank() -> predict_pb2.PredictRequest:
    request = _request(x=tf.make_tensor_proto(np.ones(2, np.float32)))
    request.inputs["x"].tensor_shape.unknown_rank = True
    return request


FORWARDED_CASES = {
    "a string input": _request(x=tf.make_tensor_proto(np.array([b"a", b"bc"]))),
    "a half input": _request(x=tf.make_tensor_proto(np.ones(2, np.float16))),
    "a bool input beside an int32 one": _request(ids=tf.make_tensor_proto(np.ones(2, np.int32)),
                                                  x=tf.make_tensor_proto(np.ones(2, bool))),
    "unknown rank": _unknown_rank(),
    "no model_spec": predict_pb2.PredictRequest(),
    "no model name": _request(x=tf.make_tensor_proto(np.ones(2, np.float32))),
    "bytes that are no PredictRequest": b"\xff\xff\xff",
    "a model name that is no UTF-8": b"\x0a\x03\x0a\x01\xff",  # model_spec { name: "\xff" }
}
FORWARDED_CASES["no model name"].model_spec.name = ""


@pytest.mark.parametrize("case", sorted(FORWARDED_CASES))
def test_other_requests_arrive_as_their_bytes(main_process, case):
    """What the codec does not take apart, the main process parses (and names what is wrong) as before."""
    future, kind, frame, payload = _call(main_process, FORWARDED_CASES[case])
    assert kind == Kind.CALL
    call_id, method, _, _, body = forwarding.parse_call(frame, 1, len(frame))
    assert (method, body) == (PREDICT, payload)
    main_process.send(forwarding.answer_frame(call_id, 3, "checked by the main process", b""))
    with pytest.raises(grpc.RpcError) as failure:
        future.result()
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT


OUTPUTS = {
    "scores": np.array([0.25, 0.5, 1e-30], np.float32),
    "logits": np.array([[1.5, -2.0]], np.float64),
    "ids": np.arange(6, dtype=np.int32).reshape(2, 1, 3),
    "counts": np.array(2 ** 40, np.int64),
    "empty": np.zeros((0, 4), np.float32),
}


@pytest.mark.parametrize("as_tensor_content", [False, True])
def test_outputs_reach_the_client_as_the_main_process_would_encode_them(main_process, as_tensor_content):
    future, kind, frame, _ = _call(main_process, DECODED_CASES["scalar"])
    call = forwarding.parse_predict(frame, 1, len(frame))
    result = PredictResult("ranker", 42, "serving_default", OUTPUTS)
    main_process.send(forwarding.outputs_frame(call.call_id, result.model_name, result.version,
                                               result.signature_name, result.outputs, as_tensor_content))
    encoded_here = Predictor(None, None, None, tensor_content=as_tensor_content).predict_response(result)
    assert future.result() == encoded_here


def test_outputs_the_front_end_does_not_encode_are_left_to_the_main_process():
    assert forwarding.outputs_frame(1, "m", 1, "s", {"words": np.array([b"a"])}, False) is None
    assert forwarding.outputs_frame(1, "m", 1, "s", {"half": np.ones(2, np.float16)}, False) is None


def test_a_malformed_outputs_frame_fails_its_call_not_the_front_end(main_process):
    future, _, frame, _ = _call(main_process, DECODED_CASES["scalar"])
    call = forwarding.parse_predict(frame, 1, len(frame))
    good = b"".join(forwarding.outputs_frame(call.call_id, "m", 1, "s", {"x": np.ones(3, np.float32)}, False))
    truncated = good[:-5]
    main_process.link.sendall(forwarding.LENGTH.pack(len(truncated) - 4) + truncated[4:])
    with pytest.raises(grpc.RpcError) as failure:
        future.result()
    assert failure.value.code() == grpc.StatusCode.INTERNAL
    future, kind, frame, _ = _call(main_process, DECODED_CASES["scalar"])  # the front end still serves
    assert kind == Kind.PREDICT
    main_process.send(forwarding.answer_frame(forwarding.parse_predict(frame, 1, len(frame)).call_id, 0, "", b""))
    assert future.result() == predict_pb2.PredictResponse()


@pytest.mark.parametrize("descriptors", [b"", b"\x0a\x03not", predict_descriptor_set()[:-9]])
def test_without_usable_descriptors_every_call_goes_as_bytes(descriptors):
    played = PlayedMainProcess(descriptors)
    try:
        future, kind, frame, payload = _call(played, DECODED_CASES["scalar"])
        assert kind == Kind.CALL
        call_id, _, _, _, body = forwarding.parse_call(frame, 1, len(frame))
        assert body == payload
        played.send(forwarding.answer_frame(call_id, 0, "", b""))
        future.result()
    finally:
        log = played.close()
    assert ("Predict requests go to the main process as bytes" in log) == bool(descriptors)


VOCAB, TYPE_VOCAB, POSITIONS = 100, 2, 32


def _token_request(ids, mask, segments, typed: bool = False) -> predict_pb2.PredictRequest:
    def proto(values):
        values = np.asarray(values)
        if typed and values.dtype == np.int32:
            return _typed(types_pb2.DT_INT32, "int_val", values.ravel().tolist(), list(values.shape))
        return tf.make_tensor_proto(values)
    arrays = {"input_ids": ids, "input_mask": mask, "segment_ids": segments}
    return _request(**{name: proto(value) for name, value in arrays.items() if value is not None})


def _rows(lengths: list[int], seq: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Valid token inputs: real positions first, ids and segments inside the tables; padded positions hold values
    outside them, which the op never reads."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq) < np.array(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(0, VOCAB, mask.shape), VOCAB + 5).astype(np.int32)
    segments = np.where(mask == 1, rng.integers(0, TYPE_VOCAB, mask.shape), -3).astype(np.int32)
    return ids, mask, segments


def _edited(edit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids, mask, segments = _rows([5, 8, 2])
    edit(ids, mask, segments)
    return ids, mask, segments


TOKEN_CASES = {
    "valid, rows of several lengths": _rows([5, 8, 2]),
    "valid, as int_val": (*_rows([3, 1]), "typed"),
    "ids at the tables' last rows": _edited(lambda i, m, s: (i.__setitem__((0, 0), VOCAB - 1),
                                                             s.__setitem__((1, 7), TYPE_VOCAB - 1))),
    "a mask with a gap": _edited(lambda i, m, s: m.__setitem__((2, 4), 1)),
    "a mask value of 2": _edited(lambda i, m, s: m.__setitem__((1, 3), 2)),
    "a negative mask value at a padded position": _edited(lambda i, m, s: m.__setitem__((0, 7), -1)),
    "a negative id at a real position": _edited(lambda i, m, s: i.__setitem__((1, 0), -1)),
    "an id past the vocabulary": _edited(lambda i, m, s: i.__setitem__((0, 4), VOCAB)),
    "a segment past the type vocabulary": _edited(lambda i, m, s: s.__setitem__((2, 1), TYPE_VOCAB)),
    "int32 extremes at real positions": _edited(lambda i, m, s: (i.__setitem__((0, 1), 2 ** 31 - 1),
                                                                 s.__setitem__((0, 2), -2 ** 31))),
    "longer than the position table": _rows([POSITIONS + 1], seq=POSITIONS + 1),
    "no real positions": _rows([0, 0]),
    "no rows": _rows([]),
}
# Requests the front end leaves to the main process's own scan: no summary, the same answer.
UNSUMMARIZED_CASES = {
    "the mask missing": (_rows([3])[0], None, _rows([3])[2]),
    "shapes that differ": (_rows([3])[0], *_rows([3, 3])[1:]),
    "int64 ids": (_rows([3])[0].astype(np.int64), *_rows([3])[1:]),
    "one int_val value for the whole mask": (*_rows([2, 2]), "broadcast"),
    "rank 1": tuple(array[0] for array in _rows([3])),
    "no positions per row": tuple(np.zeros((4, 0), np.int32) for _ in range(3)),
}


def _expected_ranges(ids: np.ndarray, mask: np.ndarray, segments: np.ndarray) -> TokenRanges:
    """The summary worked out here with NumPy: the mask holds only 0 and 1, each row's ones first."""
    seq = mask.shape[1]
    lengths = (mask == 1).sum(axis=1)
    valid = np.isin(mask, (0, 1)).all() and (mask == (np.arange(seq) < lengths[:, None])).all()
    real = mask == 1
    if not valid or not real.any():
        return TokenRanges(bool(valid), 0, -1, 0, -1)
    return TokenRanges(True, int(ids[real].min()), int(ids[real].max()), int(segments[real].min()),
                       int(segments[real].max()))


def _check_outcome(rules, inputs: dict[str, np.ndarray], ranges) -> str:
    try:
        rules.check(inputs, ranges)
    except ServingError as refused:
        return f"{refused.code.name}: {refused.message}"
    return "accepted"


def _token_case(main_process, case):
    ids, mask, segments, *form = {**TOKEN_CASES, **UNSUMMARIZED_CASES}[case]
    request = _token_request(ids, mask, segments, typed=form == ["typed"])
    if form == ["broadcast"]:
        request.inputs["input_mask"].ClearField("tensor_content")
        request.inputs["input_mask"].int_val.append(1)
    future, kind, frame, _ = _call(main_process, request)
    assert kind == Kind.PREDICT
    call = forwarding.parse_predict(frame, 1, len(frame))
    main_process.send(forwarding.answer_frame(call.call_id, 0, "", b""))
    future.result()
    inputs = {name: raw_to_ndarray(name, _info(raw.dtype), raw) for name, raw in call.inputs.items()}
    return call.token_ranges, inputs


@pytest.fixture(scope="module")
def token_rules():
    infos = {name: meta_graph_pb2.TensorInfo(dtype=types_pb2.DT_INT32)
             for name in ("input_ids", "input_mask", "segment_ids")}
    rules = TokenInputRules.for_signature(infos, TokenLimits(VOCAB, TYPE_VOCAB, POSITIONS))
    if rules is None:
        pytest.skip("the op library's check did not load")
    return rules


@pytest.mark.parametrize("case", sorted(TOKEN_CASES))
def test_token_inputs_arrive_with_their_ranges_and_are_judged_as_the_op_judges(main_process, token_rules, case):
    """The front end measures the token inputs with the op's mask check; the main process then accepts on the
    ranges alone exactly what the op's full check accepts, and refuses the rest with the op's message."""
    ranges, inputs = _token_case(main_process, case)
    assert ranges == _expected_ranges(inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"])
    assert _check_outcome(token_rules, inputs, ranges) == _check_outcome(token_rules, inputs, None)


@pytest.mark.parametrize("case", sorted(UNSUMMARIZED_CASES))
def test_token_inputs_the_front_end_cannot_summarize_are_checked_in_full(main_process, token_rules, case):
    ranges, inputs = _token_case(main_process, case)
    assert ranges is None
    assert _check_outcome(token_rules, inputs, ranges) == _check_outcome(token_rules, inputs, None)


def test_ranges_outside_the_tables_go_to_the_full_check(token_rules):
    """Ranges only ever accept: any outside the model's tables, or a refused mask, send the request to the full
    check, which names what the op refuses."""
    ids, mask, segments = _edited(lambda i, m, s: i.__setitem__((0, 4), VOCAB))
    inputs = {"input_ids": ids, "input_mask": mask, "segment_ids": segments}
    for ranges in (TokenRanges(True, 0, VOCAB, 0, 1), TokenRanges(False, 0, 0, 0, 0),
                   TokenRanges(True, -1, 5, 0, 1), TokenRanges(True, 0, 5, 0, TYPE_VOCAB)):
        assert _check_outcome(token_rules, inputs, ranges) == (
            f"INVALID_ARGUMENT: input_ids[0,4] = {VOCAB} is out of range [0, {VOCAB}) (rows of word_embeddings)")
