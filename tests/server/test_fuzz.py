"""1,000 malformed requests (gRPC and REST) get error statuses only; the server stays up and its memory bounded."""

from __future__ import annotations

import json

import grpc
import numpy as np
import psutil
import pytest
import requests
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

from tiny_models import VOCAB, predict_request, token_inputs

RSS_GROWTH_BOUND_MB = 150  # the server's resident memory may grow at most this much over the 1,000 requests
GRPC_CASES, REST_CASES = 600, 400
WRONG_DTYPES = [types_pb2.DT_FLOAT, types_pb2.DT_INT64, types_pb2.DT_INT8, types_pb2.DT_STRING, types_pb2.DT_BOOL,
                types_pb2.DT_HALF, types_pb2.DT_DOUBLE, types_pb2.DT_UINT8, 999]


def _shape(*dims: int) -> tensor_shape_pb2.TensorShapeProto:
    return tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims])


def _malformed_grpc(rng: np.random.Generator, kind: int):
    """One PredictRequest broken in the way `kind` says (every kind breaks the request for sure)."""
    batch, seq = int(rng.integers(1, 5)), int(rng.integers(1, 16))
    request = predict_request("tiny", token_inputs(batch, seq, seed=int(rng.integers(1 << 30))))
    name = ["input_ids", "input_mask", "segment_ids"][int(rng.integers(3))]
    target = request.inputs[name]
    if kind == 0:    # wrong dtype, content kept
        target.dtype = WRONG_DTYPES[int(rng.integers(len(WRONG_DTYPES)))]
    elif kind == 1:  # wrong rank
        rank = [0, 1, 3, 4][int(rng.integers(4))]
        dims = [int(d) for d in rng.integers(1, 4, size=rank)]
        target.CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, tensor_shape=_shape(*dims),
                                               tensor_content=np.zeros(dims, np.int32).tobytes()))
    elif kind == 2:  # renamed input
        request.inputs["".join(chr(int(c)) for c in rng.integers(33, 0x2FF, size=8))].CopyFrom(target)
        del request.inputs[name]
    elif kind == 3:  # missing input
        del request.inputs[name]
    elif kind == 4:  # tensor_content of the wrong length
        target.tensor_content = rng.bytes(int(rng.integers(0, 64)) * 4 + 1)
    elif kind == 5:  # huge declared shape, tiny content
        target.tensor_shape.CopyFrom(_shape(10 ** 6, 10 ** 6))
    elif kind == 6:  # negative dimension
        target.tensor_shape.CopyFrom(_shape(-1, seq))
    elif kind == 7:  # ids outside the vocabulary
        ids = rng.integers(VOCAB, 1 << 30, size=(batch, seq)).astype(np.int32) * (1 if rng.random() < .5 else -1)
        request.inputs["input_ids"].tensor_content = ids.tobytes()
    elif kind == 8:  # mask values other than 0/1
        request.inputs["input_mask"].tensor_content = np.full((batch, seq), 5, np.int32).tobytes()
    elif kind == 9:  # unknown model
        request.model_spec.name = rng.bytes(6).hex()
    elif kind == 10:  # unknown signature
        request.model_spec.signature_name = rng.bytes(5).hex()
    elif kind == 11:  # unknown output in output_filter
        request.output_filter.append(rng.bytes(4).hex())
    elif kind == 12:  # batch dims disagree between inputs
        request.inputs["input_mask"].CopyFrom(predict_request("x", token_inputs(batch + 1, seq)).inputs["input_mask"])
    elif kind == 13:  # unknown version or label
        if rng.random() < 0.5:
            request.model_spec.version.value = int(rng.integers(3, 1 << 40))
        else:
            request.model_spec.version_label = rng.bytes(3).hex()
    else:            # larger than max_batch_size
        request = predict_request("tiny", token_inputs(33, 2))
    return request


def _malformed_rest(rng: np.random.Generator, kind: int, base: str) -> requests.Response:
    url = f"{base}/v1/models/tiny:predict"
    good = token_inputs(2, 6, seed=int(rng.integers(1 << 30)))
    rows = [{n: v[i].tolist() for n, v in good.items()} for i in range(2)]
    bodies = {
        0: lambda: rng.bytes(int(rng.integers(1, 300))),
        1: lambda: b'{"instances": [' + rng.bytes(20).hex().encode(),
        2: lambda: json.dumps([1, 2, 3]).encode(),
        3: lambda: json.dumps({"instances": [{**rows[0], "input_ids": "hello"}]}).encode(),
        4: lambda: json.dumps({"instances": [{**rows[0], "input_ids": rows[0]["input_ids"][:-1]}, rows[1]]}).encode(),
        5: lambda: json.dumps({"inputs": {**{n: v.tolist() for n, v in good.items()},
                                          "input_ids": (good["input_ids"] + 0.5).tolist()}}).encode(),
        6: lambda: json.dumps({"inputs": {**{n: v.tolist() for n, v in good.items()},
                                          "segment_ids": [[2 ** 40] * 6] * 2}}).encode(),
        7: lambda: json.dumps({"instances": rows, "inputs": {}}).encode(),
        8: lambda: json.dumps({"signature_name": 7, "instances": rows}).encode(),
        9: lambda: json.dumps({"instances": []}).encode(),
        10: lambda: json.dumps({"instances": [[1, 2], [3]]}).encode(),
        11: lambda: json.dumps({"inputs": {"input_ids": {"nested": [1]}}}).encode(),
    }
    if kind == 12:
        return requests.get(f"{base}/v1/models/{rng.bytes(4).hex()}/versions/x/{rng.bytes(2).hex()}", timeout=30)
    if kind == 13:
        return requests.put(url, data=b"{}", timeout=30)
    return requests.post(url, data=bodies[kind](), headers={"Content-Type": "application/json"}, timeout=30)


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    from serving_harness import ServerProcess
    config = tmp_path_factory.mktemp("fuzz") / "batching.txt"
    config.write_text("max_batch_size { value: 32 } batch_timeout_micros { value: 1000 }")
    process = ServerProcess("--model_name=tiny", f"--model_base_path={models_dir}/tiny", "--enable_batching",
                            f"--batching_parameters_file={config}", log_dir=str(config.parent)).wait_ready()
    yield process
    assert process.terminate() == 0


def test_malformed_requests_get_errors_only_and_memory_stays_bounded(server):
    rng = np.random.default_rng(1234)
    valid = predict_request("tiny", token_inputs(4, 8))
    for _ in range(20):  # warm the process up before taking the baseline
        server.predict.Predict(valid, timeout=30)
    memory = psutil.Process(server.proc.pid)
    baseline_mb = memory.memory_info().rss / 2 ** 20

    structured = [server.predict.Predict.future(_malformed_grpc(rng, i % 15), timeout=60)
                  for i in range(GRPC_CASES - 50)]
    raw = server.channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    garbage = [raw.future(rng.bytes(int(rng.integers(1, 200))), timeout=60) for _ in range(50)]

    def codes(futures) -> set[grpc.StatusCode]:
        found = set()
        for future in futures:
            with pytest.raises(grpc.RpcError) as info:
                future.result()
            found.add(info.value.code())
        return found

    grpc_codes = codes(structured)
    assert grpc_codes <= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                          grpc.StatusCode.FAILED_PRECONDITION}, grpc_codes
    # Random bytes are no PredictRequest (INVALID_ARGUMENT naming the type), or parse as one with an empty model
    # spec (INVALID_ARGUMENT, as TF Serving) or naming no loaded model (NOT_FOUND): never OK, never UNKNOWN.
    garbage_codes = codes(garbage)
    assert garbage_codes <= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}, garbage_codes
    # A truncated length-delimited field cannot parse at all.
    with pytest.raises(grpc.RpcError) as unparsable:
        raw(b"\x0a\xff\x01", timeout=60)
    assert unparsable.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid tensorflow.serving.PredictRequest" in unparsable.value.details()
    http_codes = set()
    for i in range(REST_CASES):
        reply = _malformed_rest(rng, i % 14, server.rest)
        assert reply.status_code >= 400, (i % 14, reply.text)
        http_codes.add(reply.status_code)
    assert 500 not in http_codes

    assert server.proc.poll() is None
    reply = server.predict.Predict(valid, timeout=30)
    assert reply.outputs["scores"].tensor_shape.dim[0].size == 4
    growth_mb = memory.memory_info().rss / 2 ** 20 - baseline_mb
    assert growth_mb < RSS_GROWTH_BOUND_MB, f"RSS grew {growth_mb:.0f} MB"
    print(f"gRPC codes {sorted(c.name for c in grpc_codes | garbage_codes)}; HTTP {sorted(http_codes)}; RSS +{growth_mb:.1f} MB "
          f"from {baseline_mb:.0f} MB")
