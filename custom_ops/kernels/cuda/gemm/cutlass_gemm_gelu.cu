// The FFN GEMM + GELU's tile configurations (CUTLASS M x N x K = features x tokens x k): the small tiles
// (cutlass_gemm_kernels.cuh) for a few hundred tokens, wide cooperative and ping-pong tiles with 2-block clusters
// for thousands (each ping-pong consumer warp group owns a tile, so one group's GELU epilogue overlaps the other's
// main loop), and cooperative 256x96 and 256x80 tiles, near one wave on 132 SMs at ~1,000 and ~700 tokens (12 x 11
// tiles at 1,024, 12 x 9 at 704; commits 97a13e2 and af81f49).
#include "custom_ops/kernels/cuda/gemm/cutlass_gemm_kernels.cuh"

namespace bertserve {
namespace cuda {
namespace cutlass_gemm {

const std::vector<Runner>& GeluRunners() {
  using namespace cute;
  constexpr Fused F = Fused::kBiasGelu;
  using Wide = Kernel<F, Shape<_128, _256, _64>, Shape<_2, _1, _1>, Cooperative, CooperativeEpilogue>;
  using Tall = Kernel<F, Shape<_256, _128, _64>, Shape<_1, _2, _1>, Cooperative, CooperativeEpilogue>;
  using Square = Kernel<F, Shape<_128, _128, _64>, Shape<_2, _1, _1>, Cooperative, CooperativeEpilogue>;
  using PingpongWide = Kernel<F, Shape<_64, _256, _64>, Shape<_2, _1, _1>, Pingpong, PingpongEpilogue>;
  using PingpongSquare = Kernel<F, Shape<_128, _128, _64>, Shape<_2, _1, _1>, Pingpong, PingpongEpilogue>;
  using PingpongNarrow = Kernel<F, Shape<_64, _128, _64>, Shape<_2, _1, _1>, Pingpong, PingpongEpilogue>;
  using TallNarrow = Kernel<F, Shape<_256, _96, _64>, Shape<_1, _1, _1>, Cooperative, CooperativeEpilogue>;
  using TallNarrower = Kernel<F, Shape<_256, _80, _64>, Shape<_1, _1, _1>, Cooperative, CooperativeEpilogue>;
  // Each timed at any row count (the third field), the small tiles only up to kSmallGemmMaxTokens.
  static const std::vector<Runner> runners = WithSmallTiles<F>({
      {"cooperative 128x256x64 cluster 2x1", &Wide::Run, true},
      {"cooperative 256x128x64 cluster 1x2", &Tall::Run, true},
      {"cooperative 128x128x64 cluster 2x1", &Square::Run, true},
      {"ping-pong 64x256x64 cluster 2x1", &PingpongWide::Run, true},
      {"ping-pong 128x128x64 cluster 2x1", &PingpongSquare::Run, true},
      {"ping-pong 64x128x64 cluster 2x1", &PingpongNarrow::Run, true},
      {"cooperative 256x96x64", &TallNarrow::Run, true},
      {"cooperative 256x80x64", &TallNarrower::Run, true},
  });
  return runners;
}

}  // namespace cutlass_gemm
}  // namespace cuda
}  // namespace bertserve
