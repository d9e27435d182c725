// GemmContext: the cuBLASLt handle plus one cached plan (descriptors + chosen algorithm) per GEMM shape.
// Every GEMM of the encoder is row-major Y[m, n] = X[m, k] @ W[k, n] (+ bias[n], + GELU) with TF's [in, out]
// kernels, fp16 or fp32 storage, fp32 accumulation. Plans are host-side objects: once a shape has been seen,
// a call never touches the device beyond the matmul itself, so a CUDA graph captured after the first call
// replays the planned algorithm.
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_H_
#define BERTSERVE_KERNELS_CUDA_GEMM_H_

#include <cstdint>

namespace bertserve {
namespace cuda {

struct GemmContext;

struct GemmOptions {
  // Time cuBLASLt's best few candidates on the real operands when a shape is first planned and keep the fastest.
  // That first call waits for the device (never while the stream is being captured), so it suits callers that
  // plan shapes ahead (the harness's graph buckets), not a serving op that sees a new token count per batch.
  bool autotune = false;
  // Fuse GELU into the FFN GEMM's epilogue. cuBLASLt's GELU is the tanh approximation, not BERT's erf form;
  // off by default (the op contract says erf); the harness measures its speed and error.
  bool gelu_tanh_epilogue = false;
};

enum class Epilogue { kNone, kBias, kBiasGeluTanh };

// Bytes of device scratch one cuBLASLt call may use (the caller's workspace reserves this much).
constexpr int64_t kGemmWorkspaceBytes = 32ll << 20;

// Throws std::runtime_error if cuBLASLt cannot be initialised on the current device.
GemmContext* CreateGemmContext(const GemmOptions& options = GemmOptions());
void DestroyGemmContext(GemmContext* context);
const GemmOptions& OptionsOf(const GemmContext* context);

// Y = X @ W with the epilogue, all device pointers, enqueued on stream. (TIn, TOut) is (__half, __half),
// (float, float) or (__half, float); bias is TIn and ignored for Epilogue::kNone. gemm_workspace holds
// kGemmWorkspaceBytes. Throws std::runtime_error naming the shape when cuBLASLt fails.
template <typename TIn, typename TOut>
void Gemm(GemmContext* context, const TIn* x, const TIn* w, const TIn* bias, TOut* y, int64_t m, int64_t n,
          int64_t k, Epilogue epilogue, void* gemm_workspace, void* stream);

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_H_
