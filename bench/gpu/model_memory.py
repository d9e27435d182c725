"""GPU memory one served model takes, split as the server's loads see it: weights (the SavedModel's variables and
constants, after the load), arena (the encoder's CUDA-graph arenas and other TF allocations made by the warmup of
every batch shape), and the rest (CUDA graphs, cuBLASLt workspaces and the allocator's reserve beyond what is in
use: device memory used minus TensorFlow's bytes in use).

Models are loaded one after another in this process, as `bertserve serve` loads them (SessionBundle + warmup
replay, server/servable.py and server/warmup.py), with TensorFlow's allocator growing on demand
(TF_FORCE_GPU_ALLOW_GROWTH) so that device memory follows what is used; each copy's figures are the growth it
caused. Device memory is read from NVML / nvidia-smi for the whole GPU, so nothing else may run on it meanwhile.

Usage (GPU machine, after `source gpu_rig/env.sh`; serve_sweep.py runs it once per precision):
  python3 bench/gpu/model_memory.py --version_dir DIR --copies 2 --out memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # before TensorFlow's import: memory grows with use

MIB = 2**20


def _tf_in_use_mib() -> float | None:
    import tensorflow as tf

    try:
        return tf.config.experimental.get_memory_info("GPU:0")["current"] / MIB
    except (ValueError, RuntimeError):
        return None  # no GPU here


def measure(version_dir: str, copies: int) -> dict:
    from bertserve import custom_ops
    from bertserve.bench.gpu.gpu_sampler import GpuSampler
    from bertserve.server.servable import LoadedVersion
    from bertserve.server.warmup import replay_warmup

    custom_ops.load_op_library()
    gpu = GpuSampler()
    before = {"tf_in_use_mib": _tf_in_use_mib(), "device_used_mib": gpu.memory_mib()}
    rows, loaded = [], []
    for copy in range(copies):
        start = time.perf_counter()
        tf0, dev0 = _tf_in_use_mib(), gpu.memory_mib()
        servable = LoadedVersion(f"copy{copy}", 1, version_dir, {"serve"})
        load_s = time.perf_counter() - start
        tf1, dev1 = _tf_in_use_mib(), gpu.memory_mib()
        records = replay_warmup(servable, 1)
        tf2, dev2 = _tf_in_use_mib(), gpu.memory_mib()
        loaded.append(servable)
        row = {"copy": copy, "load_s": round(load_s, 2), "warmup_records": records,
               "warmup_s": round(time.perf_counter() - start - load_s, 2)}
        if None not in (tf0, tf1, tf2, dev0, dev2):
            row.update({"weights_mib": round(tf1 - tf0, 1), "arena_mib": round(tf2 - tf1, 1),
                        "graphs_and_other_mib": round((dev2 - dev0) - (tf2 - tf0), 1),
                        "device_growth_mib": round(dev2 - dev0, 1), "device_growth_at_load_mib": round(dev1 - dev0, 1)})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"version_dir": version_dir, "gpu_source": gpu.source, "before": before, "copies": rows}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version_dir", required=True, help="an exported version folder (with its warmup file)")
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = measure(args.version_dir, args.copies)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
