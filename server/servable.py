"""One loaded model version: a TensorFlow Session over its SavedModel's MetaGraph, as TF Serving loads it.

Why a Session (tf.compat.v1.saved_model.loader) and not tf.saved_model.load: TF Serving runs every SavedModel,
TF1 or TF2, through a Session over the MetaGraphDef, and some TF1 models (reference-typed outputs, graphs whose
ParseExample shapes do not survive re-tracing as functions) cannot be loaded as functions at all. The Session
also gives the lean request path: each signature gets one C++ callable (Session::MakeCallable) with its feeds
and fetches resolved at load, so a batch costs one call with NumPy arrays in and out, no Python graph work.
Like TF Serving's C++ Session::Run, a callable feeds a tensor to whatever shape the graph accepts (a [3] vector
where the SignatureDef says [-1, 1], a scalar); the graph, not the SignatureDef's shape, decides.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
from tensorflow.python.eager import context

from bertserve.model_dir import SIGNATURE_NAME
from bertserve.server.errors import failed_precondition, from_exception, invalid_argument
from bertserve.server.tensors import proto_to_ndarray
from bertserve.server.token_inputs import TokenInputRules, TokenLimits, TokenRanges

log = logging.getLogger("bertserve.server")

INIT_OP_SIGNATURE = "__saved_model_init_op"
# Callables beyond the one per signature (MultiInference's fetch sets) are kept for this many combinations.
MAX_EXTRA_CALLABLES = 32


def batch_rows(inputs: Mapping[str, np.ndarray]) -> int:
    """The rows a request adds to a batch; TF Serving's BatchingSession rules and texts."""
    sizes = set()
    for array in inputs.values():
        if array.ndim == 0:
            raise invalid_argument("Batching Run() input tensors must have at least one dimension")
        sizes.add(array.shape[0])
    if len(sizes) > 1:
        raise invalid_argument(f"Batching Run() input tensors must have equal 0th-dimension size, got "
                               f"{ {name: int(array.shape[0]) for name, array in inputs.items()} }")
    return sizes.pop() if sizes else 0


class SessionBundle:
    """A Session holding one SavedModel in its own graph (TF Serving's SavedModelBundle), and its callables."""

    def __init__(self, path: str, tags: set[str], gpu_memory_fraction: float = 0.0):
        """gpu_memory_fraction: --per_process_gpu_memory_fraction (0: TensorFlow's default). The GPU allocator is
        one per process and takes the options of the first session that reaches the GPU, as in TF Serving, which
        sets the fraction in every session's config."""
        self.graph = tf.Graph()
        # The process's TensorFlow settings (the --tensorflow_*_parallelism flags, devices), as a Session without
        # a config takes them, plus the GPU memory fraction.
        config = context.context().config
        config.gpu_options.per_process_gpu_memory_fraction = gpu_memory_fraction
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)
        try:
            self.meta_graph: meta_graph_pb2.MetaGraphDef = tf.compat.v1.saved_model.loader.load(
                self.session, sorted(tags), path)
        except Exception:
            self.session.close()
            raise
        self.graph.finalize()  # nothing may add to the graph after load (a request that did would leak)
        self._lock = threading.Lock()
        self._extra_callables: collections.OrderedDict[tuple, Callable[..., list[np.ndarray]]] = \
            collections.OrderedDict()

    def make_callable(self, feeds: Sequence[str], fetches: Sequence[str]) -> Callable[..., list[np.ndarray]]:
        """Session::MakeCallable: feeds and fetches (tensor names) resolved once; a call runs the pruned graph.

        The session's private wrapper of the C++ API is the only way to it from Python; Session.make_callable
        with feeds falls back to Session.run and its per-call Python feed checks.
        """
        options = config_pb2.CallableOptions(feed=list(feeds), fetch=list(fetches))
        return self.session._make_callable_from_options(options)  # noqa: SLF001 - see the docstring

    def cached_callable(self, feeds: tuple[str, ...], fetches: tuple[str, ...]) -> Callable[..., list[np.ndarray]]:
        """A callable for a combination requests choose (MultiInference's tasks); the least recently used go."""
        key = (feeds, fetches)
        with self._lock:
            found = self._extra_callables.pop(key, None)
            if found is None:
                found = self.make_callable(feeds, fetches)
            self._extra_callables[key] = found
            while len(self._extra_callables) > MAX_EXTRA_CALLABLES:
                self._extra_callables.popitem(last=False)
            return found

    def run(self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str]) -> list[np.ndarray]:
        """One Session run over tensor names (MultiInference); a TensorFlow failure keeps its status code."""
        names = tuple(sorted(feeds))
        try:
            values = self.cached_callable(names, tuple(fetches))(*(feeds[name] for name in names))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status, never a crash
            raise from_exception(exc) from exc
        return [np.asarray(value) for value in values]

    def close(self) -> None:
        with self._lock:
            self._extra_callables.clear()
        self.session.close()


class Signature:
    """A SignatureDef's contract and its callable: request inputs by alias in, outputs by alias out."""

    def __init__(self, key: str, signature_def: meta_graph_pb2.SignatureDef, bundle: SessionBundle,
                 limits: TokenLimits):
        self.key, self.signature_def = key, signature_def
        self.method_name = signature_def.method_name
        self.inputs = dict(signature_def.inputs)
        self._input_names = frozenset(self.inputs)
        self.outputs = dict(signature_def.outputs)
        self.defaults: dict[str, tensor_pb2.TensorProto] = dict(signature_def.defaults)
        self._default_values = {alias: proto_to_ndarray(alias, self.inputs[alias], proto)
                                for alias, proto in self.defaults.items() if alias in self.inputs}
        self.tensor_names = {alias: info.name for alias, info in self.inputs.items()}
        self._token_rules = TokenInputRules.for_signature(self.inputs, limits)
        self._feed_aliases = sorted(self.inputs)
        self._fetch_aliases = sorted(self.outputs)
        try:
            self._callable = bundle.make_callable([self.inputs[a].name for a in self._feed_aliases],
                                                  [self.outputs[a].name for a in self._fetch_aliases])
            self._error = None
        except Exception as exc:  # noqa: BLE001 - a broken signature fails its requests, not the whole model
            self._callable, self._error = None, from_exception(exc)
            log.warning("signature %s cannot run: %s", key, self._error)

    def check_input_names(self, names: Sequence[str]) -> None:
        """TF Serving's texts (VerifyRequestInputsSize, GetInputValues): extra and missing aliases, defaults apply."""
        given, wanted = set(names), self._input_names
        if given == wanted:
            return
        if len(given) > len(wanted) or (len(given) < len(wanted) and not self.defaults):
            raise invalid_argument(
                f"input size does not match signature: {len(given)}!={len(wanted)} len({{{','.join(sorted(given))}}})"
                f" != len({{{','.join(sorted(wanted))}}}). Sent extra: {{{','.join(sorted(given - wanted))}}}. "
                f"Missing but required: {{{','.join(sorted(wanted - given))}}}.")
        for alias in sorted(wanted - given):
            if alias not in self.defaults:
                raise invalid_argument(
                    f"Signature input alias: {alias}(feed name: {self.inputs[alias].name}) not found in request and "
                    f"no default value provided. Inputs expected to be in the request {{{','.join(sorted(given))}}}, "
                    f"or default input alias set: {','.join(sorted(self.defaults))}")
        extra = sorted(given - wanted)
        if extra:
            raise invalid_argument(f"Inputs contains invalid name. Used request inputs: "
                                   f"{','.join(sorted(given & wanted))}, request input: {','.join(extra)}")

    def complete(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The request's inputs with the signature's defaults for those it left out; names checked."""
        self.check_input_names(list(inputs))
        missing = {alias: value for alias, value in self._default_values.items() if alias not in inputs}
        return {**inputs, **missing} if missing else inputs

    def check_output_filter(self, output_filter: Sequence[str]) -> None:
        if not output_filter:
            return
        seen: set[str] = set()
        for alias in output_filter:
            if alias not in self.outputs:
                raise invalid_argument(f"output tensor alias not found in signature: {alias} Outputs expected to be "
                                       f"in the set {{{','.join(sorted(self.outputs))}}}.")
            if alias in seen:
                raise invalid_argument(f"duplicate output tensor alias: {alias}")
            seen.add(alias)

    def check_inputs(self, inputs: Mapping[str, np.ndarray], token_ranges: TokenRanges | None = None) -> None:
        """What must hold before a request may share a batch: the fused op's own rules, for signatures that take
        the bertserve token inputs (`token_ranges`: what a front end measured of them); other models' inputs go to
        their graph as they are."""
        if self._token_rules is not None:
            self._token_rules.check(inputs, token_ranges)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One Session run of the whole signature; a TensorFlow failure keeps its status code."""
        if self._error is not None:
            raise self._error
        try:
            values = self._callable(*(inputs[alias] for alias in self._feed_aliases))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status, never a crash
            raise from_exception(exc) from exc
        return {alias: np.asarray(value) for alias, value in zip(self._fetch_aliases, values)}


class LoadedVersion:
    """A servable version: loaded once, shared by requests, unloaded when the last in-flight request ends."""

    def __init__(self, model_name: str, version: int, path: str, tags: set[str], gpu_memory_fraction: float = 0.0):
        self.model_name, self.version, self.path = model_name, version, path
        self.bundle = SessionBundle(path, tags, gpu_memory_fraction)
        self.meta_graph = self.bundle.meta_graph
        self.limits = TokenLimits.from_saved_model(path)
        self.signatures: dict[str, Signature] = {
            key: Signature(key, signature_def, self.bundle, self.limits)
            for key, signature_def in self.meta_graph.signature_def.items() if key != INIT_OP_SIGNATURE}
        self._in_flight = 0
        self._idle = threading.Condition()

    def signature(self, key: str) -> Signature:
        found = self.signatures.get(key or SIGNATURE_NAME)
        if found is None:
            raise failed_precondition(f"Serving signature key \"{key or SIGNATURE_NAME}\" not found.")
        return found

    def acquire(self) -> None:
        with self._idle:
            self._in_flight += 1

    def release(self) -> None:
        with self._idle:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.notify_all()

    def wait_idle(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0)

    def release_model(self) -> None:
        """Closes the Session, so the graph's memory goes once no request holds this version."""
        self.signatures.clear()
        self.bundle.close()
