"""The host a benchmark ran on, recorded in its JSON result: timings from shared cores mean little without the CPU
model, the core count and how busy the machine was (the CPU benchmarks, and the GPU harness for its host)."""

from __future__ import annotations

import os
import re
import subprocess

VENDORS = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}


def machine() -> dict:
    """CPU vendor, model, family/model, core count, instruction-set flags and AVX-512 support from lscpu, plus the
    load average (other jobs share these cores)."""
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    vendor_id, flags = fields.get("Vendor ID", ""), fields.get("Flags", "").split()
    return {"vendor": VENDORS.get(vendor_id, vendor_id.lower()), "cpu": fields.get("Model name"),
            "cpu_family_model": f"{fields.get('CPU family')}/{fields.get('Model')}",
            "cores": int(fields.get("CPU(s)", "0")), "flags_avx512f": "avx512f" in flags, "flags": flags,
            "load_average": os.getloadavg()}


def gpu_result_name(device_name: str, kind: str) -> str:
    """The kept name of a GPU result: gpu_h200_<kind>.json for an "NVIDIA H200"."""
    model = re.search(r"\b([A-Z]+[0-9]{1,4})\b", device_name)
    return f"gpu_{(model.group(1) if model else re.sub(r'[^A-Za-z0-9]+', '_', device_name)).lower()}_{kind}.json"
