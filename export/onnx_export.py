"""The stock fp32 ranker through tf2onnx, written beside the TF Serving versions:

    <base>/<model>/onnx/<version>/model.onnx

(a non-numeric folder, so TF Serving's version scan of <base>/<model>/ ignores it). Whatever variant the
SavedModel is, the ONNX file is always the stock fp32 graph of the same weights: standard ops only, GELU as Erf
(tf2onnx cannot convert Erfc), padding by masking. The graph's input asserts have no ONNX counterpart and are
dropped by the converter; onnxruntime's Gather still rejects out-of-range ids.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime
import tf2onnx

from bertserve.export.graph import build_ranker_module
from bertserve.export.samples import mixed_length_inputs
from bertserve.export.signature import INPUT_SIGNATURE, OUTPUT_NAME
from bertserve.export.validate import ValidationError
from bertserve.export.weights import BertWeights

ONNX_OPSET = 17
CHECK_ROWS, CHECK_SEQ_LENGTH, CHECK_TOLERANCE = 4, 16, 1e-5


def onnx_path(base: str, model_name: str, version: int) -> str:
    return os.path.join(base, model_name, "onnx", str(version), "model.onnx")


def export_onnx(weights: BertWeights, path: str, opset: int = ONNX_OPSET) -> str:
    """Converts the stock fp32 graph to ONNX at path, then checks the file: onnx.checker, and onnxruntime's scores
    against the TensorFlow graph it came from on a few mixed-length rows. Returns path."""
    module = build_ranker_module(weights, variant="stock", precision="fp32")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    model, _ = tf2onnx.convert.from_function(module.serving_default, input_signature=INPUT_SIGNATURE,
                                             opset=opset, output_path=path)
    onnx.checker.check_model(path)
    if [o.name for o in model.graph.output] != [OUTPUT_NAME]:
        outputs = [o.name for o in model.graph.output]
        raise ValidationError(f"{path}: ONNX outputs are {outputs}, expected [{OUTPUT_NAME!r}]")
    seq_length = min(CHECK_SEQ_LENGTH, weights.config.max_position_embeddings)
    inputs = mixed_length_inputs(weights.config, CHECK_ROWS, seq_length)
    expected = module.serving_default(**inputs)[OUTPUT_NAME].numpy()
    diff = float(np.max(np.abs(OnnxRanker(path).scores(**inputs) - expected)))
    if diff > CHECK_TOLERANCE:
        raise ValidationError(f"{path}: onnxruntime scores differ from the TensorFlow graph by {diff:.3g}")
    return path


class OnnxRanker:
    """Runs an exported ONNX ranker with onnxruntime on CPU (same inputs and output as the signature)."""

    def __init__(self, path: str, threads: int = 0):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def scores(self, input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}
        (scores,) = self.session.run([OUTPUT_NAME], {k: np.asarray(v, np.int32) for k, v in feeds.items()})
        return scores
