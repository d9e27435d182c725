"""Requests of a few hundred bytes that declare gigabytes are refused before anything is allocated: a TensorProto
whose one value would fill 2^26 elements, complex128 inputs for an int32 signature, an empty tensor whose other
dimension is 2^30, a tf.Example context copied into thousands of examples. The server runs under an
address-space limit (RLIMIT_AS), so a regression fails these tests, not the machine."""

from __future__ import annotations

import concurrent.futures

import grpc
import numpy as np
import psutil
import pytest
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2

from conftest import tf_serving_config
from tf_serving_models import classification_request, example
from tiny_models import predict_request, tensor, token_inputs

# About 1.5 GB above what the server maps after loading the models: a request that made it allocate gigabytes
# would fail in the server (or kill it), not exhaust the machine.
ADDRESS_SPACE_LIMIT = 4_500 << 20
RSS_GROWTH_BOUND_MB = 100


def _shape(*dims: int) -> tensor_shape_pb2.TensorShapeProto:
    return tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims])


def _tokens(**protos: tensor_pb2.TensorProto) -> predict_pb2.PredictRequest:
    request = predict_request("tiny", token_inputs(1, 4))
    for name, proto in protos.items():
        request.inputs[name].CopyFrom(proto)
    return request


def _one_value_filling(dims: tuple[int, ...]) -> tensor_pb2.TensorProto:
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, tensor_shape=_shape(*dims), int_val=[1])


HOSTILE = {
    # One int_val declared as 2^26 elements (TensorFlow fills the rest with it).
    "one value, 2^26 elements": (_tokens(input_ids=_one_value_filling((1 << 13, 1 << 13))), "carries 1 values"),
    # An empty tensor whose other dimension is 2^30: [2^30] scores would come out.
    "[2^30, 0] shape": (_tokens(**{name: tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, tensor_shape=_shape(
        1 << 30, 0)) for name in ("input_ids", "input_mask", "segment_ids")}), "[1073741824, 0]"),
    # complex128 for an int32 input: refused by dtype before its 2^26 declared elements are decoded.
    "complex128": (_tokens(input_ids=tensor_pb2.TensorProto(
        dtype=types_pb2.DT_COMPLEX128, tensor_shape=_shape(1 << 13, 1 << 13), dcomplex_val=[1.0, 0.0])),
        "Expects arg[input_ids] to be int32 but complex128 is provided"),
}


@pytest.fixture(scope="module")
def limited_server(tf_serving_models, models_dir, tmp_path_factory):
    from serving_harness import ServerProcess
    config_dir = tmp_path_factory.mktemp("amplification")
    config = tf_serving_config(tf_serving_models, str(config_dir / "models.config"), models_dir)
    (config_dir / "batching.txt").write_text("max_batch_size { value: 64 } batch_timeout_micros { value: 1000 }")
    process = ServerProcess(f"--model_config_file={config}", "--enable_batching",
                            f"--batching_parameters_file={config_dir}/batching.txt", log_dir=str(config_dir),
                            address_space_limit=ADDRESS_SPACE_LIMIT).wait_ready()
    yield process
    assert process.terminate() == 0


def test_declared_sizes_and_dtypes_are_refused_before_allocation(limited_server):
    valid = predict_request("tiny", token_inputs(2, 8))
    for _ in range(5):
        limited_server.predict.Predict(valid, timeout=60)
    memory = psutil.Process(limited_server.proc.pid)
    baseline_mb = memory.memory_info().rss / 2 ** 20
    for case, (request, text) in HOSTILE.items():
        assert request.ByteSize() < 1500, case
        # Eight at once, as an attacker would send them.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(limited_server.predict.Predict, request, timeout=60) for _ in range(8)]
            for future in futures:
                with pytest.raises(grpc.RpcError) as info:
                    future.result()
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (case, info.value.details())
                assert text in info.value.details(), (case, info.value.details())
    half = predict_pb2.PredictRequest()
    half.model_spec.name = "half_plus_two"
    half.inputs["x"].CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=_shape(1 << 26),
                                                     float_val=[1.0]))
    with pytest.raises(grpc.RpcError) as info:
        limited_server.predict.Predict(half, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "carries 1 values" in info.value.details()
    assert limited_server.proc.poll() is None
    np.testing.assert_allclose(tensor(limited_server.predict.Predict(valid, timeout=60).outputs["scores"]).shape, [2])
    growth_mb = memory.memory_info().rss / 2 ** 20 - baseline_mb
    assert growth_mb < RSS_GROWTH_BOUND_MB, f"RSS grew {growth_mb:.0f} MB"


def test_a_context_copied_into_many_examples_is_refused(limited_server):
    context = example(padding=b"x" * 20_000)
    request = classification_request("iris", [example()] * 5_000, context=context)
    assert request.ByteSize() < 40_000
    with pytest.raises(grpc.RpcError) as info:
        limited_server.predict.Classify(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "copied into each of 5000 examples" in (
        info.value.details())


def test_small_broadcasts_still_decode_as_tensorflow_fills_them(limited_server):
    """Within the bound, one value declared for a whole tensor fills it as TensorFlow's Tensor::FromProto does."""
    request = predict_request("tiny", token_inputs(2, 8))
    request.inputs["segment_ids"].CopyFrom(_one_value_filling((2, 8)))
    request.inputs["input_mask"].CopyFrom(_one_value_filling((2, 8)))
    reply = limited_server.predict.Predict(request, timeout=60)
    assert tensor(reply.outputs["scores"]).shape == (2,)
