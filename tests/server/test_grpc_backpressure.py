"""gRPC under overload: a full batch queue answers UNAVAILABLE at once (TF Serving's max_enqueued_batches), and
health probes stay fast while a thousand requests are in flight."""

from __future__ import annotations

import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tiny_models import predict_request, token_inputs

CONCURRENT = 1000


def test_full_queue_refuses_at_once_and_health_stays_fast(models_dir, tmp_path, start_server):
    (tmp_path / "batching.txt").write_text(
        "max_batch_size { value: 8 } max_enqueued_batches { value: 2 } num_batch_threads { value: 1 } "
        "batch_timeout_micros { value: 0 }")
    server = start_server("--model_name=slow", f"--model_base_path={models_dir}/slow", "--enable_batching",
                          f"--batching_parameters_file={tmp_path / 'batching.txt'}")
    request = predict_request("slow", token_inputs(1, 8))
    health = health_pb2_grpc.HealthStub(server.channel)
    answered: list[tuple[grpc.StatusCode, float]] = []
    lock = threading.Lock()

    def record(future, sent: float) -> None:
        code = future.code()
        with lock:
            answered.append((code, time.monotonic() - sent))

    probes: list[float] = []
    stop_probing = threading.Event()

    def probe() -> None:
        while not stop_probing.is_set():
            started = time.monotonic()
            reply = health.Check(health_pb2.HealthCheckRequest(service="tensorflow.serving.PredictionService"),
                                 timeout=30)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            probes.append(time.monotonic() - started)
            time.sleep(0.05)

    prober = threading.Thread(target=probe)
    prober.start()
    futures = []
    for _ in range(CONCURRENT):
        sent = time.monotonic()
        future = server.predict.Predict.future(request, timeout=20)
        future.add_done_callback(lambda f, sent=sent: record(f, sent))
        futures.append(future)
    for future in futures:
        try:
            assert future.result().outputs["scores"].tensor_shape.dim[0].size == 1
        except grpc.RpcError:
            pass
    stop_probing.set()
    prober.join()

    codes = [code for code, _ in answered]
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, set(codes)
    # The queue holds 16 rows and the batch 8: most of the thousand are refused, and refused without waiting.
    refused = sorted(seconds for code, seconds in answered if code == grpc.StatusCode.UNAVAILABLE)
    assert len(refused) > CONCURRENT // 2
    assert refused[len(refused) // 2] < 2.0, f"median refusal after {refused[len(refused) // 2]:.2f} s"
    assert probes and max(probes) < 1.0, f"slowest health probe {max(probes):.2f} s"
    # Refusals are transient: once the burst is over the server serves again.
    assert server.predict.Predict(request, timeout=30).model_spec.name == "slow"
