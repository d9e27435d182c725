#!/usr/bin/env bash
# Packs the CUDA core's objects into the static archive that //custom_ops/gpu:bert_ops_gpu links (build.sh calls
# it; it also runs on objects build.sh made earlier). Usage: core_archive.sh OUT.a OBJECT...
#   CUDA_HOME  the CUDA 13 toolkit the objects were compiled with (its libcudart_static.a; default /usr/local/cuda)
#
# The archive holds one relocatable object: the core's objects and the CUDA 13 runtime linked together (ld -r),
# then every symbol made local except the core's interface (bertserve::cuda::). A tensorflow_model_server built
# with CUDA holds TensorFlow's own runtime (CUDA 12: cudaMalloc, ...) and, through XLA, CUTLASS host code of
# another version; a symbol left global would be defined twice or merged with theirs, and the core's calls could
# end in TensorFlow's runtime. So nothing is shared: COMDAT groups (inline functions, template instantiations)
# are dissolved first, since the final link would otherwise drop our copy of a group in favour of another's.
# As with _bert_ops_gpu.so (`nvcc -cudart static`), the core runs on its own runtime.
set -euo pipefail
(($# >= 2)) || { echo "usage: $0 OUT.a OBJECT..." >&2; exit 2; }
out=$1
shift
cuda=${CUDA_HOME:-/usr/local/cuda}
cudart=$cuda/lib64/libcudart_static.a
[[ -f $cudart ]] || { echo "$0: $cudart not found (set CUDA_HOME to the CUDA 13 toolkit)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ld -r --force-group-allocation -o "$work/bertserve_cuda_core.o" "$@" "$cudart"
# The interface: functions, vtables and typeinfo of the core's namespace (K/V/R: cv- and ref-qualified members).
# objcopy cannot make a GNU unique symbol (u: static locals of inline functions, libcu++'s inline variables)
# local, and another object's copy of one would now clash with ours: those get a prefix, a name no one shares.
nm -g --defined-only --format=posix "$work/bertserve_cuda_core.o" >"$work/globals"
awk '$2 != "u" && $1 ~ /^_Z(T[VIST])?N[KVR]*9bertserve4cuda/ {print $1}' "$work/globals" >"$work/interface"
awk '$2 == "u" {print $1, "bertserve_cuda_core." $1}' "$work/globals" >"$work/renamed"
objcopy --keep-global-symbols="$work/interface" --redefine-syms="$work/renamed" "$work/bertserve_cuda_core.o"
rm -f "$out"
ar rcs "$out" "$work/bertserve_cuda_core.o"
echo "built $out"
