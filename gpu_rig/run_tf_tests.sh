#!/usr/bin/env bash
# The TensorFlow GPU tests on the GPU machine (tests/gpu/test_tf_gpu_*.py) and a compute-sanitizer memcheck of the TF
# path (tests/gpu/memcheck_tf.py), from the repository root after `source gpu_rig/env.sh` (which must set
# BERTSERVE_OPS_LIBRARY and BERTSERVE_GPU_REFERENCE). Output under $OUT (default ./tf_gpu_out):
#   tf_gpu_tests.log         pytest's output, the numbers each test checks included
#   memcheck_tf.log          compute-sanitizer's full report and the script's output
#   memcheck_tf_summary.txt  its ERROR SUMMARY line and the script's last line
# Usage: gpu_rig/run_tf_tests.sh [tests|memcheck|all (default)] [pytest arguments...]
#   A device call runs at most 10 minutes and each stage is timed out within that, so run the stages in two calls:
#   `gpu_rig/run_tf_tests.sh tests`, then `gpu_rig/run_tf_tests.sh memcheck` (or a selection: tests -k accuracy).
set -uo pipefail
stage=${1:-all}
shift || true
out=${OUT:-tf_gpu_out}
mkdir -p "$out"
status=0
if [[ $stage == tests || $stage == all ]]; then
  timeout "${TESTS_TIMEOUT:-560}" python3 -m pytest -v -s -p no:cacheprovider tests/gpu/test_tf_gpu_*.py "$@" 2>&1 |
    tee "$out/tf_gpu_tests.log"
  status=${PIPESTATUS[0]}
fi
if [[ $stage == memcheck || $stage == all ]]; then
  # TF_GPU_ALLOCATOR=cuda_malloc: every TensorFlow allocation its own cuMemAlloc (the encoder's arena included), so
  # memcheck sees each buffer's bounds instead of one region of TensorFlow's BFC allocator.
  # The timeout leaves a device call (10 minutes at most) time to bring the log back.
  TF_GPU_ALLOCATOR=cuda_malloc timeout "${MEMCHECK_TIMEOUT:-540}" \
    "${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}" --tool memcheck \
    --leak-check no --error-exitcode 9 --log-file "$out/memcheck_tf.sanitizer.log" \
    python3 tests/gpu/memcheck_tf.py >"$out/memcheck_tf.log" 2>&1
  memcheck_status=$?
  cat "$out/memcheck_tf.sanitizer.log" >>"$out/memcheck_tf.log"
  rm -f "$out/memcheck_tf.sanitizer.log"
  { grep -h "ERROR SUMMARY" "$out/memcheck_tf.log" || echo "no ERROR SUMMARY: compute-sanitizer did not finish"
    grep -h "^memcheck_tf:" "$out/memcheck_tf.log"; echo "exit status $memcheck_status"; } | tee "$out/memcheck_tf_summary.txt"
  (( memcheck_status == 0 )) || status=$memcheck_status
fi
exit "$status"
