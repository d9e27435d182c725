// GEMM + GELU tile configurations with cooperative kernels (CUTLASS M x N x K = features x tokens x k): wide
// tiles with 2-CTA clusters for many tokens, a stream-K tile for a few thousand.
#include "custom_ops/kernels/cuda/gemm_gelu_kernels.cuh"

namespace bertserve {
namespace cuda {
namespace gemm_gelu {

const std::vector<Runner>& CooperativeRunners() {
  using namespace cute;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using cutlass::gemm::PersistentScheduler;
  using cutlass::gemm::StreamKScheduler;
  using Wide = Kernel<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Schedule, Epilogue, PersistentScheduler>;
  using Tall = Kernel<Shape<_256, _128, _64>, Shape<_1, _2, _1>, Schedule, Epilogue, PersistentScheduler>;
  using Square = Kernel<Shape<_128, _128, _64>, Shape<_2, _1, _1>, Schedule, Epilogue, PersistentScheduler>;
  using Narrow = Kernel<Shape<_128, _64, _64>, Shape<_1, _1, _1>, Schedule, Epilogue, StreamKScheduler>;
  static const std::vector<Runner> runners = {
      {"cooperative 128x256x64 cluster 2x1", false, &Wide::Run},
      {"cooperative 256x128x64 cluster 1x2", false, &Tall::Run},
      {"cooperative 128x128x64 cluster 2x1", false, &Square::Run},
      {"cooperative 128x64x64 stream-K", true, &Narrow::Run},
  };
  return runners;
}

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace bertserve
