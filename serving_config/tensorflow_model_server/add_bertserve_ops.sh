#!/usr/bin/env bash
# Links the bertserve ops into a TensorFlow Serving source tree, the way g3doc/custom_op.md describes:
#   - WORKSPACE gains local repositories @bertserve (this checkout), @bertserve_tensorflow
#     (third_party/serving/tensorflow: the ops' TensorFlow dependency mapped onto @org_tensorflow) and
#     @bertserve_blas (third_party/serving/blas: Intel MKL from PyPI under /opt/mkl);
#   - tensorflow_serving/model_servers/BUILD gets @bertserve//custom_ops:bert_ops, a cc_library(alwayslink = 1),
#     added to SUPPORTED_TENSORFLOW_OPS, which server_lib (and so tensorflow_model_server) links.
# Idempotent. Usage: add_bertserve_ops.sh <tensorflow-serving-source-dir> [<bertserve-checkout>]
set -euo pipefail

die() { echo "add_bertserve_ops.sh: $*" >&2; exit 1; }

[[ $# -ge 1 ]] || die "usage: $0 <tensorflow-serving-source-dir> [<bertserve-checkout>]"
serving="$(cd "$1" && pwd)"
bertserve="$(cd "${2:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)"
workspace="$serving/WORKSPACE"
servers_build="$serving/tensorflow_serving/model_servers/BUILD"
ops_label="@bertserve//custom_ops:bert_ops"

[[ -f "$workspace" ]] || die "$workspace not found: is $serving a tensorflow/serving checkout?"
[[ -f "$servers_build" ]] || die "$servers_build not found: is $serving a tensorflow/serving checkout?"
[[ -f "$bertserve/custom_ops/BUILD" && -d "$bertserve/third_party/serving" ]] ||
  die "$bertserve is not a bertserve checkout (custom_ops/BUILD, third_party/serving/)"
[[ -f "$bertserve/WORKSPACE" ]] || die "$bertserve/WORKSPACE missing (local_repository needs it)"
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

if ! grep -qF "\"$ops_label\"" "$servers_build"; then
  sed -i "s|^SUPPORTED_TENSORFLOW_OPS = |SUPPORTED_TENSORFLOW_OPS = [\"$ops_label\"] + |" "$servers_build"
fi
grep -qF "SUPPORTED_TENSORFLOW_OPS = [\"$ops_label\"] + " "$servers_build" ||
  die "could not add $ops_label to SUPPORTED_TENSORFLOW_OPS in $servers_build"
echo "add_bertserve_ops.sh: $ops_label is in SUPPORTED_TENSORFLOW_OPS of $servers_build"
