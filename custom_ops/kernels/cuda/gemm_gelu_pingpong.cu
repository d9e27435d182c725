// GEMM + GELU tile configurations with ping-pong kernels (CUTLASS M x N x K = features x tokens x k): each consumer
// warp group owns a tile, so one group's GELU epilogue overlaps the other's main loop.
#include "custom_ops/kernels/cuda/gemm_gelu_kernels.cuh"

namespace bertserve {
namespace cuda {
namespace gemm_gelu {

const std::vector<Runner>& PingpongRunners() {
  using namespace cute;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
  using cutlass::gemm::PersistentScheduler;
  using Wide = Kernel<Shape<_64, _256, _64>, Shape<_2, _1, _1>, Schedule, Epilogue, PersistentScheduler>;
  using Square = Kernel<Shape<_128, _128, _64>, Shape<_2, _1, _1>, Schedule, Epilogue, PersistentScheduler>;
  using Small = Kernel<Shape<_64, _128, _64>, Shape<_2, _1, _1>, Schedule, Epilogue, PersistentScheduler>;
  static const std::vector<Runner> runners = {
      {"ping-pong 64x256x64 cluster 2x1", false, &Wide::Run},
      {"ping-pong 128x128x64 cluster 2x1", false, &Square::Run},
      {"ping-pong 64x128x64 cluster 2x1", false, &Small::Run},
  };
  return runners;
}

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace bertserve
