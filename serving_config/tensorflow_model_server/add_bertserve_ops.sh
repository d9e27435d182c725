#!/usr/bin/env bash
# Links the bertserve ops into a TensorFlow Serving source tree, the way g3doc/custom_op.md describes:
#   - WORKSPACE gains local repositories @bertserve (this checkout), @bertserve_tensorflow
#     (third_party/serving/tensorflow: the ops' TensorFlow dependency mapped onto @org_tensorflow) and
#     @bertserve_blas (third_party/serving/blas: Intel MKL from PyPI under /opt/mkl);
#   - tensorflow_serving/model_servers/BUILD gets @bertserve//custom_ops:bert_ops, a cc_library(alwayslink = 1),
#     added to SUPPORTED_TENSORFLOW_OPS, which server_lib (and so tensorflow_model_server) links.
# With --gpu (for a server built with --config=cuda) also the TF GPU kernels: WORKSPACE gains @bertserve_cuda
# (third_party/cuda_core.bzl: the CUDA core archive that custom_ops/kernels/cuda/build.sh makes, and the CUDA 13
# headers) and SUPPORTED_TENSORFLOW_OPS @bertserve//custom_ops/gpu:bert_ops_gpu.
# Idempotent; --gpu may follow a run without it. Usage:
#   add_bertserve_ops.sh [--gpu] <tensorflow-serving-source-dir> [<bertserve-checkout>]
set -euo pipefail

die() { echo "add_bertserve_ops.sh: $*" >&2; exit 1; }

gpu=false
if [[ ${1:-} == --gpu ]]; then
  gpu=true
  shift
fi
[[ $# -ge 1 && $1 != -* ]] || die "usage: $0 [--gpu] <tensorflow-serving-source-dir> [<bertserve-checkout>]"
serving="$(cd "$1" && pwd)"
bertserve="$(cd "${2:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)"
workspace="$serving/WORKSPACE"
servers_build="$serving/tensorflow_serving/model_servers/BUILD"
ops_labels=("@bertserve//custom_ops:bert_ops")
if $gpu; then
  ops_labels+=("@bertserve//custom_ops/gpu:bert_ops_gpu")
fi

[[ -f "$workspace" ]] || die "$workspace not found: is $serving a tensorflow/serving checkout?"
[[ -f "$servers_build" ]] || die "$servers_build not found: is $serving a tensorflow/serving checkout?"
[[ -f "$bertserve/custom_ops/BUILD" && -d "$bertserve/third_party/serving" ]] ||
  die "$bertserve is not a bertserve checkout (custom_ops/BUILD, third_party/serving/)"
[[ -f "$bertserve/WORKSPACE" ]] || die "$bertserve/WORKSPACE missing (local_repository needs it)"
if $gpu; then
  [[ -f "$bertserve/custom_ops/gpu/BUILD" && -f "$bertserve/third_party/cuda_core.bzl" ]] ||
    die "$bertserve has no GPU target (custom_ops/gpu/BUILD, third_party/cuda_core.bzl)"
fi
grep -q '^SUPPORTED_TENSORFLOW_OPS = ' "$servers_build" ||
  die "no 'SUPPORTED_TENSORFLOW_OPS = ' line in $servers_build: this TF Serving version links custom ops differently"

if ! grep -q 'name = "bertserve"' "$workspace"; then
  cat >>"$workspace" <<WORKSPACE

# bertserve fused BERT encoder ops (serving_config/tensorflow_model_server/add_bertserve_ops.sh).
local_repository(
    name = "bertserve",
    path = "$bertserve",
)

local_repository(
    name = "bertserve_tensorflow",
    path = "$bertserve/third_party/serving/tensorflow",
)

local_repository(
    name = "bertserve_blas",
    path = "$bertserve/third_party/serving/blas",
)
WORKSPACE
fi

if $gpu && ! grep -q 'name = "bertserve_cuda"' "$workspace"; then
  cat >>"$workspace" <<'WORKSPACE'

# bertserve's CUDA core, built outside Bazel (custom_ops/kernels/cuda/build.sh), and the CUDA 13 headers:
# BERTSERVE_CUDA_CORE and BERTSERVE_CUDA_HOME say where (third_party/cuda_core.bzl).
load("@bertserve//third_party:cuda_core.bzl", "cuda_core_repository")

cuda_core_repository(name = "bertserve_cuda")
WORKSPACE
fi

for ops_label in "${ops_labels[@]}"; do
  if ! grep -qF "\"$ops_label\"" "$servers_build"; then
    sed -i "s|^SUPPORTED_TENSORFLOW_OPS = |SUPPORTED_TENSORFLOW_OPS = [\"$ops_label\"] + |" "$servers_build"
  fi
  grep -qE "^SUPPORTED_TENSORFLOW_OPS = (\[[^]]*\] \+ )*\[\"$ops_label\"\] \+ " "$servers_build" ||
    die "could not add $ops_label to SUPPORTED_TENSORFLOW_OPS in $servers_build"
  echo "add_bertserve_ops.sh: $ops_label is in SUPPORTED_TENSORFLOW_OPS of $servers_build"
done
