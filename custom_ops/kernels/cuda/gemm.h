// GemmContext: the cuBLASLt handle plus one cached plan (descriptors + heuristic algorithm) per GEMM shape.
// Every GEMM of the encoder is row-major Y[m, n] = X[m, k] @ W[k, n] + bias[n] (TF's [in, out] kernels),
// fp16 or fp32 storage, fp32 accumulation. Plans are host-side objects, so looking one up never touches the
// device; a CUDA graph captured after the first call replays the same algorithm.
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_H_
#define BERTSERVE_KERNELS_CUDA_GEMM_H_

#include <cstdint>

namespace bertserve {
namespace cuda {

struct GemmContext;

// Bytes of device scratch one cuBLASLt call may use (the caller's workspace reserves this much).
constexpr int64_t kGemmWorkspaceBytes = 32ll << 20;

// Throws std::runtime_error if cuBLASLt cannot be initialised on the current device.
GemmContext* CreateGemmContext();
void DestroyGemmContext(GemmContext* context);

// Y = X @ W (+ bias when non-null), all device pointers, enqueued on stream. T is float or __half.
// gemm_workspace holds kGemmWorkspaceBytes. Throws std::runtime_error naming the shape when cuBLASLt fails.
template <typename T>
void GemmBias(GemmContext* context, const T* x, const T* w, const T* bias, T* y, int64_t m, int64_t n, int64_t k,
              void* gemm_workspace, void* stream);

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_H_
