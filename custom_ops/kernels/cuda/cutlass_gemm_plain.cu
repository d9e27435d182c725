// The tile tables of the GEMMs without GELU (QKV with its bias, attention output, FFN output; see PlainRunners in
// cutlass_gemm_kernels.cuh), and the tables' dispatcher.
#include <cstdint>

#include "custom_ops/kernels/cuda/cutlass_gemm_kernels.cuh"

namespace bertserve {
namespace cuda {
namespace cutlass_gemm {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

const std::vector<Runner>& Runners(Fused fused) {
  switch (fused) {
    case Fused::kNone:
      return PlainRunners<Fused::kNone>();
    case Fused::kBias:
      return PlainRunners<Fused::kBias>();
    case Fused::kBiasGelu:
      return GeluRunners();
    default:
      return PartialsRunners();
  }
}

bool Supports(const Problem& p) {
  return p.k_splits >= 1 && p.k % p.k_splits == 0 && p.n % 8 == 0 && (p.k / p.k_splits) % 8 == 0 &&
         Aligned16(p.x) && Aligned16(p.w) && Aligned16(p.y) && (p.bias == nullptr || Aligned16(p.bias));
}

}  // namespace cutlass_gemm
}  // namespace cuda
}  // namespace bertserve
