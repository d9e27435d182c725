"""The stock fp32 ranker through tf2onnx, written beside the TF Serving versions:

    <base>/<model>/onnx/<version>/model.onnx

(a non-numeric folder, so TF Serving's version scan of <base>/<model>/ ignores it). Whatever variant the
SavedModel is, the ONNX file is always the stock fp32 graph of the same weights: standard ops only, GELU as Erf
(tf2onnx cannot convert Erfc), padding by masking. The graph's input asserts have no ONNX counterpart and are
dropped by the converter; onnxruntime's Gather still rejects out-of-range ids.

The weights reach tf2onnx as graph inputs, not as the frozen graph's constants, and become the model's
initializers afterwards. tf2onnx deep-copies its whole graph, constants included, before each of its optimizer
passes, and those copies pile up: converting the frozen graph of one chit-chat-sized layer (hidden 768, FFN
3072) peaked at 6.6 GiB, so six layers did not fit in 23 GB. Per-layer arrays are split into one initializer per
layer, so the graph reads each directly where the frozen graph would have folded a slice of the stacked array.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime
import tensorflow as tf
import tf2onnx
from onnx import numpy_helper

from bertserve.export import stock
from bertserve.export.errors import ValidationError
from bertserve.export.samples import mixed_length_inputs
from bertserve.export.signature import INPUT_SIGNATURE
from bertserve.export.weights import LAYER_ARRAY_NAMES, BertWeights
from bertserve.model_dir import INPUT_NAMES, OUTPUT_NAME

ONNX_OPSET = 17
CHECK_ROWS, CHECK_SEQ_LENGTH, CHECK_TOLERANCE = 4, 16, 1e-5


def onnx_path(base: str, model_name: str, version: int) -> str:
    return os.path.join(base, model_name, "onnx", str(version), "model.onnx")


def initializer_arrays(weights: BertWeights) -> dict[str, np.ndarray]:
    """Initializer name -> array: BertWeights names, per-layer arrays split as `layer_<i>_<name>`."""
    arrays: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        if name in LAYER_ARRAY_NAMES:
            arrays.update((f"layer_{layer}_{name}", value[layer]) for layer in range(weights.config.num_hidden_layers))
        else:
            arrays[name] = value
    return arrays


def _stock_function_of_weights(weights: BertWeights,
                               arrays: dict[str, np.ndarray]) -> tf.types.experimental.PolymorphicFunction:
    """The stock ranker as a tf.function taking the signature's inputs followed by every array of `arrays`."""
    names = list(arrays)
    specs = INPUT_SIGNATURE + [tf.TensorSpec(arrays[name].shape, tf.float32, name=name) for name in names]
    layers = range(weights.config.num_hidden_layers)

    @tf.function(input_signature=specs)
    def serve(input_ids, input_mask, segment_ids, *values):
        given = dict(zip(names, values))
        w = {name: [given[f"layer_{layer}_{name}"] for layer in layers] if name in LAYER_ARRAY_NAMES
             else given[name] for name, _ in weights.items()}
        return {OUTPUT_NAME: stock.ranker_scores(w, weights.config, input_ids, input_mask, segment_ids)}

    return serve


def _inputs_to_initializers(model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> None:
    """Moves the weight graph inputs into initializers, leaving the signature's inputs as the only inputs."""
    inputs = [i for i in model.graph.input if i.name not in arrays]
    if [i.name for i in inputs] != list(INPUT_NAMES) or len(model.graph.input) != len(inputs) + len(arrays):
        raise ValidationError(f"tf2onnx graph inputs are {[i.name for i in model.graph.input][:8]}..., "
                              f"expected {list(INPUT_NAMES)} followed by the weights")
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in arrays.items())


def export_onnx(weights: BertWeights, path: str, opset: int = ONNX_OPSET) -> str:
    """Converts the stock fp32 graph to a self-contained ONNX file at path (weights as initializers), then checks
    it: onnx.checker, and onnxruntime's scores against the TensorFlow function it came from on a few mixed-length
    rows. Returns path."""
    arrays = initializer_arrays(weights)
    serve = _stock_function_of_weights(weights, arrays)
    model, _ = tf2onnx.convert.from_function(serve, input_signature=serve.input_signature, opset=opset)
    outputs = [o.name for o in model.graph.output]
    if outputs != [OUTPUT_NAME]:
        raise ValidationError(f"{path}: ONNX outputs are {outputs}, expected [{OUTPUT_NAME!r}]")
    _inputs_to_initializers(model, arrays)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(model, path)
    del model
    onnx.checker.check_model(path)
    seq_length = min(CHECK_SEQ_LENGTH, weights.config.max_position_embeddings)
    inputs = mixed_length_inputs(weights.config, CHECK_ROWS, seq_length)
    expected = serve(*(inputs[name] for name in INPUT_NAMES), *arrays.values())[OUTPUT_NAME].numpy()
    diff = float(np.max(np.abs(OnnxRanker(path).scores(**inputs) - expected)))
    if diff > CHECK_TOLERANCE:
        raise ValidationError(f"{path}: onnxruntime scores differ from the TensorFlow graph by {diff:.3g}")
    return path


class OnnxRanker:
    """Runs an exported ONNX ranker with onnxruntime on CPU (same inputs and output as the signature).

    threads: intra-op threads (0: onnxruntime's default); session_config: extra session config entries, e.g.
    {"session.force_spinning_stop": "1"} (bench/cpu_encoder.py) so idle workers stop spinning after a run."""

    def __init__(self, path: str, threads: int = 0, session_config: Mapping[str, str] | None = None):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        for key, value in (session_config or {}).items():
            options.add_session_config_entry(key, value)
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def scores(self, input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
        feeds = zip(INPUT_NAMES, (input_ids, input_mask, segment_ids))
        (scores,) = self.session.run([OUTPUT_NAME], {k: np.asarray(v, np.int32) for k, v in feeds})
        return scores
