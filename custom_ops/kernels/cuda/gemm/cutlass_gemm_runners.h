// The CUTLASS sm90 GEMMs (TMA loads, wgmma, warp-specialised, persistent) that the fp16 GEMM plans choose from,
// one table per epilogue; declared here, compiled in cutlass_gemm_{plain,gelu}.cu (see cutlass_gemm_kernels.cuh),
// so that the dispatchers do not instantiate CUTLASS templates.
//
// The kernels join the programmatic launch chain (the core is built with CUTLASS_ENABLE_GDC_FOR_SM90): each lets
// the kernel after it launch once its main loop is done, and up to kChainMaxTokens rows it is launched with
// programmatic stream serialization itself, so it is scheduled while the kernel before it drains and waits for it
// before its first load. cuBLASLt's kernels cannot do that, which at a few hundred tokens or fewer is what makes
// these win (commit 36bc021).
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_CUTLASS_GEMM_RUNNERS_H_
#define BERTSERVE_KERNELS_CUDA_GEMM_CUTLASS_GEMM_RUNNERS_H_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cutlass/cutlass.h"

namespace bertserve {
namespace cuda {
namespace cutlass_gemm {

// Above this many rows a kernel is launched without programmatic serialization: at large batch the persistent
// blocks launched early beside the kernel before them made the sustained forward slower (commit e3c800a).
constexpr int64_t kChainMaxTokens = 4096;

// What the epilogue applies to the fp32 accumulators before the one rounding to fp16; kFp32Partials: nothing, and
// the output is fp32, one [m, n] partial product per slice of k (Problem::k_splits) for a LayerNorm to sum.
enum class Fused { kNone, kBias, kBiasGelu, kFp32Partials };

// One call: device pointers and our row-major shape, Y[m, n] = X[m, k] @ W[k, n] (+ bias[n], GELU). With k_splits
// S > 1 (Fused::kFp32Partials only), y is [S, m, n] fp32: y[s] = X[:, s-th k / S columns] @ W[s-th k / S rows, :].
struct Problem {
  const __half* x;
  const __half* w;
  const __half* bias;  // ignored for Fused::kNone and kFp32Partials
  void* y;             // __half, or float for Fused::kFp32Partials
  int64_t m, n, k;
  int sm_count;
  int k_splits = 1;
};

// A compiled tile configuration.
struct Runner {
  const char* name;
  // kSuccess or why not; launches nothing when the configuration cannot run the shape.
  cutlass::Status (*run)(const Problem& p, cudaStream_t stream);
  // Whether the autotuners time it above kSmallGemmMaxTokens rows (below, they time every configuration).
  bool timed_at_any_rows = false;
};

// The configurations for one epilogue. Each table starts with the four small tiles (one block a cluster):
// 64x64x64 and the narrow 64x32x128 (features x tokens x k, for 32 rows or fewer), each as a persistent ping-pong
// kernel and as a non-persistent ("basic") one.
const std::vector<Runner>& Runners(Fused fused);
constexpr int kSmallTile = 0;
constexpr int kNarrowTile = 1;
constexpr int kBasicNarrowTile = 2;
constexpr int kBasicSmallTile = 3;

// Whether a shape nobody timed runs as a small-tile kernel rather than cuBLASLt: a few hundred rows or fewer,
// and k <= n. On the H200 (commit 36bc021) it beat cuBLASLt there in the forward; with k = 4n (the FFN output) its
// n / 64 blocks each stream too much of the weights, and cuBLASLt's split-k kernels are faster.
// Above kSmallGemmMaxTokens rows the autotuners time only the configurations marked Runner::timed_at_any_rows:
// not the small tiles, nor the plain GEMMs' wider ping-pong and cooperative tiles, which timed back to back beat
// cuBLASLt there and in the forward lost (commit 2fac7ed). The plain GEMMs' basic tiles of 80 and 96 tokens are
// marked: the autotuner chose 64x80 for the attention output at 704 tokens and 64x96 for QKV at 192 rows, and the
// forward was faster with them (commit af81f49); so are the GEMM + GELU's tiles other than the small ones.
constexpr int64_t kSmallGemmMaxTokens = 256;
inline bool SmallTileByDefault(const Problem& p) { return p.m <= kSmallGemmMaxTokens && p.k <= p.n; }

// Whether the autotuners time `runner` for a shape of m rows (the rule above).
inline bool TimedAt(const Runner& runner, int64_t m) { return m <= kSmallGemmMaxTokens || runner.timed_at_any_rows; }

// Which small tile a shape nobody timed runs as: the narrow one as a non-persistent kernel up to
// kNarrowTileMaxTokens rows, where the autotuner chose it for nearly every GEMM of the chit-chat ranker (commits
// 1570471 and 8b4d31d), the ping-pong 64x64x64 above.
constexpr int64_t kNarrowTileMaxTokens = 64;
inline int DefaultSmallTile(const Problem& p) {
  return p.m <= kNarrowTileMaxTokens ? kBasicNarrowTile : kSmallTile;
}

// The index of the configuration called `name` in Runners(fused), or -1.
int RunnerIndex(Fused fused, const char* name);

// The fraction of the waves they take on p.sm_count SMs that the blocks of a tile of tile_features x tile_tokens
// fill for p's output (1: whole waves). The untuned rules above kSmallGemmMaxTokens pick tiles that fill at least
// kMinWaveFill.
double WaveFill(const Problem& p, int64_t tile_features, int64_t tile_tokens);
constexpr double kMinWaveFill = 0.8;

// Which plain configuration (Fused::kNone or kBias) a shape nobody timed runs as, or -1 for cuBLASLt: the small
// tiles where SmallTileByDefault, and for k <= n the basic 64x80x64 tile where its blocks make one wave at least
// kMinWaveFill full: the autotuner chose it for the attention output at 679 and 704 rows (12 x 9 blocks of 132
// SMs), cuBLASLt at 512 and 1,024 (84 and 156 blocks) and for the QKV GEMM (commit 633f8a1).
int DefaultPlainRunner(Fused fused, const Problem& p);

// Whether CUTLASS's TMA can take these operands: n and k / k_splits multiples of 8, k_splits dividing k, every
// pointer 16-byte aligned.
bool Supports(const Problem& p);

}  // namespace cutlass_gemm
}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_CUTLASS_GEMM_RUNNERS_H_
