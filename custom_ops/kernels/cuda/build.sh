#!/usr/bin/env bash
# Builds the CUDA core as libbertserve_cuda.so (the C ABI of ranker_c_api.cu; what bench/gpu loads), without
# Make or Bazel. Usage: build.sh OUT_DIR
#   CUDA_HOME     CUDA 13 toolkit (default /usr/local/cuda)
#   CUBLAS_HOME   folder with include/cublasLt.h and lib/libcublasLt.so* when the toolkit lacks cuBLAS
#                 (PyPI's nvidia-cublas wheel installs one at site-packages/nvidia/cu13)
#   CUDA_ARCH     nvcc -gencode value (default arch=compute_90a,code=sm_90a: Hopper)
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
cublas=${CUBLAS_HOME:-$cuda}
if [[ ! -f $cublas/include/cublasLt.h ]]; then  # fall back on a pip-installed nvidia-cublas (CUDA 13)
  cublas=$(python3 -c 'import nvidia.cu13 as m; print(list(m.__path__)[0])')
fi
arch=${CUDA_ARCH:-arch=compute_90a,code=sm_90a}
mkdir -p "$out"
objs=()
for src in gemm elementwise attention encoder ranker_c_api; do
  "$cuda/bin/nvcc" -std=c++20 -O3 -gencode "$arch" -Xcompiler -fPIC -Xptxas -warn-spills \
    -I"$root" -I"$cublas/include" -c "$here/$src.cu" -o "$out/$src.o" &
  objs+=("$out/$src.o")
done
wait
cublaslt=$(ls "$cublas"/lib*/libcublasLt.so* | head -1)
"$cuda/bin/nvcc" -shared -cudart static -o "$out/libbertserve_cuda.so" "${objs[@]}" \
  -L"$(dirname "$cublaslt")" -l:"$(basename "$cublaslt")" -Xlinker -rpath -Xlinker "$(dirname "$cublaslt")"
echo "built $out/libbertserve_cuda.so"
