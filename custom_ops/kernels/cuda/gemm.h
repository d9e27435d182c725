// GemmContext: the cuBLASLt handle plus one cached plan per GEMM shape, for Gemm (cuBLASLt, or in fp16 a CUTLASS
// kernel) and for the FFN's GEMM + GELU (GemmBiasGelu). Every GEMM of the encoder is row-major
// Y[m, n] = X[m, k] @ W[k, n] (+ bias[n], + GELU) with TF's [in, out] kernels, fp16 or fp32 storage, fp32
// accumulation. Plans are host-side objects: once a shape has been seen, a call never touches the device beyond
// the matmul itself, so a CUDA graph captured after the first call replays the planned algorithm.
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_H_
#define BERTSERVE_KERNELS_CUDA_GEMM_H_

#include <cuda_fp16.h>

#include <cstdint>
#include <functional>
#include <string>

namespace bertserve {
namespace cuda {

struct GemmContext;

struct GemmOptions {
  // Time cuBLASLt's best few candidates on the real operands when a shape is first planned and keep the fastest.
  // That first call waits for the device (never while the stream is being captured), so it suits callers that
  // plan shapes ahead (the harness's graph buckets), not a serving op that sees a new token count per batch.
  bool autotune = false;
  // fp16 GEMMs may run as CUTLASS sm90 kernels that join the core's programmatic launch chain (common.cuh), which
  // cuBLASLt's cannot, for a few hundred rows or fewer (cutlass_gemm::kSmallGemmMaxTokens; two tiles at any row
  // count, cutlass_gemm::Runner::timed_at_any_rows): with autotuning where they time faster, otherwise by
  // cutlass_gemm::SmallTileByDefault. And fp16 encoders run the FFN GEMM + GELU
  // through GemmBiasGelu, which may put GELU in a CUTLASS GEMM's epilogue instead of a pass of its own over the
  // activations. Off: cuBLASLt and the GELU pass, always.
  bool custom_gemms = true;
};

enum class Epilogue { kNone, kBias };

// Bytes of device scratch one cuBLASLt call may use (the caller's workspace reserves this much).
constexpr int64_t kGemmWorkspaceBytes = 32ll << 20;

// Throws std::runtime_error if cuBLASLt cannot be initialised on the current device.
GemmContext* CreateGemmContext(const GemmOptions& options = GemmOptions());
void DestroyGemmContext(GemmContext* context);
const GemmOptions& OptionsOf(const GemmContext* context);

// Y = X @ W with the epilogue, all device pointers, enqueued on stream. (TIn, TOut) is (__half, __half),
// (float, float) or (__half, float); bias is TIn and ignored for Epilogue::kNone. gemm_workspace holds
// kGemmWorkspaceBytes. Throws std::runtime_error naming the shape when cuBLASLt fails. With autotuning, the first
// call for a shape times cuBLASLt's candidates (and for (__half, __half) with custom_gemms the CUTLASS ones), each
// followed by `consumer` when given: the kernel that reads Y in the forward, so that a candidate is not ranked by
// how it overlaps a copy of itself (a CUTLASS kernel launched back to back hides its tail under the next one's).
template <typename TIn, typename TOut>
void Gemm(GemmContext* context, const TIn* x, const TIn* w, const TIn* bias, TOut* y, int64_t m, int64_t n,
          int64_t k, Epilogue epilogue, void* gemm_workspace, void* stream,
          const std::function<void()>& consumer = {});

// Y = GELU(X @ W + bias), GELU in BERT's erf form, fp16 with fp32 accumulation, one of two ways, chosen per shape: a
// CUTLASS sm90 GEMM (TMA, wgmma) with bias and GELU in its fp32 epilogue, which saves a pass over Y, or the plain GEMM
// (Gemm's plan) followed by a bias + GELU pass, faster at a few hundred tokens. With autotuning,
// the first call for a shape times both on the real operands, each followed by `consumer` when given (the kernel
// that reads Y, as for Gemm: timed alone, the basic and ping-pong 64x32x128 tiles tie at 32 rows, and the basic one
// makes the forward slower; commit 060d068); otherwise the CUTLASS GEMM runs up to kSmallGemmMaxTokens rows
// (cutlass_gemm::SmallTileByDefault) and above where a tile's blocks fill most of their waves (the tile by token
// count, gemm/gemm_gelu.cu's DefaultPlan), GEMM + pass otherwise. Shapes CUTLASS cannot take (n or k not a multiple of
// 8, pointers not 16-byte aligned) or declines run as GEMM + pass.
void GemmBiasGelu(GemmContext* context, const __half* x, const __half* w, const __half* bias, __half* y, int64_t m,
                  int64_t n, int64_t k, void* gemm_workspace, void* stream,
                  const std::function<void()>& consumer = {});

// Y = X @ W as fp32 partial products over S slices of k, partials[s] = X[:, s k/S : (s+1) k/S] @ W[s k/S :
// (s+1) k/S, :] ([S, m, n]), for a residual LayerNorm to sum (LaunchPartialsResidualLayerNorm): a GEMM of a few
// hundred rows or fewer then runs on S times the blocks of its output tiles and stays in the launch chain, where
// cuBLASLt's split-k kernel and its reduction break it twice. Returns S, or 0 when the shape should run as Gemm
// instead: custom_gemms off, more than kKSplitMaxTokens rows, operands CUTLASS's TMA cannot take, or (with
// autotuning) no split timed faster than Gemm's plan; without autotuning, S = k / n where k > n (the FFN output),
// and 3 or 4 where k = n up to 128 rows (the attention output; gemm/gemm_ksplit.cu's DefaultPlan).
// partials holds kMaxKSplits * m * n floats.
// consumer(S) enqueues the kernel that reads the output (S = 0: Gemm's plan, its fp16 [m, n] in partials) on
// scratch: the autotuner times each candidate followed by it, because the kernel summing S slices costs more as S
// grows (timed alone, 4 slices of the FFN output at 192 rows beat 3, and the forward was slower with them;
// commit f4a7cfd).
constexpr int kMaxKSplits = 4;
constexpr int64_t kKSplitMaxTokens = 256;
int GemmKSplit(GemmContext* context, const __half* x, const __half* w, float* partials, int64_t m, int64_t n,
               int64_t k, void* gemm_workspace, void* stream, const std::function<void(int parts)>& consumer);

// One line per fp16 shape planned so far, Gemm's, GemmBiasGelu's, then GemmKSplit's: "m x n x k [+ epilogue]: <how
// it runs>", for benchmarks to report.
std::string DescribeGemmPlans(GemmContext* context);

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_H_
