// The CUTLASS GEMM + GELU kernels GemmBiasGelu chooses from; declared here, compiled in gemm_gelu_*.cu (see
// gemm_gelu_kernels.cuh), so that the dispatcher does not instantiate CUTLASS templates.
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_GELU_RUNNERS_H_
#define BERTSERVE_KERNELS_CUDA_GEMM_GELU_RUNNERS_H_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cutlass/cutlass.h"

namespace bertserve {
namespace cuda {
namespace gemm_gelu {

// One call: device pointers and our row-major shape, Y[m, n] = GELU(X[m, k] @ W[k, n] + bias[n]).
struct Problem {
  const __half* x;
  const __half* w;
  const __half* bias;
  __half* y;
  int64_t m, n, k;
  int sm_count;
};

// A compiled tile configuration. splits > 1 forces split-K (stream-K configurations only); 0 lets CUTLASS's
// stream-K heuristic decide; data-parallel configurations ignore it.
struct Runner {
  const char* name;
  bool stream_k;
  // kSuccess or why not; launches nothing when the configuration cannot run the shape or needs more workspace.
  cutlass::Status (*run)(const Problem& p, int splits, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);
};

// Warp-specialised cooperative kernels (two consumer warp groups share a tile), and ping-pong kernels (each
// consumer warp group owns a tile, its epilogue overlapping the other's main loop).
const std::vector<Runner>& CooperativeRunners();
const std::vector<Runner>& PingpongRunners();

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_GELU_RUNNERS_H_
