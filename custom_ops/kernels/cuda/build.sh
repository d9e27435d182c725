#!/usr/bin/env bash
# Builds the CUDA core as libbertserve_cuda.so (with the C ABI of custom_ops/c_api/ranker_c_api.cu: what
# bench/gpu and tests/gpu load), without Make or Bazel, and libbertserve_cuda_core.a, the core with a private CUDA
# runtime that //custom_ops/gpu links into a tensorflow_model_server (custom_ops/gpu/core_archive.sh); with --tf
# also _bert_ops_gpu.so, the TensorFlow GPU kernels (custom_ops/tf/*_gpu*) over the same core, to load after
# _bert_ops.so. Usage: build.sh OUT_DIR [--tf]
#   CUDA_HOME     CUDA 13 toolkit (default /usr/local/cuda)
#   CUBLAS_HOME   folder with include/cublasLt.h and lib/libcublasLt.so* when the toolkit lacks cuBLAS
#                 (PyPI's nvidia-cublas wheel installs one at site-packages/nvidia/cu13)
#   CUTLASS_HOME  folder with include/cutlass (default: PyPI's nvidia-cutlass wheel, cutlass_library/source)
#   CUDA_ARCH     nvcc -gencode value (default arch=compute_90a,code=sm_90a: Hopper)
#   PYTHON        a Python with tensorflow, for its compile and link flags (--tf only; default python3)
#   BUILD_JOBS    compiles at once (default: all); each CUTLASS file takes up to ~10 GB of memory while it compiles
# The CUDA runtime is linked statically (-cudart static): TensorFlow 2.21 is a CUDA 12.5 build and loads its own
# runtime; ours (CUDA 13, driver R580+) only ever uses the stream TensorFlow hands the kernels.
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
cublas=${CUBLAS_HOME:-$cuda}
py=${PYTHON:-python3}
if [[ ! -f $cublas/include/cublasLt.h ]]; then  # fall back on a pip-installed nvidia-cublas (CUDA 13)
  cublas=$("$py" -c 'import nvidia.cu13 as m; print(list(m.__path__)[0])')
fi
cutlass=${CUTLASS_HOME:-$("$py" -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')}
arch=${CUDA_ARCH:-arch=compute_90a,code=sm_90a}
# NDEBUG keeps CUTLASS's asserts out of the wgmma pipelines (ptxas serialises wgmma across their calls).
# CUTLASS_ENABLE_GDC_FOR_SM90 compiles CUTLASS's programmatic-launch waits and triggers into its kernels (every
# translation unit alike, so that no inline function has two definitions).
# CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED lets CUTLASS pick wgmma atoms of every width, 80 tokens among them (the
# tiles of 80 tokens; without it a tile's width falls back to a divisor, 16 for 80).
cutlass_flags=(-DNDEBUG -DCUTLASS_ENABLE_GDC_FOR_SM90 -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
  --expt-relaxed-constexpr
  -diag-suppress 2908 -I"$cutlass/include" -I"$cutlass/tools/util/include")
mkdir -p "$out"
# Compiles in parallel, at most BUILD_JOBS at once; with set -e a failed compile fails the script at its wait.
jobs_max=${BUILD_JOBS:-0}
running=0
core_objs=()
# Sources relative to this folder; the C ABI last (it is not part of _bert_ops_gpu.so).
for src in gemm/cutlass_gemm_gelu gemm/cutlass_gemm_plain gemm/cutlass_gemm_partials gemm/gemm_gelu gemm/gemm_ksplit \
    gemm/gemm elementwise attention encoder encoder_bucketed graph_cache host_staging pooler_head ../validation.cc \
    ../../c_api/ranker_c_api; do
  [[ $src == *.cc ]] || src=$src.cu
  obj="$out/$(basename "${src%.*}").o"
  if (( jobs_max > 0 && running >= jobs_max )); then wait -n; running=$((running - 1)); fi
  "$cuda/bin/nvcc" -std=c++20 -O3 -gencode "$arch" -Xcompiler -fPIC,-fvisibility=hidden -Xptxas -warn-spills \
    "${cutlass_flags[@]}" \
    -I"$root" -I"$cublas/include" -c "$here/$src" -o "$obj" &
  running=$((running + 1))
  [[ $src == */ranker_c_api.cu ]] || core_objs+=("$obj")
done
while (( running > 0 )); do wait -n; running=$((running - 1)); done
cublaslt=$(ls "$cublas"/lib*/libcublasLt.so* | head -1)
"$cuda/bin/nvcc" -shared -cudart static -o "$out/libbertserve_cuda.so" "${core_objs[@]}" "$out/ranker_c_api.o" \
  -L"$(dirname "$cublaslt")" -l:"$(basename "$cublaslt")" -Xlinker -rpath -Xlinker "$(dirname "$cublaslt")"
if nm -C --undefined-only "$out/libbertserve_cuda.so" | grep bertserve; then
  echo "libbertserve_cuda.so leaves core symbols undefined (a source missing above?)" >&2
  exit 1
fi
echo "built $out/libbertserve_cuda.so"
# The archive leaves out the input checks: //custom_ops:bert_ops brings them, compiled with the server's flags.
archive_objs=()
for obj in "${core_objs[@]}"; do
  [[ $obj == */validation.o ]] || archive_objs+=("$obj")
done
CUDA_HOME=$cuda "$root/custom_ops/gpu/core_archive.sh" "$out/libbertserve_cuda_core.a" "${archive_objs[@]}"
[[ ${2:-} == --tf ]] || exit 0
read -r -a tf_cflags <<<"$(TF_CPP_MIN_LOG_LEVEL=3 "$py" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_compile_flags()))')"
read -r -a tf_lflags <<<"$(TF_CPP_MIN_LOG_LEVEL=3 "$py" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_link_flags()))')"
pids=()
tf_objs=()
for src in custom_ops/tf/bert_kernels_gpu.cu.cc custom_ops/tf/bert_op_inputs.cc; do
  obj="$out/$(basename "${src%%.*}")_tf.o"
  "$cuda/bin/nvcc" -x c++ -O3 -Xcompiler -fPIC -Xcompiler -Wno-deprecated-declarations "${tf_cflags[@]}" \
    -I"$root" -I"$cublas/include" -c "$root/$src" -o "$obj" &
  pids+=($!)
  tf_objs+=("$obj")
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$cuda/bin/nvcc" -shared -cudart static -o "$out/_bert_ops_gpu.so" "${tf_objs[@]}" "${core_objs[@]}" \
  -L"$(dirname "$cublaslt")" -l:"$(basename "$cublaslt")" -Xlinker -rpath -Xlinker "$(dirname "$cublaslt")" \
  "${tf_lflags[@]}"
echo "built $out/_bert_ops_gpu.so"
