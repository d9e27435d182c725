#!/usr/bin/env bash
# Stage 2 of the GPU rig, on the development machine (nvcc 13, the project's .venv): the op libraries the GPU machine
# loads, into .device_carry/ops/:
#   _bert_ops.so      the op registrations and their input checks (custom_ops/tf/bert_ops.cc, bert_op_inputs.cc,
#                     kernels/validation.cc: the same code //custom_ops:bert_ops links into tensorflow_model_server),
#                     without the CPU kernels, whose MKL the GPU machine lacks;
#   _bert_ops_gpu.so  the TF GPU kernels over the CUDA core (custom_ops/kernels/cuda/build.sh --tf);
# and the harness's C ABI library in .device_carry/cuda/. bertserve.custom_ops loads the GPU kernels beside the
# library that $BERTSERVE_OPS_LIBRARY names (gpu_rig/env.sh sets it there).
# Usage, from the repository root: gpu_rig/build_ops.sh   (PYTHON defaults to .venv/bin/python)
set -euo pipefail
py=${PYTHON:-.venv/bin/python}
out=.device_carry
mkdir -p "$out/ops"
PYTHON=$py custom_ops/kernels/cuda/build.sh "$out/cuda" --tf
cp "$out/cuda/_bert_ops_gpu.so" "$out/ops/"
read -r -a tf_cflags <<<"$(TF_CPP_MIN_LOG_LEVEL=3 "$py" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_compile_flags()))')"
read -r -a tf_lflags <<<"$(TF_CPP_MIN_LOG_LEVEL=3 "$py" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_link_flags()))')"
g++ -O3 -DNDEBUG -shared -fPIC -fvisibility=hidden -Wno-deprecated-declarations -Wno-interference-size -I. "${tf_cflags[@]}" \
  custom_ops/tf/bert_ops.cc custom_ops/tf/bert_op_inputs.cc custom_ops/kernels/validation.cc \
  -o "$out/ops/_bert_ops.so" "${tf_lflags[@]}"
ls -la "$out/ops"
