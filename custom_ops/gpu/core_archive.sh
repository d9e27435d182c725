#!/usr/bin/env bash
# Packs the CUDA core's objects into the static archive that //custom_ops/gpu:bert_ops_gpu links (build.sh calls
# it; it also runs on objects build.sh made earlier). Usage: core_archive.sh OUT.a OBJECT...
#   CUDA_HOME  the CUDA 13 toolkit the objects were compiled with (its libcudart_static.a; default /usr/local/cuda)
#
# The archive holds one relocatable object: the core's objects and the CUDA 13 runtime linked together (ld -r),
# then every symbol made local except the core's interface (bertserve::cuda::) and weak symbols. That keeps the
# runtime private, as `nvcc -shared -cudart static` does for _bert_ops_gpu.so: a tensorflow_model_server built with
# CUDA links TensorFlow's own runtime entry points (cudaMalloc, ...; CUDA 12), which would otherwise clash with
# ours or take our calls. Weak symbols (inline functions, template instantiations) stay global because the linker
# merges their COMDAT groups by name across objects and would otherwise drop a copy our code still points at.
set -euo pipefail
(($# >= 2)) || { echo "usage: $0 OUT.a OBJECT..." >&2; exit 2; }
out=$1
shift
cuda=${CUDA_HOME:-/usr/local/cuda}
cudart=$cuda/lib64/libcudart_static.a
[[ -f $cudart ]] || { echo "$0: $cudart not found (set CUDA_HOME to the CUDA 13 toolkit)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ld -r -o "$work/bertserve_cuda_core.o" "$@" "$cudart"
# Global definitions to keep: the core's namespace (functions, vtables, typeinfo; K/V/R: cv- and ref-qualified
# member functions) and the weak ones (W, V, u: COMDAT and unique symbols).
nm -g --defined-only --format=posix "$work/bertserve_cuda_core.o" |
  awk '$2 ~ /^[WVu]$/ || $1 ~ /^_Z(T[VIST])?N[KVR]*9bertserve4cuda/ {print $1}' >"$work/interface"
objcopy --keep-global-symbols="$work/interface" "$work/bertserve_cuda_core.o"
rm -f "$out"
ar rcs "$out" "$work/bertserve_cuda_core.o"
echo "built $out"
