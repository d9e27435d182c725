// The small tiles of every table (cutlass_gemm_kernels.cuh: RunSmallTile, RunNarrowTile), for each epilogue. Built
// with BERTSERVE_CUTLASS_WEIGHTS_BEFORE_WAIT instead of CUTLASS_ENABLE_GDC_FOR_SM90 (build.sh): their producers
// load the first stages' weights before the programmatic-launch wait (WeightsBeforeWait), which CUTLASS's own
// wait, at the top of the producer, would come before.
#include "custom_ops/kernels/cuda/cutlass_gemm_kernels.cuh"

namespace bertserve {
namespace cuda {
namespace cutlass_gemm {

template <Fused F>
cutlass::Status RunSmallTile(const Problem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using namespace cute;
  return Kernel<F, Shape<_64, _64, _64>, Shape<_1, _1, _1>, Pingpong, PingpongEpilogue>::Run(p, workspace,
                                                                                            workspace_bytes, stream);
}

template <Fused F>
cutlass::Status RunNarrowTile(const Problem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using namespace cute;
  return Kernel<F, Shape<_64, _32, _128>, Shape<_1, _1, _1>, Pingpong, PingpongEpilogue>::Run(p, workspace,
                                                                                             workspace_bytes, stream);
}

#define BERTSERVE_SMALL_TILES(F)                                                                           \
  template cutlass::Status RunSmallTile<F>(const Problem&, void*, size_t, cudaStream_t);                   \
  template cutlass::Status RunNarrowTile<F>(const Problem&, void*, size_t, cudaStream_t);
BERTSERVE_SMALL_TILES(Fused::kNone)
BERTSERVE_SMALL_TILES(Fused::kBias)
BERTSERVE_SMALL_TILES(Fused::kBiasGelu)
BERTSERVE_SMALL_TILES(Fused::kFp32Partials)
#undef BERTSERVE_SMALL_TILES

}  // namespace cutlass_gemm
}  // namespace cuda
}  // namespace bertserve
