"""What `bertserve serve` itself costs per request, and how close it gets to calling the SavedModel directly.

Four parts, all on this machine, side by side in one run (the CPUs are shared: quote the ratios):

1. tiny model (1 layer, hidden 32, fused where the op library loads: model time is negligible, so the server's
   own cost shows): latency of one single-row Predict over gRPC with and without server-side batching, and over
   REST on a kept-alive connection and on a new connection per request, vs. a direct in-process call; and the
   most requests/s a server sustains
   (closed loop, many requests in flight over several connections, client in this process), with the
   CPU-seconds the server's processes (all, the main one alone, the gRPC front ends) and the client spent per
   request (the client's share of the two cores reported beside it). Both gRPC designs of this tree run side by
   side in alternating rounds, so that both see the same machine load: gRPC in the server process
   (--grpc_front_end_processes=1) and FRONT_END_PROCESSES front-end processes forwarding to it; each round also
   times GetModelStatus (no model: the cost of carrying a call). Beside them, the floor: a server that answers
   Predict with its request bytes, on grpc.aio and on grpcio's thread-pool server (EchoServer): grpcio's own CPU
   per call here, under any Python server's. With --baseline-pythonpath, servers from
   another checkout (an older design) join the rotation, in both gRPC designs.
2. batcher choice: the same tiny model batched in-process by (a) bertserve's Python batching queue feeding the
   signature's concrete function and (b) TensorFlow's own BatchFunction kernel, both driven by 32 Python threads
   (as the gRPC handler threads drive it): requests/s and mean batch size.
3. main process ceiling: the code that answers the calls the front-end processes forward, driven in this
   process without gRPC, 1-row and 32-row requests: Predict taken apart (GrpcApi.start_decoded, then the OUTPUTS
   frame: what the front ends send and get) and Predict as bytes (GrpcApi.answer: parse and serialize here, the
   path of other calls); what the main process alone sustains, and its event loop's CPU per request.
4. chit-chat ranker (6 layers, 768, 12 heads, FFN 3072, seq 32, random weights, exported with bertserve.export,
   stock fp32 and, if the op library is built, fused fp32): one 32-pair query through the server vs. a direct
   call, and 32 concurrent single-pair requests merged by the batcher vs. a direct batch-32 call.

Run: .venv/bin/python bench/serve_overhead.py [--quick] [--out bench/results/serve_overhead.json]
     [--baseline-pythonpath DIR --baseline-name NAME]  (DIR holds `bertserve`, e.g. a `git archive` of a commit,
     with this checkout's built custom_ops/_bert_ops.so copied in: without it that server skips the token-input
     check and is not compared like for like)
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import platform
import psutil
import statistics
import sys
import tempfile
import threading
import time

import grpc
import numpy as np
import requests
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2, predict_pb2

from bertserve import custom_ops
from bertserve.bench.machine import machine
from bertserve.loadtest.server_process import ServerProcess
from bertserve.export.graph import build_ranker_module
from bertserve.export.saved import warmup_inputs, write_version
from bertserve.export.weights import CHITCHAT_CONFIG, BertConfig, BertWeights
from bertserve.model_dir import TokenizerSettings
from bertserve.server.batcher import BatchScheduler, wait_for
from bertserve.server.config_files import DEFAULT_PROMETHEUS_PATH, BatchingOptions, single_model_config
from bertserve.server import forwarding
from bertserve.server.grpc_service import GrpcApi
from bertserve.server.manager import ManagerOptions, ModelManager
from bertserve.server.metrics import ServerMetrics
from bertserve.server.predict import Predictor
from bertserve.server.servable import LoadedVersion
from bertserve.server.tensors import RawTensor
from bertserve.server.token_inputs import TokenRanges

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)
SEQ = 32
# HTTP/2 connections of the closed loop: enough that SO_REUSEPORT spreads them over every front-end process.
CONNECTIONS = 8
# --grpc_front_end_processes of the multi-process design here (2 cores: one per core; the GPU host takes more).
FRONT_END_PROCESSES = 2
MULTI_PROCESS = f"this_tree_{FRONT_END_PROCESSES}_front_end_processes"
STATUS_METHOD = "/tensorflow.serving.ModelService/GetModelStatus"
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"


def export(base: str, name: str, config: BertConfig, variant: str) -> str:
    vocab = os.path.join(base, f"{name}-vocab.txt")
    with open(vocab, "w", encoding="utf-8") as handle:
        handle.writelines(f"tok{i}\n" for i in range(config.vocab_size))
    module = build_ranker_module(BertWeights.random(config, seed=1), variant=variant, precision="fp32")
    write_version(module, config, base, name, 1, TokenizerSettings(vocab, True, SEQ))
    return os.path.join(base, name)


def request_for(model: str, inputs: dict[str, np.ndarray]) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    return request


class Server:
    """A `bertserve serve` process with gRPC and REST (also the Prometheus metrics)."""

    def __init__(self, name: str, base_path: str, batching: str | None, pythonpath: str | None = None,
                 front_end_processes: int = 1):
        """pythonpath: where `bertserve` comes from for the server (None: this checkout); front_end_processes:
        --grpc_front_end_processes (1: gRPC in the server process, the only mode older designs have)."""
        self.name = name
        self.files = tempfile.TemporaryDirectory()
        monitoring = os.path.join(self.files.name, "monitoring.config")
        with open(monitoring, "w", encoding="utf-8") as handle:
            handle.write(f'prometheus_config {{ enable: true path: "{DEFAULT_PROMETHEUS_PATH}" }}')
        flags = [f"--model_name={name}", f"--model_base_path={base_path}", f"--monitoring_config_file={monitoring}"]
        if front_end_processes > 1:
            flags.append(f"--grpc_front_end_processes={front_end_processes}")
        if batching is not None:
            batching_file = os.path.join(self.files.name, "batching.txt")
            with open(batching_file, "w", encoding="utf-8") as handle:
                handle.write(batching)
            flags += ["--enable_batching", f"--batching_parameters_file={batching_file}"]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        self.server = ServerProcess(flags, None, env)
        try:
            self.server.wait_ready(120.0)
        except BaseException:
            self.server.terminate()
            self.files.cleanup()
            raise
        self.stub = self.server.predict

    def batch_sizes(self) -> tuple[float, float]:
        """(rows, batches) run so far, from the server's bertserve_batch_size histogram."""
        return self.server.batch_size_totals(self.name)

    def close(self) -> None:
        self.server.terminate()
        self.files.cleanup()


def _serve_echo(kind: str, ports: multiprocessing.Queue) -> None:
    """An EchoServer's process: grpc.aio or grpcio's thread-pool server, Predict answered with its request bytes."""
    service, method = PREDICT_METHOD.strip("/").split("/")
    if kind == "sync":
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(8))
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {
            method: grpc.unary_unary_rpc_method_handler(lambda request, context: request)})])
        ports.put(server.add_insecure_port("localhost:0"))
        server.start()
        server.wait_for_termination()
        return

    async def echo(request: bytes, context) -> bytes:
        return request

    async def serve() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {
            method: grpc.unary_unary_rpc_method_handler(echo)})])
        ports.put(server.add_insecure_port("localhost:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


class EchoServer:
    """A gRPC server in its own process that answers Predict with the request's bytes and does nothing else: what
    grpcio alone costs per call on this machine (`kind` "aio": grpc.aio, as bertserve serves; "sync": grpcio's
    thread-pool server), the floor under any Python server's CPU per request."""

    def __init__(self, kind: str):
        ports: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
        self.proc = multiprocessing.get_context("spawn").Process(target=_serve_echo, args=(kind, ports), daemon=True)
        self.proc.start()
        self.grpc_port = ports.get(timeout=60)
        self.target = f"localhost:{self.grpc_port}"

    def close(self) -> None:
        self.proc.kill()
        self.proc.join()


def grpc_floor(request, quick: bool) -> dict:
    """The closed loop of max_throughput against the two echo servers, rounds alternating."""
    seconds, runs = (3 if quick else 8), {"aio": [], "sync": []}
    with contextlib.ExitStack() as stack:
        servers = {kind: stack.enter_context(contextlib.closing(EchoServer(kind))) for kind in runs}
        for _ in range(1 if quick else 3):
            for kind, server in servers.items():
                runs[kind].append(closed_loop_rps(server, request, 64, seconds))
    return {"what": "a gRPC server that answers Predict with its request bytes (no parsing, no model): grpcio's own "
                    "cost per call, the floor of any Python server here; best of the rounds",
            **{kind: max(rounds, key=lambda r: r["requests_per_s"]) for kind, rounds in runs.items()}}


def warmup_calls(count: int) -> int:
    """Untimed calls of each kind before interleaved_latency_us times `count` of them."""
    return max(3, count // 10)


def interleaved_latency_us(calls: dict, count: int) -> dict:
    """Times each call `count` times, interleaved (rotating order), so shared-CPU noise hits all of them alike."""
    names = list(calls)
    for name in names:
        for _ in range(warmup_calls(count)):
            calls[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(count):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            calls[name]()
            samples[name].append((time.perf_counter() - start) * 1e6)
    summary = {}
    for name, values in samples.items():
        values.sort()
        summary[name] = {"p50_us": round(statistics.median(values), 1),
                         "p99_us": round(values[int(0.99 * (len(values) - 1))], 1),
                         "mean_us": round(statistics.fmean(values), 1), "n": count}
    return summary


def rest_predict(http, server: Server, body: dict) -> None:
    """One REST Predict; `http` is a requests.Session (kept-alive connection) or the requests module (a new one)."""
    reply = http.post(f"http://{server.server.rest_target}/v1/models/{server.name}:predict", json=body, timeout=30)
    reply.raise_for_status()


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(times.user + times.system for times in (process.cpu_times() for process in processes))


def _grpc_connections(process: psutil.Process, port: int) -> int:
    return sum(1 for connection in process.net_connections("tcp")
               if connection.status == psutil.CONN_ESTABLISHED and connection.laddr.port == port)


def closed_loop_rps(server: "ServerProcess | EchoServer", request, in_flight: int, seconds: float,
                    connections: int = CONNECTIONS, method: str = PREDICT_METHOD) -> dict:
    """Keeps `in_flight` calls of `method` (Predict) outstanding for `seconds`, spread over `connections` HTTP/2 connections (the
    kernel spreads connections, not calls, over front-end processes); completed requests/s, errors, and the
    CPU-seconds per request of the server's processes (all of them, the main one alone, its front-end processes)
    and of this client (request bytes serialized once, so the client's share is the gRPC call itself)."""
    channels = [grpc.insecure_channel(server.target, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(connections)]
    calls = [channel.unary_unary(method) for channel in channels]
    raw = request.SerializeToString()
    state = {"ok": 0, "errors": 0, "outstanding": in_flight, "sent": 0}
    lock, finished = threading.Lock(), threading.Event()
    end = time.monotonic() + seconds

    def fire() -> None:
        with lock:
            state["sent"] += 1
            call = calls[state["sent"] % connections]
        call.future(raw, timeout=60).add_done_callback(done)

    def done(future) -> None:
        with lock:
            state["errors" if future.exception() else "ok"] += 1
            again = time.monotonic() < end
            if not again:
                state["outstanding"] -= 1
                if state["outstanding"] == 0:
                    finished.set()
        if again:
            fire()

    main = psutil.Process(server.proc.pid)
    front_ends, client = main.children(), psutil.Process()
    for call in calls:  # connect every channel before timing
        call(raw, timeout=60)
    spread = sorted(_grpc_connections(process, server.grpc_port) for process in (front_ends or [main]))
    main_before, front_ends_before, client_before = (_cpu_seconds(group) for group in ([main], front_ends, [client]))
    start = time.monotonic()
    for _ in range(in_flight):
        fire()
    finished.wait(seconds + 120)
    elapsed = time.monotonic() - start
    main_cpu = _cpu_seconds([main]) - main_before
    front_ends_cpu = _cpu_seconds(front_ends) - front_ends_before
    client_cpu = _cpu_seconds([client]) - client_before
    for channel in channels:
        channel.close()
    server_cpu = main_cpu + front_ends_cpu
    done_count = max(state["ok"], 1)
    return {"requests_per_s": round(state["ok"] / elapsed, 1), "errors": state["errors"], "in_flight": in_flight,
            "seconds": round(elapsed, 1), "front_end_processes": len(front_ends),
            "connections_per_grpc_process": spread,
            "server_cpu_us_per_request": round(server_cpu / done_count * 1e6, 1),
            "main_process_cpu_us_per_request": round(main_cpu / done_count * 1e6, 1),
            "front_end_processes_cpu_us_per_request": round(front_ends_cpu / done_count * 1e6, 1),
            "client_cpu_us_per_request": round(client_cpu / done_count * 1e6, 1),
            "server_cores_busy": round(server_cpu / elapsed, 2), "main_process_cores_busy": round(main_cpu / elapsed, 2),
            "client_cores_busy": round(client_cpu / elapsed, 2),
            "client_share_of_cpu": round(client_cpu / max(server_cpu + client_cpu, 1e-9), 3)}


def side_by_side_throughput(path: str, request, designs: dict[str, tuple[str | None, int]], rounds: int,
                            seconds: float) -> dict:
    """The batching closed loop against each design's server (name -> (PYTHONPATH, front-end processes)), rounds
    alternating; each design's best round (the least disturbed by other work on the shared cores) and every
    round. Each round also runs GetModelStatus in a closed loop: no model, no batch, so its CPU per call is what
    carrying a call costs (gRPC, and in the multi-process design the hand-off to the main process)."""
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "tiny"
    results: dict[str, list[dict]] = {name: [] for name in designs}
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(contextlib.closing(Server("tiny", path, BATCHING_TINY, pythonpath,
                                                                       processes)))
                   for name, (pythonpath, processes) in designs.items()}
        for _ in range(rounds):
            for name, server in servers.items():
                rows_before, batches_before = server.batch_sizes()
                result = closed_loop_rps(server.server, request, 64, seconds)
                rows, batches = (a - b for a, b in zip(server.batch_sizes(), (rows_before, batches_before)))
                result["mean_rows_per_executed_batch"] = round(rows / max(batches, 1), 2)
                result["get_model_status"] = closed_loop_rps(server.server, status, 64, seconds / 2,
                                                             method=STATUS_METHOD)
                results[name].append(result)
    return {name: {"best": max(runs, key=lambda r: r["requests_per_s"]), "rounds": runs}
            for name, runs in results.items()}


BATCHING_TINY = ("max_batch_size { value: 64 } batch_timeout_micros { value: 0 } "
                 "max_enqueued_batches { value: 1000 } num_batch_threads { value: 1 }")


def tiny_variant() -> str:
    """The tiny model's graph: fused where the op library loads. The stock graph's TensorFlow executor spends
    about 1.2 ms of CPU per batch on its many small ops, which would count as the server's own cost per request."""
    return "fused" if custom_ops.library_loads() else "stock"


def tiny_part(base: str, quick: bool, baseline: tuple[str, str] | None) -> dict:
    """baseline: (name, PYTHONPATH) of another design's server for the side-by-side throughput."""
    variant = tiny_variant()
    path = export(base, "tiny", TINY_CONFIG, variant)
    one_row = warmup_inputs(TINY_CONFIG, 1, SEQ)
    function = tf.saved_model.load(os.path.join(path, "1")).signatures["serving_default"]
    request = request_for("tiny", one_row)
    rest_body = {"inputs": {name: value.tolist() for name, value in one_row.items()}}
    with contextlib.ExitStack() as servers:
        plain = servers.enter_context(contextlib.closing(Server("tiny", path, None)))
        session = servers.enter_context(requests.Session())
        batching = servers.enter_context(contextlib.closing(Server("tiny", path, BATCHING_TINY)))
        forwarded = servers.enter_context(contextlib.closing(Server("tiny", path, BATCHING_TINY,
                                                                    front_end_processes=FRONT_END_PROCESSES)))
        latency = interleaved_latency_us({
            "direct_call": lambda: function(**{k: tf.constant(v) for k, v in one_row.items()})["scores"].numpy(),
            "grpc_no_batching": lambda: plain.stub.Predict(request, timeout=30),
            "grpc_batching": lambda: batching.stub.Predict(request, timeout=30),
            "grpc_batching_front_end_processes": lambda: forwarded.stub.Predict(request, timeout=30),
            "rest_keep_alive": lambda: rest_predict(session, plain, rest_body),
            "rest_new_connection": lambda: rest_predict(requests, plain, rest_body)}, 300 if quick else 2000)
        no_batching = closed_loop_rps(plain.server, request, 64, 3 if quick else 10)
    designs = {"this_tree": (None, 1), MULTI_PROCESS: (None, FRONT_END_PROCESSES)}
    if baseline:
        name, pythonpath = baseline
        designs.update({name: (pythonpath, 1), f"{name}_{FRONT_END_PROCESSES}_front_end_processes":
                        (pythonpath, FRONT_END_PROCESSES)})
    throughput = side_by_side_throughput(path, request, designs, 1 if quick else 3, 3 if quick else 10)
    floor = grpc_floor(request, quick)
    direct_p50 = latency["direct_call"]["p50_us"]
    return {"model": f"1 layer, hidden 32, seq 32, {variant} fp32, one row per request; latency: one request at a "
                     f"time",
            "latency": latency,
            "server_cost_us_p50": {name: round(latency[name]["p50_us"] - direct_p50, 1)
                                   for name in ("grpc_no_batching", "grpc_batching",
                                                "grpc_batching_front_end_processes", "rest_keep_alive",
                                                "rest_new_connection")},
            "max_throughput": {"grpc_no_batching": no_batching, "grpc_batching": throughput["this_tree"]["best"],
                               "grpc_batching_front_end_processes": throughput[MULTI_PROCESS]["best"]},
            "grpc_floor": floor,
            "grpc_batching_side_by_side": {
                "batching": BATCHING_TINY, "in_flight": 64,
                "note": "rounds alternate between the designs' servers; best: the round with the most requests/s",
                **throughput}}


def main_process_ceiling(base: str, quick: bool) -> dict:
    """What the main process alone sustains with --grpc_front_end_processes > 1: the code that answers each
    forwarded call, driven by 64 concurrent callers on an event loop, requests ready, no gRPC and no hand-off;
    requests/s and CPU-us per request of the event loop's thread and of the whole process (the batch thread and the
    tiny model's session runs too), for 1-row and 32-row requests. Predict as the front ends hand it over (taken
    apart: GrpcApi.start_decoded, answered as an OUTPUTS frame) and as bytes (GrpcApi.answer, parsing and
    serializing here). With the hand-off added per call, it bounds what one server reaches on a host whose other
    cores run the front ends."""
    seconds, results = (2 if quick else 6), {}
    for rows in (1, 32):
        metrics = ServerMetrics(8 * rows)
        manager = ModelManager(ManagerOptions(
            saved_model_tags=frozenset({"serve"}), enable_model_warmup=False, warmup_iterations=1,
            allow_labels_for_unavailable=False, batching=BatchingOptions(
                max_batch_size=8 * rows, batch_timeout_micros=0, max_enqueued_batches=1000, num_batch_threads=1)),
            metrics)
        manager.apply_config(single_model_config("tiny", os.path.join(base, "tiny")))
        manager.load_startup_models(threading.Event())
        with concurrent.futures.ThreadPoolExecutor(4) as blocking_threads:
            api = GrpcApi(Predictor(manager, metrics, blocking_threads), max_in_flight=1000)
            inputs = warmup_inputs(TINY_CONFIG, rows, SEQ)
            request = request_for("tiny", inputs)
            payload = request.SerializeToString()
            real = inputs["input_mask"] == 1  # the ranges the front end measures of these (valid) token inputs
            decoded = forwarding.DecodedPredict(
                1, 60.0, 0.0, "tiny", None, "", "", [],
                {name: RawTensor(proto.dtype, [d.size for d in proto.tensor_shape.dim],
                                 memoryview(proto.tensor_content), True) for name, proto in request.inputs.items()},
                TokenRanges(True, *(int(f(inputs[name][real])) for name in ("input_ids", "segment_ids")
                                    for f in (np.min, np.max))))

            async def as_bytes(end: float) -> int:
                answered = 0
                while time.monotonic() < end:
                    answer = await api.answer("/tensorflow.serving.PredictionService/Predict", payload, 60.0)
                    assert answer.code == 0, answer
                    answered += 1
                return answered

            async def taken_apart(end: float) -> int:
                answered, loop = 0, asyncio.get_running_loop()
                while time.monotonic() < end:
                    done = loop.create_future()
                    api.start_decoded(decoded, done.set_result)
                    result = await done
                    frame = forwarding.outputs_frame(1, result.model_name, result.version, result.signature_name,
                                                     result.outputs, False)
                    assert frame is not None, result
                    answered += 1
                return answered

            async def drive(caller, duration: float) -> int:
                end = time.monotonic() + duration
                return sum(await asyncio.gather(*(caller(end) for _ in range(64))))

            for name, caller in (("taken_apart", taken_apart), ("as_bytes", as_bytes)):
                asyncio.run(drive(caller, 1.0))
                start, loop_cpu, process_cpu = time.monotonic(), time.thread_time(), time.process_time()
                count = asyncio.run(drive(caller, seconds))
                elapsed = time.monotonic() - start
                results[f"rows_{rows}_{name}"] = {
                    "requests_per_s": round(count / elapsed, 1),
                    "event_loop_cpu_us_per_request": round((time.thread_time() - loop_cpu) / count * 1e6, 1),
                    "process_cpu_us_per_request": round((time.process_time() - process_cpu) / count * 1e6, 1),
                    "max_batch_size": 8 * rows}
        manager.shutdown()
    return {"driver": "64 concurrent callers on one event loop (the bench's thread), tiny model, batching: "
                      "max_batch_size 8 requests, batch_timeout_micros 0, one batch thread; taken_apart: "
                      "GrpcApi.start_decoded + the OUTPUTS frame (the front ends' Predict), as_bytes: GrpcApi.answer",
            **results}


def batcher_choice(base: str, quick: bool) -> dict:
    """bertserve's Python batching queue vs. TensorFlow's BatchFunction kernel, same knobs, same driver."""
    servable = LoadedVersion("tiny", 1, os.path.join(base, "tiny", "1"), {"serve"})
    signature = servable.signature("serving_default")
    one_row = warmup_inputs(TINY_CONFIG, 1, SEQ)
    threads, seconds = 32, (3 if quick else 8)

    def drive(call) -> float:
        stop, counts = threading.Event(), [0] * threads

        def worker(index: int) -> None:
            while not stop.is_set():
                call()
                counts[index] += 1

        workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        start = time.monotonic()
        for thread in workers:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in workers:
            thread.join()
        return sum(counts) / (time.monotonic() - start)

    options = BatchingOptions(max_batch_size=32, batch_timeout_micros=1000, max_enqueued_batches=1000,
                              num_batch_threads=1)
    metrics = ServerMetrics(32)
    scheduler = BatchScheduler(1, "bench")
    queue = scheduler.add_queue(options, signature.run, signature.tensor_names, "tiny", "serving_default", metrics)
    python_rps = drive(lambda: wait_for(queue.submit(one_row, 1, None), None))
    scheduler.stop()
    samples = {sample.name: sample.value for family in metrics.registry.collect() for sample in family.samples
               if sample.name in ("bertserve_batch_size_sum", "bertserve_batch_size_count")}
    python_mean = samples["bertserve_batch_size_sum"] / max(samples["bertserve_batch_size_count"], 1)

    # TensorFlow's BatchFunction wraps a tf.function: the SavedModel loaded as functions (the server runs it in a
    # Session, which has no function to wrap).
    loaded = tf.saved_model.load(os.path.join(base, "tiny", "1"))  # kept: its signatures use its variables
    function = loaded.signatures["serving_default"]
    specs = [tf.TensorSpec([None, SEQ], tf.int32) for _ in range(3)]

    @tf.function(input_signature=specs)
    def batched(input_ids, input_mask, segment_ids):
        @tf.nondifferentiable_batch_function(num_batch_threads=1, max_batch_size=32, batch_timeout_micros=1000,
                                             max_enqueued_batches=1000)
        def inner(ids, mask, segments):
            return function(input_ids=ids, input_mask=mask, segment_ids=segments)["scores"]
        return inner(input_ids, input_mask, segment_ids)

    tensors = [tf.constant(one_row[k]) for k in ("input_ids", "input_mask", "segment_ids")]
    batched(*tensors)
    tf_rps = drive(lambda: batched(*tensors))
    direct_rps = drive(lambda: signature.run(one_row))
    return {"driver": f"{threads} Python threads, one single-row request each at a time, {seconds}s",
            "knobs": "max_batch_size 32, batch_timeout_micros 1000, num_batch_threads 1",
            "python_batching_queue": {"requests_per_s": round(python_rps, 1), "mean_batch_size": round(python_mean, 2)},
            "tf_batch_function": {"requests_per_s": round(tf_rps, 1)},
            "no_batching_concurrent_calls": {"requests_per_s": round(direct_rps, 1)}}


def chitchat_part(base: str, variant: str, quick: bool) -> dict:
    name = f"chitchat_{variant}"
    path = export(base, name, CHITCHAT_CONFIG, variant)
    query = warmup_inputs(CHITCHAT_CONFIG, 32, SEQ, seed=3)
    function = tf.saved_model.load(os.path.join(path, "1")).signatures["serving_default"]
    server = Server(name, path, "max_batch_size { value: 32 } batch_timeout_micros { value: 2000 } "
                                "max_enqueued_batches { value: 100 } num_batch_threads { value: 1 }")
    whole = request_for(name, query)
    singles = [request_for(name, {k: v[i:i + 1] for k, v in query.items()}) for i in range(32)]

    def merged_query() -> None:
        for future in [server.stub.Predict.future(r, timeout=60) for r in singles]:
            future.result()

    count = 5 if quick else 25
    try:
        rows_before, batches_before = server.batch_sizes()
        latency = interleaved_latency_us({
            "direct_batch32_call": lambda: function(**{k: tf.constant(v) for k, v in query.items()})["scores"].numpy(),
            "grpc_one_request_of_32_pairs": lambda: server.stub.Predict(whole, timeout=60),
            "grpc_32_concurrent_single_pair_requests_batched": merged_query}, count)
        rows, batches = (after - before for after, before in zip(server.batch_sizes(), (rows_before, batches_before)))
        whole_calls = count + warmup_calls(count)  # each 32-pair request runs as one batch of 32 rows
    finally:
        server.close()
    direct_p50 = latency["direct_batch32_call"]["p50_us"]
    return {"model": f"6 layers, 768, 12 heads, FFN 3072, seq {SEQ}, {variant} fp32, random weights",
            "latency": latency,
            "singles_mean_rows_per_executed_batch": round((rows - 32 * whole_calls) / max(batches - whole_calls, 1), 2),
            "ratio_to_direct_p50": {key: round(value["p50_us"] / direct_p50, 3) for key, value in latency.items()
                                    if key != "direct_batch32_call"}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "bench", "results", "serve_overhead.json"))
    parser.add_argument("--baseline-pythonpath", help="a folder holding another checkout as `bertserve`")
    parser.add_argument("--baseline-name", default="baseline", help="its name in the results (e.g. its commit)")
    args = parser.parse_args()
    results = {"machine": {**machine(), "python": platform.python_version(), "tensorflow": tf.__version__,
                           "grpcio": grpc.__version__,
                           "note": "client, server and other work share these cores; compare ratios"},
               "quick": args.quick}
    with tempfile.TemporaryDirectory() as base:
        results["tiny"] = tiny_part(base, args.quick, (args.baseline_name, args.baseline_pythonpath)
                                    if args.baseline_pythonpath else None)
        print(json.dumps(results["tiny"], indent=1), flush=True)
        results["batcher_choice"] = batcher_choice(base, args.quick)
        print(json.dumps(results["batcher_choice"], indent=1), flush=True)
        results["main_process_ceiling"] = main_process_ceiling(base, args.quick)
        print(json.dumps(results["main_process_ceiling"], indent=1), flush=True)
        variants = ["stock"]
        if custom_ops.library_loads():
            variants.append("fused")
        else:
            results["fused_skipped"] = "op library not loadable"
        for variant in variants:
            results[f"chitchat_{variant}"] = chitchat_part(base, variant, args.quick)
            print(json.dumps(results[f"chitchat_{variant}"], indent=1), flush=True)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
