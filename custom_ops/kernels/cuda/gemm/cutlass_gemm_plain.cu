// The tile tables of the GEMMs without GELU (QKV with its bias, attention output, FFN output; see PlainRunners in
// cutlass_gemm_kernels.cuh), the tables' dispatcher and lookup, and the plain GEMMs' untuned rule.
#include <cstdint>
#include <string_view>

#include "custom_ops/kernels/cuda/gemm/cutlass_gemm_kernels.cuh"

namespace bertserve {
namespace cuda {
namespace cutlass_gemm {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks of a tile of tile_features x tile_tokens for p's output.
int64_t TileBlocks(const Problem& p, int64_t tile_features, int64_t tile_tokens) {
  return (p.n + tile_features - 1) / tile_features * ((p.m + tile_tokens - 1) / tile_tokens);
}

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

int RunnerIndex(Fused fused, const char* name) {
  const std::vector<Runner>& runners = Runners(fused);
  for (int i = 0; i < static_cast<int>(runners.size()); ++i) {
    if (std::string_view(name) == runners[i].name) return i;
  }
  return -1;
}

double WaveFill(const Problem& p, int64_t tile_features, int64_t tile_tokens) {
  const int64_t blocks = TileBlocks(p, tile_features, tile_tokens);
  const int64_t waves = (blocks + p.sm_count - 1) / p.sm_count;
  return static_cast<double>(blocks) / static_cast<double>(waves * p.sm_count);
}

int DefaultPlainRunner(Fused fused, const Problem& p) {
  if (SmallTileByDefault(p)) return DefaultSmallTile(p);
  const bool one_full_wave = TileBlocks(p, 64, 80) <= p.sm_count && WaveFill(p, 64, 80) >= kMinWaveFill;
  return p.k <= p.n && one_full_wave ? RunnerIndex(fused, "basic 64x80x64") : -1;
}

bool Supports(const Problem& p) {
  return p.k_splits >= 1 && p.k % p.k_splits == 0 && p.n % 8 == 0 && (p.k / p.k_splits) % 8 == 0 &&
         Aligned16(p.x) && Aligned16(p.w) && Aligned16(p.y) && (p.bias == nullptr || Aligned16(p.bias));
}

}  // namespace cutlass_gemm
}  // namespace cuda
}  // namespace bertserve
