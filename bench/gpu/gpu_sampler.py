"""GPU utilisation and memory sampled in the background while load runs: NVML (pynvml, from nvidia-ml-py) where it
imports, else `nvidia-smi` polled, else nothing (a CPU machine), so a script records what the device did during each
step without a profiler in the way."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import numpy as np


def _nvml_reader(index: int):
    """(read, device name, total memory MiB) through NVML."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def read() -> tuple[float, float]:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        return float(util), pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20

    name = pynvml.nvmlDeviceGetName(handle)
    return read, name.decode() if isinstance(name, bytes) else name, pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20


def _smi(index: int, query: str) -> list[str]:
    out = subprocess.run(["nvidia-smi", f"--id={index}", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    return [field.strip() for field in out.strip().split(",")]


def _smi_reader(index: int):
    """(read, device name, total memory MiB) through nvidia-smi."""
    def read() -> tuple[float, float]:
        util, memory = _smi(index, "utilization.gpu,memory.used")
        return float(util), float(memory)

    return read, _smi(index, "name")[0], float(_smi(index, "memory.total")[0])


class GpuSampler:
    """Samples GPU `index` every `period_s` on a thread: (monotonic time, utilisation %, memory used MiB)."""

    def __init__(self, index: int = 0, period_s: float = 0.2):
        self.period_s, self.samples, self.source = period_s, [], "none"
        self._read, self.name, self._total_mib = None, None, None
        try:
            (self._read, self.name, self._total_mib), self.source = _nvml_reader(index), "nvml"
        except Exception:  # noqa: BLE001 - no NVML here: try nvidia-smi, else sample nothing
            if shutil.which("nvidia-smi"):
                (self._read, self.name, self._total_mib), self.source = _smi_reader(index), "nvidia-smi"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)

    def __enter__(self) -> "GpuSampler":
        if self._read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                util, memory = self._read()
                self.samples.append((time.monotonic(), util, memory))
            except Exception:  # noqa: BLE001 - one failed read is a gap, not a reason to stop sampling
                pass
            self._stop.wait(self.period_s)

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def memory_mib(self) -> float | None:
        """Memory in use now (a fresh read), None without a GPU."""
        return self._read()[1] if self._read is not None else None

    def total_mib(self) -> float | None:
        return self._total_mib

    def between(self, start: float, end: float) -> dict:
        """Utilisation (mean, P90, max %) and the most memory used between two now() readings."""
        window = [s for s in self.samples if start <= s[0] <= end]
        if not window:
            return {"source": self.source, "samples": 0}
        util = np.array([s[1] for s in window])
        return {"source": self.source, "samples": len(window), "util_mean_pct": round(float(util.mean()), 1),
                "util_p90_pct": round(float(np.percentile(util, 90)), 1), "util_max_pct": float(util.max()),
                "memory_used_max_mib": max(s[2] for s in window)}
