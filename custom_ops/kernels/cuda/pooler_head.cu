// The ranker's pooler and head (cuda::RankerHead in bert_core.h): in one kernel at batch 1 (LaunchPoolerHead in
// kernels.h), else the pooler GEMM and the head kernel (LaunchRankerHead). There the
// pooler GEMM (cuBLASLt, a 768 x 768 weight matrix for one row) and the head after it were two dependent steps at
// the end of the forward, the GEMM outside the launch chain, its weights read from DRAM after the last LayerNorm
// (commit 3fbca00).
//
// One cluster of kClusterBlocks blocks: block r owns hidden / kClusterBlocks of the pooler's output columns, each
// warp 8 of them (one 16-byte load of each weight row), its lanes splitting k. Before the chain's wait every lane
// loads its weight rows into registers (they do not depend on the kernel before, so their DRAM reads overlap it);
// after it, the block stages the rows' first tokens in shared memory, and per row each warp forms its 8 columns'
// dot products, tanh and their share of the logits, the block sums its warps' shares and writes them into block
// 0's shared memory, and after the cluster's barrier block 0 turns the sums into scores. No global scratch, no
// atomics: the only round trips to memory after the wait are the first tokens' loads and the scores' stores.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kClusterBlocks = 16;  // the largest cluster the H100/H200 run (a non-portable size)
constexpr int kWarpColumns = 8;     // a warp's pooler outputs: 16 bytes of each weight row
constexpr int kMaxWarps = static_cast<int>(kPoolerHeadMaxHidden) / kClusterBlocks / kWarpColumns;
constexpr int kMaxRowsPerLane = static_cast<int>(kPoolerHeadMaxHidden) / 32;  // weight rows (k) a lane holds

// acc[0..7] summed over the warp's lanes: lanes 4c .. 4c + 3 return column c's sum. Each round hands half of a
// lane's columns to the lane `offset` away and adds the other half (9 shuffles, against 40 for 8 warp sums).
__device__ __forceinline__ float WarpSumOfColumns(float (&acc)[kWarpColumns]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int width = kWarpColumns / 2, offset = 16; width >= 1; width /= 2, offset /= 2) {
    const bool upper = lane & offset;
#pragma unroll
    for (int i = 0; i < width; ++i) {
      const float send = upper ? acc[i] : acc[i + width];
      const float keep = upper ? acc[i + width] : acc[i];
      acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
  }
  float sum = acc[0] + __shfl_xor_sync(0xffffffffu, acc[0], 2);
  return sum + __shfl_xor_sync(0xffffffffu, sum, 1);
}

__global__ void __launch_bounds__(kMaxWarps * 32)
    PoolerHeadKernel(const __half* __restrict__ first, const __half* __restrict__ pooler_kernel,
                     const __half* __restrict__ pooler_bias, const __half* __restrict__ classifier_kernel,
                     const __half* __restrict__ classifier_bias, int batch, int hidden, int num_labels,
                     float* __restrict__ scores) {
  const cg::cluster_group cluster = cg::this_cluster();
  // Block 0's shared memory takes the other blocks' writes only once every block of the cluster has started: each
  // arrives here and waits before its first write (the CUDA programming guide's condition for distributed shared
  // memory), by then long past.
  auto started = cluster.barrier_arrive();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int column0 = (static_cast<int>(cluster.block_rank()) * warps + warp) * kWarpColumns;
  // Before the wait: the warp's weight columns, rows k = lane + 32 i; and, in lanes 4c, column c's pooler bias and
  // classifier weights.
  uint4 w[kMaxRowsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxRowsPerLane; ++i) {
    const int k = lane + 32 * i;
    w[i] = k < hidden ? *reinterpret_cast<const uint4*>(pooler_kernel + static_cast<int64_t>(k) * hidden + column0)
                      : make_uint4(0, 0, 0, 0);
  }
  const int column = column0 + ((lane >> 2) & (kWarpColumns - 1));
  const float bias = __half2float(pooler_bias[column]);
  const float w0 = __half2float(classifier_kernel[column * num_labels]);
  const float w1 = __half2float(classifier_kernel[column * num_labels + num_labels - 1]);
  JoinLaunchChain();

  // The rows' first tokens, staged once: every warp reads all of them.
  __shared__ __align__(16) __half x[kPoolerHeadMaxBatch * kPoolerHeadMaxHidden];
  const int chunks = batch * hidden / 8;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    reinterpret_cast<uint4*>(x)[c] = reinterpret_cast<const uint4*>(first)[c];
  }
  __syncthreads();

  __shared__ float2 warp_logits[kMaxWarps];
  __shared__ float2 block_logits[kClusterBlocks][kPoolerHeadMaxBatch];  // block 0's receive the cluster's
  float2* block0_logits = cluster.map_shared_rank(&block_logits[0][0], 0);
  cluster.barrier_wait(std::move(started));
  for (int b = 0; b < batch; ++b) {
    float acc[kWarpColumns] = {};
#pragma unroll
    for (int i = 0; i < kMaxRowsPerLane; ++i) {
      const int k = lane + 32 * i;
      const float xk = k < hidden ? __half2float(x[b * hidden + k]) : 0.f;
      const auto* pairs = reinterpret_cast<const __half2*>(&w[i]);
#pragma unroll
      for (int j = 0; j < kWarpColumns / 2; ++j) {
        const float2 wk = __half22float2(pairs[j]);
        acc[2 * j] = fmaf(xk, wk.x, acc[2 * j]);
        acc[2 * j + 1] = fmaf(xk, wk.y, acc[2 * j + 1]);
      }
    }
    const float p = tanhf(WarpSumOfColumns(acc) + bias);
    // The warp's 8 columns' shares of the logits, from lanes 0, 4, .., 28 (the others hold copies).
    float logit0 = (lane & 3) == 0 ? p * w0 : 0.f, logit1 = (lane & 3) == 0 ? p * w1 : 0.f;
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
      logit0 += __shfl_xor_sync(0xffffffffu, logit0, offset);
      logit1 += __shfl_xor_sync(0xffffffffu, logit1, offset);
    }
    if (lane == 0) warp_logits[warp] = make_float2(logit0, logit1);
    __syncthreads();
    if (threadIdx.x == 0) {
      float2 sum = make_float2(0.f, 0.f);
      for (int v = 0; v < warps; ++v) sum = make_float2(sum.x + warp_logits[v].x, sum.y + warp_logits[v].y);
      block0_logits[cluster.block_rank() * kPoolerHeadMaxBatch + b] = sum;
    }
    __syncthreads();  // warp_logits is rewritten for the next row
  }
  cluster.sync();  // every block's sums are in block 0's shared memory
  if (cluster.block_rank() != 0) return;
  for (int b = threadIdx.x; b < batch; b += blockDim.x) {
    float logit0 = __half2float(classifier_bias[0]), logit1 = __half2float(classifier_bias[num_labels - 1]);
    for (int r = 0; r < kClusterBlocks; ++r) {
      logit0 += block_logits[r][b].x;
      logit1 += block_logits[r][b].y;
    }
    scores[b] = RankerScore(logit0, logit1, num_labels);
  }
}

}  // namespace

bool PoolerHeadSupports(int64_t batch, int64_t hidden, int64_t num_labels) {
  return batch >= 1 && batch <= kPoolerHeadMaxBatch && hidden % (kClusterBlocks * kWarpColumns) == 0 &&
         hidden <= kPoolerHeadMaxHidden && (num_labels == 1 || num_labels == 2);
}

void LaunchPoolerHead(const __half* first, const __half* pooler_kernel, const __half* pooler_bias,
                      const __half* classifier_kernel, const __half* classifier_bias, int64_t batch, int64_t hidden,
                      int64_t num_labels, float* scores, cudaStream_t stream) {
  if (!PoolerHeadSupports(batch, hidden, num_labels)) {
    throw std::runtime_error("LaunchPoolerHead: batch " + std::to_string(batch) + ", hidden " +
                             std::to_string(hidden) + ", " + std::to_string(num_labels) + " labels not supported");
  }
  static const bool sized = [] {
    ThrowIfFailed(cudaFuncSetAttribute(PoolerHeadKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                  "PoolerHeadKernel cluster size");
    return true;
  }();
  (void)sized;
  LaunchClustersAfterPredecessor("PoolerHeadKernel", PoolerHeadKernel, dim3(kClusterBlocks),
                                 dim3(static_cast<unsigned>(hidden / kClusterBlocks / kWarpColumns * 32)),
                                 kClusterBlocks, 0, stream, first, pooler_kernel, pooler_bias, classifier_kernel,
                                 classifier_bias, static_cast<int>(batch), static_cast<int>(hidden),
                                 static_cast<int>(num_labels), scores);
}

namespace {

// Whether RankerHead runs LaunchPoolerHead (fp16 only: the kernel reads half weights).
template <typename T>
bool FusedPoolerHead(int64_t batch, int64_t hidden, int64_t num_labels) {
  return std::is_same_v<T, fp16> && PoolerHeadSupports(batch, hidden, num_labels);
}

}  // namespace

template <typename T>
int64_t RankerHeadWorkspaceBytes(int64_t batch, int64_t hidden, int64_t num_labels) {
  if (batch == 0 || FusedPoolerHead<T>(batch, hidden, num_labels)) return 0;
  return AlignedBytes(kGemmWorkspaceBytes) + AlignedBytes(batch * hidden * static_cast<int64_t>(sizeof(float)));
}

template <typename T>
void RankerHead(const RankerHeadWeights<T>& w, const T* first_tokens, int64_t batch, void* workspace, float* scores,
                GemmContext* gemm, void* stream) {
  using D = DeviceT<T>;
  if (batch == 0) return;
  const int64_t h = w.hidden;
  if constexpr (std::is_same_v<D, __half>) {
    if (FusedPoolerHead<T>(batch, h, w.num_labels)) {
      LaunchPoolerHead(ToDevice(first_tokens), ToDevice(w.pooler_kernel), ToDevice(w.pooler_bias),
                       ToDevice(w.classifier_kernel), ToDevice(w.classifier_bias), batch, h, w.num_labels, scores,
                       AsStream(stream));
      return;
    }
  }
  // fp32 output, so that tanh and the classifier see the pooler unrounded.
  float* pooled = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + AlignedBytes(kGemmWorkspaceBytes));
  Gemm<D, float>(gemm, ToDevice(first_tokens), ToDevice(w.pooler_kernel), nullptr, pooled, batch, h, h,
                 Epilogue::kNone, workspace, stream);
  LaunchRankerHead<D>(pooled, ToDevice(w.pooler_bias), ToDevice(w.classifier_kernel), ToDevice(w.classifier_bias),
                      batch, h, w.num_labels, scores, AsStream(stream));
}

#define BERTSERVE_INSTANTIATE_RANKER_HEAD(T)                                                                      \
  template int64_t RankerHeadWorkspaceBytes<T>(int64_t, int64_t, int64_t);                                         \
  template void RankerHead<T>(const RankerHeadWeights<T>&, const T*, int64_t, void*, float*, GemmContext*, void*);
BERTSERVE_INSTANTIATE_RANKER_HEAD(float)
BERTSERVE_INSTANTIATE_RANKER_HEAD(fp16)
#undef BERTSERVE_INSTANTIATE_RANKER_HEAD

}  // namespace cuda
}  // namespace bertserve
