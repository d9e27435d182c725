// Attention over packed rows. Two kernels:
//  - FusedShortAttentionKernel (fp16, head size 32 or 64, rows <= 128 tokens): one block per (head, row) loads
//    that head's Q, K, V into shared memory once, then each warp takes 16 query rows: QK^T on Tensor Cores (wmma,
//    fp32 accumulation), masked softmax in fp32 registers, PV on Tensor Cores, and writes the context. Scores
//    never leave shared memory and padded keys are masked, so the kernel's cost follows the real lengths.
//  - StreamingAttentionKernel (any head size <= 128, any length, float or half): one warp per query row with an
//    online softmax over keys; the fallback for float and long rows.
#include <mma.h>

#include <algorithm>
#include <string>

#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 16;
constexpr int kMaxFusedSeqlen = 128;
constexpr int kMaxFusedWarps = 4;
constexpr float kLog2e = 1.4426950408889634f;

// Shared-memory layout of the fused kernel for rows up to `max_len` (multiple of 16) and head size D.
struct FusedLayout {
  int max_len, warps, ld_qkv, ld_scores, ld_probs;
  __host__ __device__ FusedLayout(int max_seqlen, int head_size)
      : max_len((max_seqlen + kTile - 1) / kTile * kTile),
        warps(min(kMaxFusedWarps, (max_seqlen + kTile - 1) / kTile)),
        ld_qkv(head_size + 8),  // +8 halves (16 bytes) per row against bank conflicts; wmma needs ld % 8 == 0
        ld_scores(max(max_len, head_size) + 4),
        ld_probs(max_len + 8) {}
  __host__ __device__ size_t qkv_bytes() const { return 3ull * max_len * ld_qkv * sizeof(__half); }
  __host__ __device__ size_t scores_bytes() const { return size_t{kTile} * ld_scores * sizeof(float); }
  __host__ __device__ size_t probs_bytes() const { return size_t{kTile} * ld_probs * sizeof(__half); }
  __host__ __device__ size_t bytes() const { return qkv_bytes() + warps * (scores_bytes() + probs_bytes()); }
};

template <int D>
__global__ void __launch_bounds__(kMaxFusedWarps * 32)
    FusedShortAttentionKernel(const __half* __restrict__ qkv, const int32_t* __restrict__ cu_seqlens, int max_seqlen,
                              int hidden, float scale_log2, __half* __restrict__ context) {
  const int row = blockIdx.x, head = blockIdx.y;
  const int begin = cu_seqlens[row];
  const int len = cu_seqlens[row + 1] - begin;
  if (len == 0) return;
  const FusedLayout layout(max_seqlen, D);
  const int padded_len = (len + kTile - 1) / kTile * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  extern __shared__ __align__(16) unsigned char smem[];
  __half* q_s = reinterpret_cast<__half*>(smem);
  __half* k_s = q_s + layout.max_len * layout.ld_qkv;
  __half* v_s = k_s + layout.max_len * layout.ld_qkv;
  unsigned char* warp_smem = smem + layout.qkv_bytes() + warp * (layout.scores_bytes() + layout.probs_bytes());
  float* scores = reinterpret_cast<float*>(warp_smem);
  __half* probs = reinterpret_cast<__half*>(warp_smem + layout.scores_bytes());

  // Q, K, V of this head: 16-byte loads, rows past the real length zeroed (they feed masked tiles only).
  constexpr int kVecsPerRow = D / 8;
  const int64_t row_stride = 3ll * hidden;
  for (int i = threadIdx.x; i < padded_len * kVecsPerRow; i += blockDim.x) {
    const int r = i / kVecsPerRow, c = (i % kVecsPerRow) * 8;
    uint4 q = make_uint4(0, 0, 0, 0), k = q, v = q;
    if (r < len) {
      const __half* src = qkv + (begin + r) * row_stride + head * D + c;
      q = *reinterpret_cast<const uint4*>(src);
      k = *reinterpret_cast<const uint4*>(src + hidden);
      v = *reinterpret_cast<const uint4*>(src + 2 * hidden);
    }
    *reinterpret_cast<uint4*>(q_s + r * layout.ld_qkv + c) = q;
    *reinterpret_cast<uint4*>(k_s + r * layout.ld_qkv + c) = k;
    *reinterpret_cast<uint4*>(v_s + r * layout.ld_qkv + c) = v;
  }
  __syncthreads();

  constexpr int kMaxKeysPerLane = kMaxFusedSeqlen / 32;
  for (int qt = warp; qt < padded_len / kTile; qt += layout.warps) {
    // scores[16, padded_len] = Q_tile K^T
    for (int kt = 0; kt < padded_len / kTile; ++kt) {
      wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += kTile) {
        wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, __half, wmma::col_major> b;
        wmma::load_matrix_sync(a, q_s + qt * kTile * layout.ld_qkv + d0, layout.ld_qkv);
        wmma::load_matrix_sync(b, k_s + kt * kTile * layout.ld_qkv + d0, layout.ld_qkv);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(scores + kt * kTile, acc, layout.ld_scores, wmma::mem_row_major);
    }
    __syncwarp();
    // Softmax of each of the 16 rows over the real keys, fp32; probabilities stored as fp16 for PV.
    for (int r = 0; r < kTile; ++r) {
      float s[kMaxKeysPerLane];
      float row_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kMaxKeysPerLane; ++i) {
        const int j = lane + 32 * i;
        s[i] = j < len ? scores[r * layout.ld_scores + j] * scale_log2 : -INFINITY;
        row_max = fmaxf(row_max, s[i]);
      }
      row_max = WarpMax(row_max);
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < kMaxKeysPerLane; ++i) {
        s[i] = exp2f(s[i] - row_max);  // exp2(-inf) = 0 for masked keys; row_max is finite (len >= 1)
        sum += s[i];
      }
      const float inv_sum = 1.f / WarpSum(sum);
#pragma unroll
      for (int i = 0; i < kMaxKeysPerLane; ++i) {
        const int j = lane + 32 * i;
        if (j < padded_len) probs[r * layout.ld_probs + j] = __float2half_rn(s[i] * inv_sum);
      }
    }
    __syncwarp();
    // context tile [16, D] = P V, staged through the (now free) scores buffer.
#pragma unroll
    for (int dt = 0; dt < D / kTile; ++dt) {
      wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kt = 0; kt < padded_len / kTile; ++kt) {
        wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, __half, wmma::row_major> b;
        wmma::load_matrix_sync(a, probs + kt * kTile, layout.ld_probs);
        wmma::load_matrix_sync(b, v_s + kt * kTile * layout.ld_qkv + dt * kTile, layout.ld_qkv);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(scores + dt * kTile, acc, layout.ld_scores, wmma::mem_row_major);
    }
    __syncwarp();
    constexpr int kPairsPerRow = D / 2;
    for (int i = lane; i < kTile * kPairsPerRow; i += 32) {
      const int r = i / kPairsPerRow, c = (i % kPairsPerRow) * 2;
      const int token = qt * kTile + r;
      if (token < len) {
        const float* src = scores + r * layout.ld_scores + c;
        *reinterpret_cast<__half2*>(context + static_cast<int64_t>(begin + token) * hidden + head * D + c) =
            __floats2half2_rn(src[0], src[1]);
      }
    }
    __syncwarp();
  }
}

constexpr int kStreamingWarps = 4;
constexpr int kMaxStreamingDimsPerLane = 4;  // head size <= 128

// One warp per (query token, head): each lane owns dims lane, lane+32, ...; keys are visited once with a running
// max and sum (online softmax), so any length works with registers only.
template <typename T>
__global__ void __launch_bounds__(kStreamingWarps * 32)
    StreamingAttentionKernel(const T* __restrict__ qkv, const int32_t* __restrict__ cu_seqlens, int hidden,
                             int head_size, float scale_log2, T* __restrict__ context) {
  const int row = blockIdx.x, head = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int begin = cu_seqlens[row];
  const int len = cu_seqlens[row + 1] - begin;
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
  T* out = context + static_cast<int64_t>(begin + query) * hidden + head * head_size;
  const float inv_sum = 1.f / running_sum;
#pragma unroll
  for (int i = 0; i < kMaxStreamingDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_size) out[d] = FromFloat<T>(acc[i] * inv_sum);
  }
}

template <int D>
void LaunchFused(const __half* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t max_seqlen, int64_t num_heads,
                 float scale_log2, __half* context, cudaStream_t stream) {
  const FusedLayout layout(static_cast<int>(max_seqlen), D);
  const size_t smem = layout.bytes();
  if (smem > 48 * 1024) {
    ThrowIfFailed(cudaFuncSetAttribute(FusedShortAttentionKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)),
                  "FusedShortAttentionKernel shared memory");
  }
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(num_heads));
  FusedShortAttentionKernel<D><<<grid, layout.warps * 32, smem, stream>>>(
      qkv, cu_seqlens, static_cast<int>(max_seqlen), static_cast<int>(num_heads * D), scale_log2, context);
  CheckLaunch("FusedShortAttentionKernel");
}

template <typename T>
void LaunchStreaming(const T* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t max_seqlen, int64_t num_heads,
                     int64_t head_size, float scale_log2, T* context, cudaStream_t stream) {
  if (head_size > 32 * kMaxStreamingDimsPerLane) {
    throw std::runtime_error("the CUDA attention supports head sizes up to " +
                             std::to_string(32 * kMaxStreamingDimsPerLane) + ", got " + std::to_string(head_size));
  }
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(num_heads),
                  static_cast<unsigned>(CeilDiv(max_seqlen, kStreamingWarps)));
  StreamingAttentionKernel<T><<<grid, kStreamingWarps * 32, 0, stream>>>(
      qkv, cu_seqlens, static_cast<int>(num_heads * head_size), static_cast<int>(head_size), scale_log2, context);
  CheckLaunch("StreamingAttentionKernel");
}

}  // namespace

template <>
void LaunchAttention<__half>(const __half* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t max_seqlen,
                             int64_t num_heads, int64_t head_size, __half* context, cudaStream_t stream) {
  if (batch == 0 || max_seqlen == 0) return;
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(head_size));
  if (max_seqlen <= kMaxFusedSeqlen && head_size == 64) {
    return LaunchFused<64>(qkv, cu_seqlens, batch, max_seqlen, num_heads, scale_log2, context, stream);
  }
  if (max_seqlen <= kMaxFusedSeqlen && head_size == 32) {
    return LaunchFused<32>(qkv, cu_seqlens, batch, max_seqlen, num_heads, scale_log2, context, stream);
  }
  LaunchStreaming<__half>(qkv, cu_seqlens, batch, max_seqlen, num_heads, head_size, scale_log2, context, stream);
}

template <>
void LaunchAttention<float>(const float* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t max_seqlen,
                            int64_t num_heads, int64_t head_size, float* context, cudaStream_t stream) {
  if (batch == 0 || max_seqlen == 0) return;
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(head_size));
  LaunchStreaming<float>(qkv, cu_seqlens, batch, max_seqlen, num_heads, head_size, scale_log2, context, stream);
}

}  // namespace cuda
}  // namespace bertserve
