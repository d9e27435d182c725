// Probe: what the erf-GELU epilogue costs the FFN GEMM (3072 x tokens x 768) at a few hundred to a few thousand
// tokens. Each CUTLASS tile of the core's GEMM + GELU table, and two with clusters along the tokens (the weights'
// tiles multicast to both blocks), runs with the bias epilogue and with bias + GELU, beside cuBLASLt's fastest
// heuristic candidate with its bias epilogue (it has no erf-GELU one). Timed as in gemm_probe.cu: CUDA graphs of
// back-to-back launches in the launch chain, the weights rotating through 96 MB of copies. One JSON line per
// (tokens, variant).
//   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -DNDEBUG -DCUTLASS_ENABLE_GDC_FOR_SM90 \
//     -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED --expt-relaxed-constexpr -I. -I$CUTLASS/include \
//     -I$CUTLASS/tools/util/include -I$CUBLAS/include bench/gpu/probes/gelu_probe.cu -L$CUBLAS/lib -lcublasLt \
//     -o gelu_probe
#include <cuda_fp16.h>

#include <cstdio>
#include <vector>

#include "bench/gpu/probes/probe_check.h"
#include "bench/gpu/probes/probe_cublas.h"
#include "custom_ops/kernels/cuda/gemm/cutlass_gemm_kernels.cuh"

namespace gelu_probe {

using namespace cute;
using namespace bertserve::cuda::cutlass_gemm;
constexpr int kLaunchesPerGraph = 24;
constexpr size_t kWeightPoolBytes = size_t(96) << 20;
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int kFeatures = 3072, kDepth = 768;

struct Variant {
  const char* name;
  cutlass::Status (*bias)(const Problem&, cudaStream_t);
  cutlass::Status (*bias_gelu)(const Problem&, cudaStream_t);
};

template <class TileShape, class ClusterShape, class Schedule, class EpilogueSchedule>
constexpr Variant Both(const char* name) {
  return {name, &Kernel<Fused::kBias, TileShape, ClusterShape, Schedule, EpilogueSchedule>::Run,
          &Kernel<Fused::kBiasGelu, TileShape, ClusterShape, Schedule, EpilogueSchedule>::Run};
}

const std::vector<Variant>& Variants() {
  static const std::vector<Variant> variants = {
      Both<Shape<_256, _80, _64>, Shape<_1, _1, _1>, Cooperative, CooperativeEpilogue>("cooperative 256x80 1x1"),
      Both<Shape<_256, _96, _64>, Shape<_1, _1, _1>, Cooperative, CooperativeEpilogue>("cooperative 256x96 1x1"),
      Both<Shape<_256, _128, _64>, Shape<_1, _2, _1>, Cooperative, CooperativeEpilogue>("cooperative 256x128 1x2"),
      Both<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Cooperative, CooperativeEpilogue>("cooperative 128x256 2x1"),
      Both<Shape<_64, _256, _64>, Shape<_2, _1, _1>, Pingpong, PingpongEpilogue>("ping-pong 64x256 2x1"),
      Both<Shape<_256, _80, _64>, Shape<_1, _2, _1>, Cooperative, CooperativeEpilogue>("cooperative 256x80 1x2"),
      Both<Shape<_256, _96, _64>, Shape<_1, _2, _1>, Cooperative, CooperativeEpilogue>("cooperative 256x96 1x2"),
  };
  return variants;
}

// cuBLASLt's fastest heuristic candidate for W^T-stored weights times X, bias in its epilogue, in microseconds.
float CublasBestMicros(cublasLtHandle_t handle, cudaStream_t stream, int copies, int t, const __half* pool,
                       const __half* x, const __half* bias, __half* y, void* workspace) {
  CublasGemm gemm = MakeCublasGemm(handle, t, kFeatures, kDepth, bias, kWorkspaceBytes, 16);
  float best = 1e30f;
  for (int i = 0; i < gemm.found; ++i) {
    const float us = GraphMicros(stream, copies, kLaunchesPerGraph, [&](int copy) {
      return RunCublasGemm(gemm, i, pool + size_t(copy) * kFeatures * kDepth, x, y, workspace, stream);
    });
    if (us > 0 && us < best) best = us;
  }
  DestroyCublasGemm(gemm);
  return best;
}

}  // namespace gelu_probe

int main() {
  using namespace gelu_probe;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasLtHandle_t handle;
  cublasLtCreate(&handle);
  const int max_t = 2048;
  __half *pool, *x, *y, *bias;
  void* workspace;
  CK(cudaMalloc(&pool, kWeightPoolBytes));
  CK(cudaMalloc(&x, size_t(max_t) * kDepth * 2));
  CK(cudaMalloc(&y, size_t(max_t) * kFeatures * 2));
  CK(cudaMalloc(&bias, kFeatures * 2));
  CK(cudaMalloc(&workspace, kWorkspaceBytes));
  FillKernel<<<1024, 256>>>(pool, kWeightPoolBytes / 2, 1);
  FillKernel<<<1024, 256>>>(x, size_t(max_t) * kDepth, 2);
  FillKernel<<<16, 256>>>(bias, kFeatures, 3);
  CK(cudaDeviceSynchronize());
  const int copies = static_cast<int>(kWeightPoolBytes / 2 / (size_t(kFeatures) * kDepth));
  for (const int t : {654, 704, 736, 1024, 2048}) {
    printf("{\"t\": %d, \"variant\": \"cublaslt best, bias\", \"us\": %.2f}\n", t,
           CublasBestMicros(handle, stream, copies, t, pool, x, bias, y, workspace));
    for (const Variant& v : Variants()) {
      for (const bool gelu : {false, true}) {
        const float us = GraphMicros(stream, copies, kLaunchesPerGraph, [&](int copy) {
          const Problem p{x, pool + size_t(copy) * kFeatures * kDepth, bias, y, t, kFeatures, kDepth, 132};
          return (gelu ? v.bias_gelu : v.bias)(p, stream) == cutlass::Status::kSuccess;
        });
        printf("{\"t\": %d, \"variant\": \"%s, %s\", \"us\": %.2f}\n", t, v.name, gelu ? "bias + GELU" : "bias", us);
      }
    }
    fflush(stdout);
  }
  return 0;
}
