"""What the GPU harness's scripts share: the chit-chat ranker's shape and random weights on the GPU, CUDA-event
timing, the machine a result ran on, and how a result is written.

The scripts import the project as `bertserve` (on the GPU machine `source gpu_rig/env.sh` puts it on PYTHONPATH;
here the editable install does), this module and its siblings as `bertserve.bench.gpu.*`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time

import numpy as np
import torch

from bertserve.bench.machine import gpu_result_name, machine
from bertserve.bench.gpu import core
from bertserve.bench.gpu.lengths import SEQ, lengths_for  # noqa: F401 - the harness's shapes, for its callers
from bertserve.export.weights import CHITCHAT_CONFIG, BertWeights

WARMUP_S = 0.2  # work before timing: the SM clock ramps up from idle and back from the power cap
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
RESULTS_DIR = os.path.join(REPO_ROOT, "bench", "results")  # the kept results, each overwritten by its script
DEVICE_CARRY = os.path.join(REPO_ROOT, ".device_carry")  # prepare_carry.py's files and the prebuilt core


def result_name(kind: str) -> str:
    """The kept name of a result for this GPU: gpu_h200_<kind>.json on an NVIDIA H200."""
    return gpu_result_name(torch.cuda.get_device_name(0), kind)


def config_dict(c) -> dict:
    """A BertConfig as the dict core.CudaRanker takes."""
    return {f: getattr(c, f) for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "intermediate_size", "max_position_embeddings", "type_vocab_size",
                                       "layer_norm_eps", "num_labels")}


def to_torch(arrays, dtype=torch.float32) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.asarray(v, dtype=np.float32)).to("cuda", dtype) for k, v in arrays.items()}


def chitchat_random() -> tuple[dict, dict[str, torch.Tensor]]:
    """The chit-chat ranker's config and its seeded random float32 weights on the GPU: what every timing runs."""
    return config_dict(CHITCHAT_CONFIG), to_torch(BertWeights.random(CHITCHAT_CONFIG, seed=0).arrays)


def event_ms(fn) -> float:
    """One call of fn, timed with CUDA events on the current stream (waits for it)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); fn(); b.record(); b.synchronize()
    return a.elapsed_time(b)


def median_ms(fn, min_iters: int = 10, budget_ms: float = 300.0) -> float:
    """Median of CUDA-event timings after WARMUP_S of calls (at least 3), so that the clock has ramped up from
    idle or recovered from the power cap; the count adapts to ~budget_ms of work."""
    start, calls = time.monotonic(), 0
    while calls < 3 or time.monotonic() - start < WARMUP_S:
        fn()
        calls += 1
        if calls % 16 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    iters = int(max(min_iters, min(200, budget_ms / max(event_ms(fn), 1e-3))))
    return float(np.median([event_ms(fn) for _ in range(iters)]))


def graph_replay_ms(ranker: core.CudaRanker, ids: torch.Tensor, seg: torch.Tensor, lengths: np.ndarray) -> float:
    """Median replay time of a graph captured for this batch, then dropped: a graph captured for an earlier row and
    replayed for this one ran slower than one captured for it (why was not traced)."""
    n = ranker.stage(ids, seg, lengths)
    ms = median_ms(ranker.graph_for(ids.shape[0], ranker.token_bucket(n)).replay)
    ranker.graphs.clear()
    return ms


def compare(ours: torch.Tensor, ref: torch.Tensor) -> dict:
    """Max and RMS absolute difference, relative L2 error, and whether ours is finite."""
    ours, ref = ours.double().cpu(), ref.double().cpu()
    diff = (ours - ref).abs()
    return {"max_abs": float(diff.max()) if diff.numel() else 0.0,
            "rms": float(diff.pow(2).mean().sqrt()) if diff.numel() else 0.0,
            "rel_l2": float(diff.norm() / max(ref.norm(), 1e-30)), "finite": bool(torch.isfinite(ours).all())}


def kernel_label(name: str) -> str:
    """A readable key for a kernel: CUTLASS's mangled names differ only deep inside (schedule, wgmma shape)."""
    if "cutlass" not in name:
        return name[:90]
    mma = re.search(r"MMA_(\d+x\d+x\d+)", name)
    schedule = "ping-pong" if "Pingpong" in name else "cooperative"
    epilogue = "+bias+GELU" if "EltAct" in name else "+bias" if "PerRowBias" in name else ""
    return f"CUTLASS GEMM{epilogue} {schedule} wgmma {mma.group(1) if mma else '?'}"


def environment() -> dict:
    """The GPU, driver, toolkit, torch and host a result ran on."""
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    nvcc = subprocess.run("nvcc --version | tail -2", shell=True, capture_output=True, text=True).stdout.strip()
    return {"gpu": torch.cuda.get_device_name(0), "nvidia_smi": smi, "nvcc": nvcc, "torch": torch.__version__,
            "host": machine(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def parse_rows(text: str) -> list[tuple[str, int]]:
    """"U8_32:1,all32:8" -> [("U8_32", 1), ("all32", 8)]: the (lengths, batch) rows of the comparison scripts."""
    return [(dist, int(batch)) for dist, batch in (item.split(":") for item in text.split(","))]


def write_jsonl(path: str, rounds_per_row: int, lines: list[dict]) -> None:
    """A comparison script's result: the machine and rounds on the first line, then one JSON line per result."""
    with open(path, "w") as f:
        f.write(json.dumps({"environment": environment(), "rounds_per_row": rounds_per_row}) + "\n")
        for line in lines:
            f.write(json.dumps(line) + "\n")
