"""`--validate`: the exported files against the float64 NumPy reference built from the same BertWeights.

Runs the SavedModel as TF Serving would (tf.saved_model.load + the serving_default signature) and the ONNX file
with onnxruntime, on seeded pairs of mixed real lengths padded to max_seq_length, and fails beyond the tolerance
of the precision (scores are in 0..1).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from bertserve.export import reference
from bertserve.export.errors import ValidationError
from bertserve.export.onnx_export import OnnxRanker
from bertserve.export.samples import mixed_length_inputs
from bertserve.export.weights import BertWeights
from bertserve.model_dir import OUTPUT_NAME, SIGNATURE_NAME

# bf16 keeps 8 significant bits to fp16's 11: its scores moved up to 7.8e-3 from fp32 on MiniLM and 6.5e-3 on the
# random chit-chat model (256 mixed-length rows each, bench/cpu_encoder.py), above fp16's bar; this is about twice that.
TOLERANCES = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 2e-2}
SAMPLE_ROWS = 12


@dataclasses.dataclass(frozen=True)
class ValidationRow:
    target: str
    precision: str
    max_abs_diff: float
    rows: int

    @property
    def tolerance(self) -> float:
        return TOLERANCES[self.precision]

    @property
    def ok(self) -> bool:
        return bool(self.max_abs_diff <= self.tolerance)


def saved_model_scores(version_dir: str, inputs: dict[str, np.ndarray], variant: str) -> np.ndarray:
    """Scores from the SavedModel's serving_default signature, loaded as a server loads it."""
    if variant == "fused":
        from bertserve import custom_ops

        custom_ops.load_op_library()  # registers the ops, as a server built with them does at start
    signature = tf.saved_model.load(version_dir).signatures[SIGNATURE_NAME]
    return signature(**{k: tf.constant(v, tf.int32) for k, v in inputs.items()})[OUTPUT_NAME].numpy()


def validate_export(weights: BertWeights, version_dir: str, variant: str, precision: str, seq_length: int,
                    onnx_path: str | None = None) -> list[ValidationRow]:
    """Max |score diff| of each exported file vs the reference; raises ValidationError if any is out of tolerance."""
    inputs = mixed_length_inputs(weights.config, SAMPLE_ROWS, seq_length)
    expected = reference.scores(weights, inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"])
    saved_scores = saved_model_scores(version_dir, inputs, variant)
    rows = [ValidationRow(f"saved_model ({variant})", precision, float(np.max(np.abs(saved_scores - expected))),
                          len(expected))]
    if onnx_path is not None:
        onnx_scores = OnnxRanker(onnx_path).scores(**inputs)
        rows.append(ValidationRow("onnx (stock)", "fp32", float(np.max(np.abs(onnx_scores - expected))),
                                  len(expected)))
    failed = [row for row in rows if not row.ok]
    if failed:
        raise ValidationError(f"{version_dir}:\n" + format_table(rows) + "\n" + "; ".join(
            f"{row.target} differs from the reference by {row.max_abs_diff:.3g} > {row.tolerance:g}"
            for row in failed))
    return rows


def format_table(rows: list[ValidationRow]) -> str:
    lines = [f"{'target':<28} {'precision':<9} {'rows':>4} {'max |score diff|':>17} {'tolerance':>9}  result"]
    lines += [f"{r.target:<28} {r.precision:<9} {r.rows:>4} {r.max_abs_diff:>17.3e} {r.tolerance:>9.0e}  "
              f"{'ok' if r.ok else 'FAIL'}" for r in rows]
    return "\n".join(lines)
