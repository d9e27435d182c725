#!/usr/bin/env bash
# The GPU harness as one device call (from the repository root, with .device_carry made by prepare_carry.py):
# build + correctness, compute-sanitizer memcheck over every kernel variant, then timings, per-kernel profile,
# serving replay, torch.compile and sustained clocks, each stage in its own process so a failure in one keeps the
# others' numbers. (tests/gpu asserts on the same checks: python3 -m pytest -q tests/gpu.)
# The GPU machine has no CUTLASS headers and no network: the core is built on the development machine
# (custom_ops/kernels/cuda/build.sh .device_carry/cuda, nvcc 13 for sm_90a) and carried; without that library
# the build stage runs here. Results land in $OUT under their kept names (gpu_h200_correctness.json,
# gpu_h200_bench.json on an H200: copy them to bench/results/); logs in $OUT/*.log.
set -u
source gpu_rig/env.sh  # bertserve on PYTHONPATH
out=${OUT:-.}
lib_dir=.device_carry/cuda
stages=check
if [[ ! -f $lib_dir/libbertserve_cuda.so ]]; then lib_dir=/tmp/bertserve_cuda_build; stages=build,check; fi
python3 bench/gpu/run_bench.py --stages "$stages" --build-dir "$lib_dir" --out "$out" >"$out/check.log" 2>&1
grep -E "fp16_worst|failed|Error" "$out/check.log"
timeout 170 compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/gpu/sanitize_core.py \
  "$lib_dir/libbertserve_cuda.so" >"$out/memcheck.log" 2>&1
echo "memcheck rc=$?"
tail -2 "$out/memcheck.log"
timeout 330 python3 bench/gpu/run_bench.py --stages time,profile,replay,compile,sustain --build-dir "$lib_dir" \
  --out "$out" >"$out/perf.log" 2>&1
grep -E "failed|Error|^\|" "$out/perf.log"
