// The first-token layer past its attention, for a few rows, as one cooperative launch (LaunchFirstTokenTail in
// kernels.h). At batch 1 that part of the last layer was five dependent steps (attention-output GEMM, LayerNorm,
// FFN GEMM + GELU, FFN-output GEMM, LayerNorm: ~12.5 us of step 48's timeline), each a kernel boundary plus a GEMM's
// launch-to-end latency for one row, around weights (10.6 MB on the chit-chat shape) that DRAM streams in ~3 us.
//
// kBlocks blocks, all resident at once, launched early in the launch chain. Before the chain's wait each block
// copies into shared memory its column groups' weight slices (a group: 8 output columns, 16 bytes of each weight
// row; group g of a GEMM belongs to block g mod kBlocks) and the layer's vectors. After it, three grid barriers
// separate four phases; the LayerNorms' statistics are whole-row sums, which every block computes for itself:
//   1. attention-output columns + bias + residual -> fp32 sums (global scratch);
//   2. LayerNorm of those rows (kept in shared memory), FFN columns + bias + GELU -> fp16 (global scratch);
//   3. FFN-output columns + bias + the first LayerNorm's output -> fp32 sums;
//   4. LayerNorm of those rows, each block writing its own columns (zeros for rows without tokens).
// Activations that other blocks wrote are read through L2 (ld.global.cg), never a stale L1 line.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/kernels.h"
#include "custom_ops/kernels/cuda/step_trace.cuh"

namespace bertserve {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kBlocks = 128;  // co-resident on the H100's and H200's 132 SMs; fewer SMs: not supported
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Where a block's shared memory holds what, for `rows` rows (a kernel's kRows) of a hidden x intermediate layer.
struct TailLayout {
  int ao_groups, ffn_groups, out_groups;  // column groups a block owns, per GEMM
  int w_ao, w_ffn, w_out, vectors, act, gelu, red, bytes;  // byte offsets, and the total

  __host__ __device__ TailLayout(int rows, int hidden, int intermediate) {
    const auto per_block = [](int columns) { return (columns / kWarpColumns + kBlocks - 1) / kBlocks; };
    ao_groups = per_block(hidden);
    ffn_groups = per_block(intermediate);
    out_groups = per_block(hidden);
    const int max_groups = ffn_groups > ao_groups ? ffn_groups : ao_groups;
    int at = 0;
    const auto take = [&at](int size) {
      const int offset = at;
      at += (size + 15) / 16 * 16;
      return offset;
    };
    w_ao = take(ao_groups * hidden * 16);
    w_ffn = take(ffn_groups * hidden * 16);
    w_out = take(out_groups * intermediate * 16);
    vectors = take((6 * hidden + intermediate) * 2);
    act = take(rows * hidden * 4);
    gelu = take(rows * intermediate * 2);
    red = take(max_groups * kWarps * rows * kWarpColumns * 4);
    bytes = at;
  }
};

// The layer's vectors in shared memory, in this order.
struct TailVectors {
  const __half *ao_bias, *ln1_gamma, *ln1_beta, *ffn_bias, *out_bias, *ln2_gamma, *ln2_beta;

  __device__ TailVectors(const __half* v, int hidden, int intermediate)
      : ao_bias(v),
        ln1_gamma(v + hidden),
        ln1_beta(v + 2 * hidden),
        ffn_bias(v + 3 * hidden),
        out_bias(v + 3 * hidden + intermediate),
        ln2_gamma(v + 4 * hidden + intermediate),
        ln2_beta(v + 5 * hidden + intermediate) {}
};

struct TailArgs {
  AfterAttentionWeights w;
  const __half* context;  // [rows, hidden], the attention's output
  __half* x;              // [rows, hidden]: the residual in, the layer's output out
  const int32_t* cu_seqlens;
  float* sums;  // [rows, hidden] scratch
  __half* ffn;  // [rows, intermediate] scratch
  int rows, hidden, intermediate;
  float epsilon;
};

__device__ __forceinline__ void CopyAsync16(void* shared, const void* global) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(global) : "memory");
}

// The block's column groups of W [k_dim, n] (row-major) into slices [groups][k_dim] of 16 bytes.
__device__ __forceinline__ void CopyWeightSlices(const __half* w, int k_dim, int n, int groups, uint4* slices) {
  for (int j = 0; j < groups; ++j) {
    const int g = static_cast<int>(blockIdx.x) + j * kBlocks;
    if (g >= n / kWarpColumns) break;
    for (int k = threadIdx.x; k < k_dim; k += kThreads) {
      CopyAsync16(slices + j * k_dim + k, w + static_cast<int64_t>(k) * n + g * kWarpColumns);
    }
  }
}

__device__ __forceinline__ void CopyVector(const __half* v, int length, __half* to) {
  for (int c = threadIdx.x; c < length / 8; c += kThreads) CopyAsync16(to + 8 * c, v + 8 * c);
}

// Rows [0, rows) of src [rows, width] (fp16 or, with kFromFloat, fp32; read through L2) into dst [kRows, width]
// (fp32 or fp16 as Dst), rows past `rows` zero.
template <int kRows, typename Src, typename Dst>
__device__ __forceinline__ void StageRows(const Src* src, int rows, int width, Dst* dst) {
  constexpr int kPerChunk = 16 / sizeof(Src);
  for (int c = threadIdx.x; c < kRows * width / kPerChunk; c += kThreads) {
    const int r = c * kPerChunk / width;
    const uint4 chunk = r < rows ? __ldcg(reinterpret_cast<const uint4*>(src) + c) : make_uint4(0, 0, 0, 0);
    const auto* in = reinterpret_cast<const Src*>(&chunk);
#pragma unroll
    for (int i = 0; i < kPerChunk; ++i) {
      if constexpr (sizeof(Dst) == sizeof(Src)) {
        dst[c * kPerChunk + i] = in[i];
      } else {
        dst[c * kPerChunk + i] = ToFloat(in[i]);
      }
    }
  }
}

// Column group j's dot products with the kRows rows of x [kRows, k_dim] (shared memory): thread t takes k = t,
// t + kThreads, ..; each warp's 8 column sums per row go to red [kWarps, kRows, 8].
template <int kRows, typename X>
__device__ __forceinline__ void GroupDots(const uint4* w, const X* x, int k_dim, float* red) {
  float acc[kRows][kWarpColumns] = {};
  for (int k = threadIdx.x; k < k_dim; k += kThreads) {
    const uint4 wk = w[k];
    const auto* pairs = reinterpret_cast<const __half2*>(&wk);
    float2 wf[kWarpColumns / 2];
#pragma unroll
    for (int j = 0; j < kWarpColumns / 2; ++j) wf[j] = __half22float2(pairs[j]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float xr = ToFloat(x[r * k_dim + k]);
#pragma unroll
      for (int j = 0; j < kWarpColumns / 2; ++j) {
        acc[r][2 * j] = fmaf(xr, wf[j].x, acc[r][2 * j]);
        acc[r][2 * j + 1] = fmaf(xr, wf[j].y, acc[r][2 * j + 1]);
      }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float sum = WarpSumOfColumns(acc[r]);
    if ((lane & 3) == 0) red[(warp * kRows + r) * kWarpColumns + (lane >> 2)] = sum;
  }
}

// The dot products of the block's column groups of one GEMM over x: calls out(row, column, sum) for each real row
// and column, from threads 0 .. groups * kRows * 8 - 1.
template <int kRows, typename X, typename Out>
__device__ __forceinline__ void BlockColumns(const uint4* slices, int groups, int k_dim, int n, const X* x, int rows,
                                             float* red, Out out) {
  for (int j = 0; j < groups; ++j) {
    if (static_cast<int>(blockIdx.x) + j * kBlocks >= n / kWarpColumns) break;
    GroupDots<kRows>(slices + j * k_dim, x, k_dim, red + j * kWarps * kRows * kWarpColumns);
  }
  __syncthreads();
  const int i = threadIdx.x;
  const int j = i / (kRows * kWarpColumns), r = i / kWarpColumns % kRows, c = i % kWarpColumns;
  const int g = static_cast<int>(blockIdx.x) + j * kBlocks;
  if (j >= groups || r >= rows || g >= n / kWarpColumns) return;
  const float* part = red + j * kWarps * kRows * kWarpColumns + r * kWarpColumns + c;
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += part[w * kRows * kWarpColumns];
  out(r, g * kWarpColumns + c, sum);
}

// Each row's mean and 1 / sqrt(variance + epsilon) over v [kRows, width] in shared memory (two passes).
template <int kRows>
__device__ __forceinline__ void RowStatistics(const float* v, int width, float epsilon, float (&mean)[kRows],
                                              float (&rstd)[kRows]) {
  __shared__ float partial[kWarps][kRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float s[kRows] = {};
  for (int k = threadIdx.x; k < width; k += kThreads) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] += v[r * width + k];
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    s[r] = WarpSum(s[r]);
    if (lane == 0) partial[warp][r] = s[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += partial[w][r];
    mean[r] = total / width;
    s[r] = 0.f;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < width; k += kThreads) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float d = v[r * width + k] - mean[r];
      s[r] = fmaf(d, d, s[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    s[r] = WarpSum(s[r]);
    if (lane == 0) partial[warp][r] = s[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += partial[w][r];
    rstd[r] = rsqrtf(total / width + epsilon);
  }
  __syncthreads();  // partial is rewritten by the next call
}

template <int kRows>
__global__ void __launch_bounds__(kThreads) FirstTokenTailKernel(TailArgs a) {
  extern __shared__ __align__(16) unsigned char shared[];
  const int h = a.hidden, inter = a.intermediate;
  const TailLayout layout(kRows, h, inter);
  auto* w_ao = reinterpret_cast<uint4*>(shared + layout.w_ao);
  auto* w_ffn = reinterpret_cast<uint4*>(shared + layout.w_ffn);
  auto* w_out = reinterpret_cast<uint4*>(shared + layout.w_out);
  auto* vectors = reinterpret_cast<__half*>(shared + layout.vectors);
  auto* act = reinterpret_cast<float*>(shared + layout.act);
  auto* gelu = reinterpret_cast<__half*>(shared + layout.gelu);
  auto* red = reinterpret_cast<float*>(shared + layout.red);

  // Before the wait: weights and vectors, which do not depend on the kernels before.
  CopyWeightSlices(a.w.attention_output_kernel, h, h, layout.ao_groups, w_ao);
  CopyWeightSlices(a.w.intermediate_kernel, h, inter, layout.ffn_groups, w_ffn);
  CopyWeightSlices(a.w.output_kernel, inter, h, layout.out_groups, w_out);
  CopyVector(a.w.attention_output_bias, h, vectors);
  CopyVector(a.w.attention_ln_gamma, h, vectors + h);
  CopyVector(a.w.attention_ln_beta, h, vectors + 2 * h);
  CopyVector(a.w.intermediate_bias, inter, vectors + 3 * h);
  CopyVector(a.w.output_bias, h, vectors + 3 * h + inter);
  CopyVector(a.w.output_ln_gamma, h, vectors + 4 * h + inter);
  CopyVector(a.w.output_ln_beta, h, vectors + 5 * h + inter);
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  BERTSERVE_JOIN_LAUNCH_CHAIN(kTraceFirstTokenTail, a.rows, h);
  const cg::grid_group grid = cg::this_grid();
  const TailVectors v(vectors, h, inter);

  // 1. Attention output + bias + residual.
  StageRows<kRows>(a.context, a.rows, h, act);
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  BlockColumns<kRows>(w_ao, layout.ao_groups, h, h, act, a.rows, red, [&](int r, int col, float sum) {
    a.sums[r * h + col] = sum + __half2float(v.ao_bias[col]) + __half2float(a.x[r * h + col]);
  });
  grid.sync();

  // 2. LayerNorm (whole rows, in every block), FFN + bias + GELU.
  StageRows<kRows>(a.sums, a.rows, h, act);
  __syncthreads();
  float mean[kRows], rstd[kRows];
  RowStatistics<kRows>(act, h, a.epsilon, mean, rstd);
  for (int k = threadIdx.x; k < h; k += kThreads) {
    const float gamma = __half2float(v.ln1_gamma[k]), beta = __half2float(v.ln1_beta[k]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) act[r * h + k] = (act[r * h + k] - mean[r]) * rstd[r] * gamma + beta;
  }
  __syncthreads();
  BlockColumns<kRows>(w_ffn, layout.ffn_groups, h, inter, act, a.rows, red, [&](int r, int col, float sum) {
    a.ffn[r * inter + col] = __float2half_rn(GeluErf(sum + __half2float(v.ffn_bias[col])));
  });
  grid.sync();

  // 3. FFN output + bias + the first LayerNorm's output (still in act).
  StageRows<kRows>(a.ffn, a.rows, inter, gelu);
  __syncthreads();
  BlockColumns<kRows>(w_out, layout.out_groups, inter, h, gelu, a.rows, red, [&](int r, int col, float sum) {
    a.sums[r * h + col] = sum + __half2float(v.out_bias[col]) + act[r * h + col];
  });
  grid.sync();

  // 4. LayerNorm; the block writes its own columns (those of its attention-output groups).
  StageRows<kRows>(a.sums, a.rows, h, act);
  __syncthreads();
  RowStatistics<kRows>(act, h, a.epsilon, mean, rstd);
  const int i = threadIdx.x;
  const int j = i / (kRows * kWarpColumns), r = i / kWarpColumns % kRows, c = i % kWarpColumns;
  const int col = (static_cast<int>(blockIdx.x) + j * kBlocks) * kWarpColumns + c;
  if (j >= layout.out_groups || r >= a.rows || col >= h) return;
  const bool has_tokens = a.cu_seqlens[r + 1] > a.cu_seqlens[r];
  float mean_r = mean[0], rstd_r = rstd[0];
#pragma unroll
  for (int q = 1; q < kRows; ++q) {
    if (q == r) mean_r = mean[q], rstd_r = rstd[q];
  }
  const float y = (act[r * h + col] - mean_r) * rstd_r * __half2float(v.ln2_gamma[col]) + __half2float(v.ln2_beta[col]);
  a.x[r * h + col] = __float2half_rn(has_tokens ? y : 0.f);
}

// Whether the kernel for up to kRows rows runs this layer on the current GPU: its groups' sums fit one pass of the
// block's threads, its shared memory one block's, and kBlocks blocks are resident at once. Sets the kernel's
// shared-memory limit as a side effect.
template <int kRows>
bool TailFits(int hidden, int intermediate) {
  const TailLayout layout(kRows, hidden, intermediate);
  const int max_groups = layout.ffn_groups > layout.ao_groups ? layout.ffn_groups : layout.ao_groups;
  if (max_groups * kRows * kWarpColumns > kThreads) return false;
  int device = 0, limit = 0, sms = 0, cooperative = 0, resident = 0;
  const bool queried =
      cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) == cudaSuccess && cooperative &&
      layout.bytes <= limit &&
      cudaFuncSetAttribute(FirstTokenTailKernel<kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, layout.bytes) ==
          cudaSuccess &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, FirstTokenTailKernel<kRows>, kThreads,
                                                    layout.bytes) == cudaSuccess;
  cudaGetLastError();  // a failed query is "not supported", not an error left for the next launch to report
  return queried && resident * sms >= kBlocks;
}

// The kernel's row count for `rows` rows: 1, 2, 4 or 8.
int TailRows(int64_t rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8; }

template <int kRows>
void LaunchTail(const TailArgs& args, cudaStream_t stream) {
  LaunchGroupedAfterPredecessor("FirstTokenTailKernel", FirstTokenTailKernel<kRows>, dim3(kBlocks), dim3(kThreads),
                                BlockGrouping{1, true}, TailLayout(kRows, args.hidden, args.intermediate).bytes,
                                stream, args);
}

}  // namespace

bool FirstTokenTailSupports(int64_t rows, int64_t hidden, int64_t intermediate) {
  if (rows < 1 || rows > kFirstTokenTailMaxRows || hidden % kWarpColumns != 0 || intermediate % kWarpColumns != 0 ||
      hidden > kFirstTokenTailMaxHidden || intermediate > 4 * kFirstTokenTailMaxHidden) {
    return false;
  }
  // Asked once a forward: the device queries are answered once per GPU and shape.
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const int kernel_rows = TailRows(rows);
  const auto key = std::make_tuple(device, kernel_rows, hidden, intermediate);
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int64_t, int64_t>, bool> fits;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = fits.find(key);
  if (found != fits.end()) return found->second;
  const int h = static_cast<int>(hidden), inter = static_cast<int>(intermediate);
  const bool fit = kernel_rows == 1   ? TailFits<1>(h, inter)
                   : kernel_rows == 2 ? TailFits<2>(h, inter)
                   : kernel_rows == 4 ? TailFits<4>(h, inter)
                                      : TailFits<8>(h, inter);
  fits.emplace(key, fit);
  return fit;
}

void LaunchFirstTokenTail(const AfterAttentionWeights& w, const __half* context, int64_t rows, int64_t hidden,
                          int64_t intermediate, float epsilon, const int32_t* cu_seqlens, float* sums, __half* ffn,
                          __half* x, cudaStream_t stream) {
  if (!FirstTokenTailSupports(rows, hidden, intermediate)) {
    throw std::runtime_error("LaunchFirstTokenTail: " + std::to_string(rows) + " rows, hidden " +
                             std::to_string(hidden) + ", intermediate " + std::to_string(intermediate) +
                             " not supported on this GPU");
  }
  const TailArgs args{w,   context, x, cu_seqlens, sums, ffn, static_cast<int>(rows), static_cast<int>(hidden),
                      static_cast<int>(intermediate), epsilon};
  switch (TailRows(rows)) {
    case 1: return LaunchTail<1>(args, stream);
    case 2: return LaunchTail<2>(args, stream);
    case 4: return LaunchTail<4>(args, stream);
    default: return LaunchTail<8>(args, stream);
  }
}

}  // namespace cuda
}  // namespace bertserve
