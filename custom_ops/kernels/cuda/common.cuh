// Shared device helpers of the CUDA core: element-type traits (half2/float2 vectors, fp32 compute), warp
// reductions, and the error check every launch goes through. Nothing here synchronises with the host.
#ifndef BERTSERVE_KERNELS_CUDA_COMMON_CUH_
#define BERTSERVE_KERNELS_CUDA_COMMON_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "custom_ops/kernels/bert_core.h"

namespace bertserve {
namespace cuda {

// A failed CUDA call or launch throws: callers (the TF op, the C ABI) turn it into their own error status.
inline void ThrowIfFailed(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

// cudaGetLastError only reads the launch status on the host; it never waits for the device.
inline void CheckLaunch(const char* kernel) { ThrowIfFailed(cudaGetLastError(), kernel); }

inline cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

// The API's storage type -> the CUDA type the kernels compute with (fp16 and __half share a layout).
template <typename T>
struct DeviceType {
  using type = T;
};
template <>
struct DeviceType<fp16> {
  using type = __half;
};
template <typename T>
using DeviceT = typename DeviceType<T>::type;

template <typename T>
inline DeviceT<T>* ToDevice(T* p) {
  return reinterpret_cast<DeviceT<T>*>(p);
}
template <typename T>
inline const DeviceT<T>* ToDevice(const T* p) {
  return reinterpret_cast<const DeviceT<T>*>(p);
}

// Two-element vectors: half2 for __half, float2 for float; loads and stores of pairs, math in fp32.
template <typename T>
struct Vec2;
template <>
struct Vec2<__half> {
  using type = __half2;
  static __device__ __forceinline__ float2 ToFloat2(__half2 v) { return __half22float2(v); }
  static __device__ __forceinline__ __half2 FromFloat2(float2 v) { return __float22half2_rn(v); }
};
template <>
struct Vec2<float> {
  using type = float2;
  static __device__ __forceinline__ float2 ToFloat2(float2 v) { return v; }
  static __device__ __forceinline__ float2 FromFloat2(float2 v) { return v; }
};

__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(float v) { return v; }
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// CUDA's grid limits: launch sizes past them are refused by name before a launch fails (or a cast truncates them).
constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridYZ = 65535;

// The packed row of position p of padded sequence b (whose rows are cu_seqlens[b] .. cu_seqlens[b + 1] - 1), or -1
// where p is padding: how the kernels over a padded batch's positions find their rows, with no search.
__device__ __forceinline__ int PackedRowOf(const int32_t* cu_seqlens, int b, int p) {
  const int begin = cu_seqlens[b];
  return p < cu_seqlens[b + 1] - begin ? begin + p : -1;
}

// Asks L2 for [ptr, ptr + bytes) with bulk prefetches (the issuing thread does not wait for them), the range
// widened to 16-byte boundaries as the instruction requires (never past an allocation: they are 256-byte granular).
__device__ __forceinline__ void PrefetchRangeToL2(const void* ptr, uint64_t bytes) {
  constexpr uint64_t kPiece = 16384;
  const uint64_t begin = reinterpret_cast<uint64_t>(ptr) & ~uint64_t{15};
  const uint64_t end = (reinterpret_cast<uint64_t>(ptr) + bytes + 15) & ~uint64_t{15};
  for (uint64_t at = begin; at < end; at += kPiece) {
    const uint32_t piece = static_cast<uint32_t>(end - at < kPiece ? end - at : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(at), "r"(piece) : "memory");
  }
}

// Buffers carved out of one allocation (a workspace, an arena) start on 256-byte boundaries, as cudaMalloc's do.
inline int64_t AlignedBytes(int64_t bytes) { return CeilDiv(bytes, 256) * 256; }

// Programmatic dependent launch: a kernel launched with LaunchAfterPredecessor may be scheduled while the kernel
// before it on the stream is still draining (its launch overlaps that tail), so it must call JoinLaunchChain
// before it touches memory. That returns once the preceding kernel has completed
// and its writes are visible, then lets the kernel after this one be scheduled in turn (it waits likewise, so it
// never reads what this one has not finished writing). Captured into CUDA graphs as programmatic edges. The
// CUTLASS GEMMs join the same chain (gemm/cutlass_gemm_runners.h); cuBLASLt's kernels break it.
__device__ __forceinline__ void JoinLaunchChain() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// LaunchAfterPredecessor for a grid of clusters of cluster_blocks blocks along x (1: no cluster).
template <typename... KernelArgs, typename... Args>
void LaunchClustersAfterPredecessor(const char* name, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                                    unsigned cluster_blocks, size_t shared_bytes, cudaStream_t stream,
                                    Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim = {cluster_blocks, 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster_blocks > 1 ? 2 : 1;
  ThrowIfFailed(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name);
}

template <typename... KernelArgs, typename... Args>
void LaunchAfterPredecessor(const char* name, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                            size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  LaunchClustersAfterPredecessor(name, kernel, grid, block, 1, shared_bytes, stream, std::forward<Args>(args)...);
}

// A ranker's score from its classifier logits (biases included): sigmoid of the one logit, or with two labels the
// softmax probability of label 1, softmax(l0, l1)[1] = sigmoid(l1 - l0).
__device__ __forceinline__ float RankerScore(float logit0, float logit1, int num_labels) {
  const float z = num_labels == 2 ? logit1 - logit0 : logit0;
  return 1.f / (1.f + expf(-z));
}

// GELU in BERT's erf form, x * Phi(x), with Phi from Abramowitz & Stegun 7.1.26 (|erf error| <= 1.5e-7, below
// fp16 resolution), written as GELU(x) = max(x, 0) - |x| * erfc(|x| / sqrt 2) / 2 with 1/sqrt 2, the 1/2 and
// log2(e) folded into the constants: one reciprocal, one exp2 and eleven other instructions, no branches. In the
// FFN GEMM's epilogue this arithmetic is what the kernel waits on (with GELU replaced by the identity the same
// GEMM ran markedly faster at large batch), so every instruction saved shows there. The reciprocal is
// rcp.approx.ftz itself: its argument is at least 1, and __fdividef without -ftz wraps the same instruction in a
// denormal test and two scalings, four more instructions an element (commit 03dbaa7).
__device__ __forceinline__ float GeluErf(float x) {
  const float a = fabsf(x);
  float t;  // 1 / (1 + p |x| / sqrt 2)
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(fmaf(0.3275911f * 0.70710678118654752f, a, 1.f)));
  const float q = fmaf(fmaf(fmaf(fmaf(0.5f * 1.061405429f, t, 0.5f * -1.453152027f), t, 0.5f * 1.421413741f), t,
                           0.5f * -0.284496736f),
                      t, 0.5f * 0.254829592f);
  float gauss;  // exp(-x^2 / 2) = 2^(x^2 * -log2(e) / 2)
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(gauss) : "f"(a * (a * -0.72134752044448170f)));
  return fmaf(-(a * t) * q, gauss, fmaxf(x, 0.f));
}

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_COMMON_CUH_
