// Attention over packed rows. Two kernels:
//  - FusedShortAttentionKernel (fp16, head size 32 or 64, rows <= 128 tokens): one block per (row, head) stages
//    that head's Q, K, V in shared memory once; each warp then owns 16 query rows and keeps everything else in
//    registers: QK^T with mma.sync m16n8k16 (fp16 in, fp32 accumulate), the masked softmax on the accumulator
//    fragments (a row lives in 4 lanes, so its max and sum take two shuffles), the probabilities re-packed in
//    place as the A operand of PV (no trip through shared memory), PV with mma.sync, and the 1/sum scaling on
//    the way out. Padded keys are masked, so the cost follows the real lengths.
//  - StreamingAttentionKernel (any head size <= 128, any length, float or half): one warp per query row with an
//    online softmax over keys; the fallback for float and long rows.
// Each has a first-query mode (kFirstQuery) for a last layer run for first tokens alone (kernels.h): only the
// query of each row's first token, its context written to row b of a [batch, H] output, and that token's input
// row copied beside it as the residual.
#include <algorithm>
#include <string>
#include <type_traits>

#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

constexpr int kMaxFusedSeqlen = 128;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

__device__ __forceinline__ void LoadMatrixX2(uint32_t (&r)[2], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SharedAddress(p)));
}

__device__ __forceinline__ void LoadMatrixX2Trans(uint32_t (&r)[2], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SharedAddress(p)));
}

// d += a (16x16, row-major) * b (16x8, column-major), fp16 inputs, fp32 accumulators.
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// First-query mode: the head's slice of row `row`'s first input token -> residual row `row`; a row without tokens
// gets zeros there and in its context row. Threads tid, tid + threads, ... of the caller share the copy.
template <typename T>
__device__ __forceinline__ void CopyFirstTokenResidual(const T* hidden_in, int begin, int len, int row, int head,
                                                       int head_size, int hidden, int tid, int threads, T* residual,
                                                       T* context) {
  const T* in = hidden_in + static_cast<int64_t>(begin) * hidden + head * head_size;
  const int64_t out = static_cast<int64_t>(row) * hidden + head * head_size;
  for (int d = tid; d < head_size; d += threads) {
    residual[out + d] = len == 0 ? FromFloat<T>(0.f) : in[d];
    if (len == 0) context[out + d] = FromFloat<T>(0.f);
  }
}

// kMaxKeys (32, 64 or 128) bounds the rows of this launch; the block has kMaxKeys / 16 warps, or one in
// first-query mode (hidden_in and residual are read only there).
template <int D, int kMaxKeys, bool kFirstQuery>
__global__ void __launch_bounds__(kMaxKeys / 16 * 32)
    FusedShortAttentionKernel(const __half* __restrict__ qkv, const int32_t* __restrict__ cu_seqlens, int hidden,
                              float scale_log2, __half* __restrict__ context, const __half* __restrict__ hidden_in,
                              __half* __restrict__ residual) {
  // cu_seqlens is read before the wait, one L2 round trip off the chain's critical path: it is staged before the
  // chain starts, and the QKV GEMM (at least) runs between the staging and this kernel; each kernel in the chain
  // waits before it lets the next launch, so the staging has completed and is visible by the time this one starts.
  const int begin = cu_seqlens[blockIdx.x];
  const int len = cu_seqlens[blockIdx.x + 1] - begin;
  JoinLaunchChain();
  constexpr int kLd = D + 8;  // +16 bytes per row: the 8 rows an ldmatrix reads hit distinct banks
  constexpr int kKeyTiles = kMaxKeys / 8;
  constexpr int kDimTiles = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];  // Q, K, V: [kMaxKeys, kLd] each
  __half* q_s = reinterpret_cast<__half*>(smem);
  __half* k_s = q_s + kMaxKeys * kLd;
  __half* v_s = k_s + kMaxKeys * kLd;

  const int row = blockIdx.x, head = blockIdx.y;
  if constexpr (kFirstQuery) {
    CopyFirstTokenResidual(hidden_in, begin, len, row, head, D, hidden, threadIdx.x, blockDim.x, residual, context);
  }
  if (len == 0) return;
  const int padded_len = (len + 15) & ~15;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  constexpr int kVecsPerRow = D / 8;
  const int64_t row_stride = 3ll * hidden;
  // kChunk 16-byte vectors of Q, K and V per thread are loaded before any is stored, from row min(r, len - 1)
  // (no branch between the loads, so they are in flight together; rows past len are stored as zeros): in a loop
  // that stored each vector before loading the next, every vector cost an L2 round trip (commit b392a21).
  constexpr int kChunk = 4;
  const int vecs = padded_len * kVecsPerRow;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int base = threadIdx.x; base < vecs; base += kChunk * blockDim.x) {
    uint4 q[kChunk], k[kChunk], v[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int i = min(base + j * static_cast<int>(blockDim.x), vecs - 1);
      const int r = min(i / kVecsPerRow, len - 1), c = (i % kVecsPerRow) * 8;
      const __half* src = qkv + (begin + r) * row_stride + head * D + c;
      q[j] = *reinterpret_cast<const uint4*>(src);
      k[j] = *reinterpret_cast<const uint4*>(src + hidden);
      v[j] = *reinterpret_cast<const uint4*>(src + 2 * hidden);
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int i = base + j * blockDim.x;
      if (i < vecs) {
        const int r = i / kVecsPerRow, c = (i % kVecsPerRow) * 8;
        const bool real = r < len;
        // First-query mode: one m16 tile of queries.
        *reinterpret_cast<uint4*>(q_s + r * kLd + c) = real && (!kFirstQuery || r < 16) ? q[j] : zero;
        *reinterpret_cast<uint4*>(k_s + r * kLd + c) = real ? k[j] : zero;
        *reinterpret_cast<uint4*>(v_s + r * kLd + c) = real ? v[j] : zero;
      }
    }
  }
  __syncthreads();
  const int q0 = warp * 16;
  if (q0 >= padded_len) return;
  const int key_tiles = padded_len / 8;

  // S = Q K^T for this warp's 16 query rows: s[nt] is the 16x8 tile of keys nt*8 .. nt*8+7.
  float s[kKeyTiles][4];
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t a[4];
    LoadMatrixX4(a, q_s + (q0 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + kc * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
      if (nt < key_tiles) {
        uint32_t b[2];
        LoadMatrixX2(b, k_s + (nt * 8 + (lane & 7)) * kLd + kc * 16 + ((lane >> 3) & 1) * 8);
        Mma16816(s[nt], a, b);
      }
    }
  }

  // Softmax over real keys. Lane holds rows g = lane/4 (s[.][0..1]) and g+8 (s[.][2..3]), keys nt*8 + 2*(lane%4).
  const int key_in_tile = 2 * (lane & 3);
  float max_lo = -INFINITY, max_hi = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = nt * 8 + key_in_tile + (e & 1);
      s[nt][e] = (nt < key_tiles && key < len) ? s[nt][e] * scale_log2 : -INFINITY;
    }
    max_lo = fmaxf(max_lo, fmaxf(s[nt][0], s[nt][1]));
    max_hi = fmaxf(max_hi, fmaxf(s[nt][2], s[nt][3]));
  }
#pragma unroll
  for (int offset = 1; offset <= 2; offset <<= 1) {
    max_lo = fmaxf(max_lo, __shfl_xor_sync(0xffffffffu, max_lo, offset));
    max_hi = fmaxf(max_hi, __shfl_xor_sync(0xffffffffu, max_hi, offset));
  }
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt) {
    s[nt][0] = exp2f(s[nt][0] - max_lo);  // masked keys: exp2(-inf) = 0; each row has a real key, so max is finite
    s[nt][1] = exp2f(s[nt][1] - max_lo);
    s[nt][2] = exp2f(s[nt][2] - max_hi);
    s[nt][3] = exp2f(s[nt][3] - max_hi);
    sum_lo += s[nt][0] + s[nt][1];
    sum_hi += s[nt][2] + s[nt][3];
  }
#pragma unroll
  for (int offset = 1; offset <= 2; offset <<= 1) {
    sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, offset);
    sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, offset);
  }

  // O = P V: the accumulators of key tiles 2j and 2j+1 are exactly the A fragment of key chunk j (16 keys).
  float o[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
#pragma unroll
  for (int j = 0; j < kKeyTiles / 2; ++j) {
    if (2 * j < key_tiles) {
      const uint32_t a[4] = {PackHalf2(s[2 * j][0], s[2 * j][1]), PackHalf2(s[2 * j][2], s[2 * j][3]),
                             PackHalf2(s[2 * j + 1][0], s[2 * j + 1][1]), PackHalf2(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        uint32_t b[2];
        LoadMatrixX2Trans(b, v_s + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + dt * 8);
        Mma16816(o[dt], a, b);
      }
    }
  }

  const float inv_lo = 1.f / sum_lo, inv_hi = 1.f / sum_hi;
  const int row_lo = q0 + (lane >> 2), row_hi = row_lo + 8;
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) {
    const int col = head * D + dt * 8 + key_in_tile;
    if constexpr (kFirstQuery) {
      if (row_lo == 0) {
        *reinterpret_cast<__half2*>(context + static_cast<int64_t>(row) * hidden + col) =
            __floats2half2_rn(o[dt][0] * inv_lo, o[dt][1] * inv_lo);
      }
      continue;
    }
    if (row_lo < len) {
      *reinterpret_cast<__half2*>(context + static_cast<int64_t>(begin + row_lo) * hidden + col) =
          __floats2half2_rn(o[dt][0] * inv_lo, o[dt][1] * inv_lo);
    }
    if (row_hi < len) {
      *reinterpret_cast<__half2*>(context + static_cast<int64_t>(begin + row_hi) * hidden + col) =
          __floats2half2_rn(o[dt][2] * inv_hi, o[dt][3] * inv_hi);
    }
  }
}

constexpr int kStreamingWarps = 4;
constexpr int kMaxStreamingDimsPerLane = 4;  // head size <= 128

// One warp per (query token, head): each lane owns dims lane, lane+32, ...; keys are visited once with a running
// max and sum (online softmax), so any length works with registers only. First-query mode: one warp per (row,
// head) for query 0.
template <typename T, bool kFirstQuery>
__global__ void __launch_bounds__(kStreamingWarps * 32)
    StreamingAttentionKernel(const T* __restrict__ qkv, const int32_t* __restrict__ cu_seqlens, int hidden,
                             int head_size, float scale_log2, T* __restrict__ context, const T* __restrict__ hidden_in,
                             T* __restrict__ residual) {
  JoinLaunchChain();
  const int row = blockIdx.x, head = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int begin = cu_seqlens[row];
  const int len = cu_seqlens[row + 1] - begin;
  if constexpr (kFirstQuery) {
    CopyFirstTokenResidual(hidden_in, begin, len, row, head, head_size, hidden, lane, 32, residual, context);
  }
  const int query = blockIdx.z * kStreamingWarps + (threadIdx.x >> 5);
  if (query >= len) return;
  const int64_t row_stride = 3ll * hidden;
  const T* q_ptr = qkv + (begin + query) * row_stride + head * head_size;
  float q[kMaxStreamingDimsPerLane], acc[kMaxStreamingDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxStreamingDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < head_size ? ToFloat(q_ptr[d]) * scale_log2 : 0.f;
    acc[i] = 0.f;
  }
  float running_max = -INFINITY, running_sum = 0.f;
  for (int key = 0; key < len; ++key) {
    const T* k_ptr = qkv + (begin + key) * row_stride + hidden + head * head_size;
    float partial = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxStreamingDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_size) partial += q[i] * ToFloat(k_ptr[d]);
    }
    const float s = WarpSum(partial);
    const float new_max = fmaxf(running_max, s);
    const float correction = exp2f(running_max - new_max);
    const float p = exp2f(s - new_max);
    running_sum = running_sum * correction + p;
    const T* v_ptr = k_ptr + hidden;
#pragma unroll
    for (int i = 0; i < kMaxStreamingDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_size) acc[i] = acc[i] * correction + p * ToFloat(v_ptr[d]);
    }
    running_max = new_max;
  }
  T* out = context + static_cast<int64_t>(kFirstQuery ? row : begin + query) * hidden + head * head_size;
  const float inv_sum = 1.f / running_sum;
#pragma unroll
  for (int i = 0; i < kMaxStreamingDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_size) out[d] = FromFloat<T>(acc[i] * inv_sum);
  }
}

// hidden_in and residual: first-query mode only (null otherwise).
template <int D, int kMaxKeys, bool kFirstQuery>
void LaunchFusedFor(const __half* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t num_heads, float scale_log2,
                    __half* context, const __half* hidden_in, __half* residual, cudaStream_t stream) {
  constexpr int kSmem = 3 * kMaxKeys * (D + 8) * sizeof(__half);
  const auto kernel = FusedShortAttentionKernel<D, kMaxKeys, kFirstQuery>;
  if (kSmem > 48 * 1024) {
    ThrowIfFailed(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                  "FusedShortAttentionKernel shared memory");
  }
  if (batch > kMaxGridX || num_heads > kMaxGridYZ) {
    throw std::runtime_error("the CUDA attention's grid cannot hold " + std::to_string(batch) + " rows x " +
                             std::to_string(num_heads) + " heads");
  }
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(num_heads));
  LaunchAfterPredecessor("FusedShortAttentionKernel", kernel, grid, kFirstQuery ? 32 : kMaxKeys / 16 * 32, kSmem,
                         stream, qkv, cu_seqlens, static_cast<int>(num_heads * D), scale_log2, context, hidden_in,
                         residual);
}

template <int D, bool kFirstQuery>
void LaunchFused(const __half* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t max_seqlen, int64_t num_heads,
                 float scale_log2, __half* context, const __half* hidden_in, __half* residual, cudaStream_t stream) {
  if (max_seqlen <= 32) {
    return LaunchFusedFor<D, 32, kFirstQuery>(qkv, cu_seqlens, batch, num_heads, scale_log2, context, hidden_in,
                                              residual, stream);
  }
  if (max_seqlen <= 64) {
    return LaunchFusedFor<D, 64, kFirstQuery>(qkv, cu_seqlens, batch, num_heads, scale_log2, context, hidden_in,
                                              residual, stream);
  }
  LaunchFusedFor<D, 128, kFirstQuery>(qkv, cu_seqlens, batch, num_heads, scale_log2, context, hidden_in, residual,
                                      stream);
}

template <typename T, bool kFirstQuery>
void LaunchStreaming(const T* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t max_seqlen, int64_t num_heads,
                     int64_t head_size, float scale_log2, T* context, const T* hidden_in, T* residual,
                     cudaStream_t stream) {
  if (head_size > 32 * kMaxStreamingDimsPerLane) {
    throw std::runtime_error("the CUDA attention supports head sizes up to " +
                             std::to_string(32 * kMaxStreamingDimsPerLane) + ", got " + std::to_string(head_size));
  }
  const int64_t query_blocks = kFirstQuery ? 1 : CeilDiv(max_seqlen, kStreamingWarps);
  if (batch > kMaxGridX || num_heads > kMaxGridYZ || query_blocks > kMaxGridYZ) {
    throw std::runtime_error("the CUDA attention's grid cannot hold " + std::to_string(batch) + " rows of up to " +
                             std::to_string(max_seqlen) + " tokens x " + std::to_string(num_heads) + " heads");
  }
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(num_heads), static_cast<unsigned>(query_blocks));
  LaunchAfterPredecessor("StreamingAttentionKernel", StreamingAttentionKernel<T, kFirstQuery>, grid,
                         kFirstQuery ? 32 : kStreamingWarps * 32, 0, stream, qkv, cu_seqlens,
                         static_cast<int>(num_heads * head_size), static_cast<int>(head_size), scale_log2, context,
                         hidden_in, residual);
}

// The fused kernel for fp16 rows <= 128 tokens with head size 32 or 64, else the streaming kernel.
template <bool kFirstQuery, typename T>
void Dispatch(const T* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t max_seqlen, int64_t num_heads,
              int64_t head_size, T* context, const T* hidden_in, T* residual, cudaStream_t stream) {
  if (batch == 0 || (!kFirstQuery && max_seqlen == 0)) return;  // first-query mode still zeroes empty rows
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(head_size));
  if constexpr (std::is_same_v<T, __half>) {
    if (max_seqlen <= kMaxFusedSeqlen && head_size == 64) {
      return LaunchFused<64, kFirstQuery>(qkv, cu_seqlens, batch, max_seqlen, num_heads, scale_log2, context,
                                          hidden_in, residual, stream);
    }
    if (max_seqlen <= kMaxFusedSeqlen && head_size == 32) {
      return LaunchFused<32, kFirstQuery>(qkv, cu_seqlens, batch, max_seqlen, num_heads, scale_log2, context,
                                          hidden_in, residual, stream);
    }
  }
  LaunchStreaming<T, kFirstQuery>(qkv, cu_seqlens, batch, max_seqlen, num_heads, head_size, scale_log2, context,
                                  hidden_in, residual, stream);
}

}  // namespace

template <typename T>
void LaunchAttention(const T* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t max_seqlen, int64_t num_heads,
                     int64_t head_size, T* context, cudaStream_t stream) {
  Dispatch<false, T>(qkv, cu_seqlens, batch, max_seqlen, num_heads, head_size, context, nullptr, nullptr, stream);
}

template <typename T>
void LaunchFirstTokenAttention(const T* qkv, const T* hidden_in, const int32_t* cu_seqlens, int64_t batch,
                               int64_t max_seqlen, int64_t num_heads, int64_t head_size, T* context, T* residual,
                               cudaStream_t stream) {
  Dispatch<true, T>(qkv, cu_seqlens, batch, max_seqlen, num_heads, head_size, context, hidden_in, residual, stream);
}

#define BERTSERVE_INSTANTIATE_ATTENTION(T)                                                                         \
  template void LaunchAttention<T>(const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, T*, cudaStream_t); \
  template void LaunchFirstTokenAttention<T>(const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                             T*, T*, cudaStream_t);

BERTSERVE_INSTANTIATE_ATTENTION(__half)
BERTSERVE_INSTANTIATE_ATTENTION(float)

}  // namespace cuda
}  // namespace bertserve
