"""A request the fused op would refuse is refused before it joins a batch, by the op's own rules, so one bad
client never fails the batches of the others."""

from __future__ import annotations

import re
import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from bertserve.export.saved import warmup_inputs
from bertserve.server.errors import ServingError
from bertserve.server.token_inputs import TokenInputRules, TokenLimits
from test_exported_models import CONFIG, _config_file, exported  # noqa: F401 - exported is a fixture
from tiny_models import predict_request

SEQ = 16
GOOD_CLIENTS, REQUESTS_EACH = 8, 30


def _hostile(case: str) -> dict[str, np.ndarray]:
    """Two rows the op refuses for one reason each (the second row stays valid)."""
    inputs = {name: value.copy() for name, value in warmup_inputs(CONFIG, 2, SEQ, seed=3).items()}
    inputs["input_mask"][0] = 0
    inputs["input_mask"][0, :6] = 1
    if case == "mask_gap":
        inputs["input_mask"][0, 7] = 1  # 1 1 1 1 1 1 0 1
    elif case == "mask_value":
        inputs["input_mask"][0, 2] = 2
    elif case == "id_past_vocab":
        inputs["input_ids"][0, 5] = CONFIG.vocab_size
    elif case == "negative_id":
        inputs["input_ids"][0, 0] = -1
    elif case == "segment_past_type_vocab":
        inputs["segment_ids"][0, 1] = CONFIG.type_vocab_size
    elif case == "too_long":
        inputs = warmup_inputs(CONFIG, 2, CONFIG.max_position_embeddings + 1, seed=3)
    return inputs


CASES = {
    "mask_gap": "input_mask row 0 has a gap: position 6 is 0 but position 7 is 1 (real positions must come first)",
    "mask_value": "input_mask[0,2] = 2 but a mask value must be 0 or 1",
    "id_past_vocab": f"input_ids[0,5] = {CONFIG.vocab_size} is out of range [0, {CONFIG.vocab_size}) "
                     f"(rows of word_embeddings)",
    "negative_id": f"input_ids[0,0] = -1 is out of range [0, {CONFIG.vocab_size}) (rows of word_embeddings)",
    "segment_past_type_vocab": f"segment_ids[0,1] = {CONFIG.type_vocab_size} is out of range "
                               f"[0, {CONFIG.type_vocab_size}) (rows of token_type_embeddings)",
    "too_long": f"sequence length {CONFIG.max_position_embeddings + 1} exceeds the max positions of "
                f"position_embeddings ({CONFIG.max_position_embeddings})",
}


def _op_error(inputs: dict[str, np.ndarray]) -> str | None:
    """What the fused BertEmbedding op itself says about these inputs (None: it accepts them)."""
    from bertserve import custom_ops

    rng = np.random.default_rng(0)
    hidden = CONFIG.hidden_size

    def table(rows):
        return tf.constant(rng.standard_normal((rows, hidden)).astype(np.float32))

    try:
        custom_ops.bert_embedding(
            tf.constant(inputs["input_ids"]), tf.constant(inputs["segment_ids"]), tf.constant(inputs["input_mask"]),
            table(CONFIG.vocab_size), table(CONFIG.max_position_embeddings), table(CONFIG.type_vocab_size),
            tf.ones([hidden]), tf.zeros([hidden]))
    except tf.errors.InvalidArgumentError as exc:  # eager wraps the kernel's text: {{function_node ...}} TEXT [Op:...]
        return re.search(r"\}\} (.*) \[Op:", exc.message).group(1)
    return None


def _server_rules() -> TokenInputRules:
    infos = {name: meta_graph_pb2.TensorInfo(dtype=types_pb2.DT_INT32)
             for name in ("input_ids", "input_mask", "segment_ids")}
    rules = TokenInputRules.for_signature(
        infos, TokenLimits(CONFIG.vocab_size, CONFIG.type_vocab_size, CONFIG.max_position_embeddings))
    assert rules is not None, "the op library's check did not load"
    return rules


@pytest.mark.parametrize("case", sorted(CASES))
def test_server_refuses_what_the_op_refuses_with_its_message(case):
    inputs = _hostile(case)
    assert _op_error(inputs) == CASES[case]
    with pytest.raises(ServingError) as info:
        _server_rules().check(inputs)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and info.value.message == CASES[case]


def test_server_accepts_what_the_op_accepts():
    """Ids out of range on padded positions are never read by the op, so they pass both."""
    inputs = _hostile("none")
    inputs["input_ids"][0, 10:] = CONFIG.vocab_size + 7
    inputs["segment_ids"][0, 10:] = -4
    assert _op_error(inputs) is None
    _server_rules().check(inputs)
    other_model = {"input_ids": meta_graph_pb2.TensorInfo(dtype=types_pb2.DT_INT64)}
    assert TokenInputRules.for_signature(other_model, TokenLimits(1, 1, 1)) is None  # not the bertserve contract


def test_one_bad_client_never_fails_the_batches_of_the_others(exported, tmp_path, start_server):  # noqa: F811
    base, variants = exported
    if "fused" not in variants:
        pytest.skip("op library not built: no fused export")
    (tmp_path / "batching.txt").write_text(
        "max_batch_size { value: 32 } batch_timeout_micros { value: 5000 } max_enqueued_batches { value: 1000 } "
        "num_batch_threads { value: 1 }")
    server = start_server(_config_file(tmp_path, base, variants), "--enable_batching",
                          f"--batching_parameters_file={tmp_path / 'batching.txt'}")
    good = warmup_inputs(CONFIG, 2, SEQ, seed=5)
    failures, refused, stop = [], [], threading.Event()

    def good_client(model: str) -> None:
        for _ in range(REQUESTS_EACH):
            try:
                server.predict.Predict(predict_request(model, good), timeout=300)
            except grpc.RpcError as exc:
                failures.append(f"{model}: {exc.code()}: {exc.details()}")

    def bad_client(model: str) -> None:
        while not stop.is_set():
            for case, message in CASES.items():
                try:
                    server.predict.Predict(predict_request(model, _hostile(case)), timeout=300)
                    refused.append(f"{case} was served")
                except grpc.RpcError as exc:
                    refused.append("ok" if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and exc.details() == message
                                   else f"{case}: {exc.code()}: {exc.details()}")

    for model in variants:
        bad = threading.Thread(target=bad_client, args=(model,))
        clients = [threading.Thread(target=good_client, args=(model,)) for _ in range(GOOD_CLIENTS)]
        bad.start()
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        stop.set()
        bad.join()
        stop.clear()
    assert failures == []
    assert refused and set(refused) == {"ok"}, sorted(set(refused))[:5]
