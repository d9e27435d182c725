// The tile configurations of the GEMMs without GELU (QKV with its bias, attention output, FFN output), CUTLASS
// M x N x K = features x tokens x k: the three that beat or matched cuBLASLt somewhere from 32 to 736 tokens on
// the H200 once launched as programmatic dependents (bench/gpu/gemm_probe.cu, log step 31). Also the tables'
// dispatcher.
#include <cstdint>

#include "custom_ops/kernels/cuda/cutlass_gemm_kernels.cuh"

namespace bertserve {
namespace cuda {
namespace cutlass_gemm {
namespace {

template <Fused F>
const std::vector<Runner>& PlainRunners() {
  using namespace cute;
  using Small = Kernel<F, Shape<_64, _64, _64>, Shape<_1, _1, _1>, Pingpong, PingpongEpilogue>;
  using Narrow = Kernel<F, Shape<_64, _128, _64>, Shape<_1, _1, _1>, Pingpong, PingpongEpilogue>;
  using Square = Kernel<F, Shape<_128, _128, _64>, Shape<_1, _1, _1>, Cooperative, CooperativeEpilogue>;
  static const std::vector<Runner> runners = {
      {"ping-pong 64x64x64", &Small::Run},
      {"ping-pong 64x128x64", &Narrow::Run},
      {"cooperative 128x128x64", &Square::Run},
  };
  return runners;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

const std::vector<Runner>& Runners(Fused fused) {
  switch (fused) {
    case Fused::kNone:
      return PlainRunners<Fused::kNone>();
    case Fused::kBias:
      return PlainRunners<Fused::kBias>();
    default:
      return GeluRunners();
  }
}

bool Supports(const Problem& p) {
  return p.n % 8 == 0 && p.k % 8 == 0 && Aligned16(p.x) && Aligned16(p.w) && Aligned16(p.y) &&
         (p.bias == nullptr || Aligned16(p.bias));
}

}  // namespace cutlass_gemm
}  // namespace cuda
}  // namespace bertserve
