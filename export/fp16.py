"""FP16 conversion pass: rewrites the stock fp32 ranker GraphDef so its GEMMs, attention and weights are fp16.

This is the conversion teams serving BERT on stock TF Serving apply to a trained graph: walk the GraphDef, give
every op a precision, retype it and insert Casts at the borders. The weights enter the graph as placeholders, so
the pass also decides each weight's storage dtype (half unless every consumer stays fp32), and the SavedModel
stores them as half variables: half the size on disk.

The rules (like TensorFlow's mixed-precision allow / deny / infer lists):
- fp16 always (`FP16_OPS`): MatMul and BatchMatMulV2, i.e. nearly all of the FLOPs (dense layers, Q.K^T,
  probs.V), and the weights they read.
- fp32 always (`KEEP_FP32_OPS`):
  - LayerNorm statistics (`Mean`, `SquaredDifference`, `Rsqrt`): a mean of squares over hundreds of channels
    loses digits in fp16, and BERT's epsilon 1e-12 is below fp16's smallest subnormal (6e-8), so
    `variance + eps` would round to `variance` and a constant row would divide by zero.
  - `Softmax` (attention probabilities, a 2-label head): exp and the row sum are where fp16 overflows and
    underflows.
  - the final `Sigmoid` and the output: the contract is float32 scores, and fp16's spacing near 1.0 (4.9e-4)
    would quantise confident scores.
- every other op follows its inputs: fp32 if any float input is fp32, else fp16. So bias adds, GELU (Erf),
  tanh, the attention scale and mask run in fp16 after their GEMM, while LayerNorm's normalise/scale/shift and
  the residual adds, whose input is a LayerNorm output, stay fp32: the residual stream is kept in fp32. That is
  deliberate: with the residual adds in fp16 too, MiniLM's scores moved by up to 5.4e-3 from the float64
  reference on CPU (over the 5e-3 budget); with an fp32 residual stream the error is ~1e-3, like the fused fp16
  kernels'. Embedding lookups read half tables (a lookup does no arithmetic); LayerNorm gamma/beta stay fp32
  (tiny).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.framework import op_def_registry

from bertserve.export import stock
from bertserve.export.signature import INPUT_SIGNATURE
from bertserve.export.weights import BertWeights

KEEP_FP32_OPS = frozenset({"Mean", "SquaredDifference", "Rsqrt", "Softmax", "Sigmoid"})
FP16_OPS = frozenset({"MatMul", "BatchMatMulV2"})
WEIGHT_INPUT_PREFIX = "weight_"

FP32, HALF = types_pb2.DT_FLOAT, types_pb2.DT_HALF
_FLOATS = (FP32, HALF)


def _split_input(ref: str) -> tuple[str, int]:
    name, _, index = ref.partition(":")
    return name, int(index or 0)


def _arg_dtypes(node: node_def_pb2.NodeDef, args) -> list[int]:
    """Dtype of each tensor of an input or output arg list, expanded for list args."""
    dtypes: list[int] = []
    for arg in args:
        if arg.type_list_attr:
            dtypes += list(node.attr[arg.type_list_attr].list.type)
            continue
        dtype = arg.type or node.attr[arg.type_attr].type
        dtypes += [dtype] * (node.attr[arg.number_attr].i if arg.number_attr else 1)
    return dtypes


def _input_dtypes(node: node_def_pb2.NodeDef) -> list[int]:
    return _arg_dtypes(node, op_def_registry.get(node.op).input_arg)


def _output_dtypes(node: node_def_pb2.NodeDef) -> list[int]:
    return _arg_dtypes(node, op_def_registry.get(node.op).output_arg)


def _data_inputs(node: node_def_pb2.NodeDef) -> list[str]:
    return [ref for ref in node.input if not ref.startswith("^")]


def _topological_order(graph_def: graph_pb2.GraphDef) -> list[node_def_pb2.NodeDef]:
    nodes = {n.name: n for n in graph_def.node}
    pending = {n.name: {_split_input(ref.lstrip("^"))[0] for ref in n.input} for n in graph_def.node}
    consumers: dict[str, list[str]] = {name: [] for name in nodes}
    for name, deps in pending.items():
        for dep in deps:
            consumers[dep].append(name)
    ready = [name for name, deps in pending.items() if not deps]
    order = []
    while ready:
        name = ready.pop()
        order.append(nodes[name])
        for consumer in consumers[name]:
            pending[consumer].discard(name)
            if not pending[consumer]:
                ready.append(consumer)
    if len(order) != len(nodes):
        raise ValueError("graph has a cycle; the FP16 pass handles acyclic inference graphs only")
    return order


def _is_source(node: node_def_pb2.NodeDef, weight_inputs: set[str]) -> bool:
    return node.op == "Const" or node.name in weight_inputs


def _carries_float(node: node_def_pb2.NodeDef) -> bool:
    return FP32 in _input_dtypes(node) or FP32 in _output_dtypes(node)


def decide_precisions(graph_def: graph_pb2.GraphDef, weight_inputs: set[str], outputs: Iterable[str],
                      keep_fp32_ops: frozenset[str] = KEEP_FP32_OPS) -> dict[str, int]:
    """Node name -> FP32 or HALF for every node that carries fp32 data (other nodes are left alone)."""
    order = _topological_order(graph_def)
    forced = set(outputs)
    precision: dict[str, int] = {}
    sources = [n for n in order if _carries_float(n) and _is_source(n, weight_inputs)]
    for node in order:
        if not _carries_float(node) or _is_source(node, weight_inputs) or node.op == "Placeholder":
            continue
        if node.op in keep_fp32_ops or node.name in forced:
            precision[node.name] = FP32
            continue
        if node.op in FP16_OPS:
            precision[node.name] = HALF
            continue
        float_producers = [name for (name, _), dtype in zip(map(_split_input, _data_inputs(node)),
                                                            _input_dtypes(node))
                           if dtype == FP32 and name in precision]
        precision[node.name] = FP32 if any(precision[p] == FP32 for p in float_producers) else HALF
    consumers: dict[str, list[str]] = {}
    for node in order:
        for ref in _data_inputs(node):
            consumers.setdefault(_split_input(ref)[0], []).append(node.name)
    for node in sources:
        wants_half = any(precision.get(c) == HALF for c in consumers.get(node.name, []))
        precision[node.name] = HALF if wants_half else FP32
    return precision


def _to_half(node: node_def_pb2.NodeDef) -> None:
    """Retypes one node to fp16 in place: every float type attr, and a Const's value."""
    for attr in node.attr.values():
        if attr.type == FP32:
            attr.type = HALF
        if attr.HasField("list") and FP32 in attr.list.type:
            attr.list.type[:] = [HALF if t == FP32 else t for t in attr.list.type]
        if attr.HasField("tensor") and attr.tensor.dtype == FP32:
            attr.tensor.CopyFrom(tf.make_tensor_proto(tf.make_ndarray(attr.tensor).astype(np.float16)))


def convert_graph_def(graph_def: graph_pb2.GraphDef, weight_inputs: set[str], outputs: Iterable[str],
                      keep_fp32_ops: frozenset[str] = KEEP_FP32_OPS) -> tuple[graph_pb2.GraphDef, dict[str, int]]:
    """The pass: returns the fp16 GraphDef and the precision chosen for each float node (weights included)."""
    precision = decide_precisions(graph_def, weight_inputs, outputs, keep_fp32_ops)
    converted = graph_pb2.GraphDef()
    converted.CopyFrom(graph_def)
    nodes = {n.name: n for n in converted.node}
    for name, dtype in precision.items():
        if dtype == HALF:
            _to_half(nodes[name])
    casts: dict[tuple[str, int], str] = {}
    for node in list(converted.node):
        wanted_types = _input_dtypes(node)
        data_index = 0
        for i, ref in enumerate(node.input):
            if ref.startswith("^"):
                continue
            wanted = wanted_types[data_index]
            data_index += 1
            producer, index = _split_input(ref)
            have = _output_dtypes(nodes[producer])[index]
            if have == wanted or have not in _FLOATS or wanted not in _FLOATS:
                continue
            key = (ref, wanted)
            if key not in casts:
                cast = converted.node.add()
                cast.name = f"{producer}_{index}/to_{'fp16' if wanted == HALF else 'fp32'}"
                cast.op = "Cast"
                cast.input.append(ref)
                cast.attr["SrcT"].type = have
                cast.attr["DstT"].type = wanted
                cast.attr["Truncate"].b = False
                casts[key] = cast.name
            node.input[i] = casts[key]
    return converted, precision


@dataclasses.dataclass
class ConvertedRanker:
    """The stock ranker after the pass: weights in their storage dtypes and a serving function over them."""

    weights: dict[str, np.ndarray]
    serve: Callable[..., tf.Tensor]  # (weights mapping, input_ids, input_mask, segment_ids) -> scores
    graph_def: graph_pb2.GraphDef
    precision: dict[str, int]


def stock_graph_def(weights: BertWeights) -> tuple[graph_pb2.GraphDef, str]:
    """The stock fp32 ranker traced with its weights as placeholders `weight_<name>`; returns (graph, output)."""
    names = list(weights.arrays)
    specs = INPUT_SIGNATURE + [tf.TensorSpec(weights[n].shape, tf.float32, name=f"{WEIGHT_INPUT_PREFIX}{n}")
                               for n in names]
    config = weights.config

    def scores(input_ids, input_mask, segment_ids, *arrays):
        return stock.ranker_scores(dict(zip(names, arrays)), config, input_ids, input_mask, segment_ids)

    concrete = tf.function(scores).get_concrete_function(*specs)
    return concrete.graph.as_graph_def(), concrete.outputs[0].name


def convert_stock_ranker(weights: BertWeights) -> ConvertedRanker:
    """Stock fp32 graph -> FP16 pass -> weights cast to what the pass chose, plus a serving function."""
    graph_def, output = stock_graph_def(weights)
    weight_inputs = {f"{WEIGHT_INPUT_PREFIX}{n}" for n in weights.arrays}
    converted, precision = convert_graph_def(graph_def, weight_inputs, [_split_input(output)[0]])
    stored = {n: weights[n].astype(np.float16 if precision[f"{WEIGHT_INPUT_PREFIX}{n}"] == HALF else np.float32)
              for n in weights.arrays}
    input_names = [spec.name for spec in INPUT_SIGNATURE]

    def serve(w: Mapping[str, tf.Variable], *inputs: tf.Tensor) -> tf.Tensor:
        input_map = {f"{name}:0": tensor for name, tensor in zip(input_names, inputs)}
        input_map.update({f"{WEIGHT_INPUT_PREFIX}{n}:0": tf.convert_to_tensor(w[n]) for n in stored})
        (scores,) = tf.graph_util.import_graph_def(converted, input_map=input_map, return_elements=[output],
                                                   name="fp16")
        return scores

    return ConvertedRanker(stored, serve, converted, precision)
