// The whole fp16 encoder stack for a batch of at most 32 tokens in one launch of one 16-block thread-block
// cluster, where a launch per GEMM costs more than the GEMM (batch 1: ~31 us a layer in 8 launches, each
// 3-4.5 us of dependent steps). The activations never leave shared memory between the GEMMs that read them: every
// block keeps the layer's whole input ([32, 768] fp16) and computes its own column slice of each GEMM, so a layer
// needs only four cluster barriers (0.2 us each in hardware) around small exchanges through L2:
//   QKV GEMM + bias, one head per block (blocks 0-11), then that head's attention   -> context slice to L2
//   | barrier | context from L2; attention-output GEMM, 64 columns per block (0-11), + bias + residual -> L2 (fp32)
//   | barrier | every block normalises all 32 rows itself (LayerNorm redundant, no second exchange)
//   FFN GEMM + bias + GELU, 192 columns per block, kept in shared memory
//   FFN-output GEMM over the block's own 192 of k (all 768 columns)                 -> fp32 partial sums to L2
//   | barrier | block r sums columns 48r.. of the 16 partials, + bias + residual      -> L2 (fp32)
//   | barrier | every block normalises all rows: the next layer's input.
// Weights depend on nothing computed, so they stream from DRAM by the TMA (128-byte-swizzled 64x64 boxes, three
// per 24 KB chunk, four chunks in flight) from the kernel's first instruction on, also across barriers and across
// the programmatic-launch wait for the embedding kernel before it; a block needs 0.9 MB a layer (16 blocks: the
// whole 14 MB). mma.sync m16n8k16 with fp32 accumulation; LayerNorm and softmax in fp32.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>

#include <mutex>
#include <string>

#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/kernels.h"
#include "custom_ops/kernels/cuda/mma.cuh"

#ifndef BERTSERVE_CLUSTER_CLOCK
#define BERTSERVE_CLUSTER_CLOCK()
#endif

namespace bertserve {
namespace cuda {
namespace {

constexpr int kBlocks = 16;  // one cluster (a non-portable size: Hopper allows 16)
constexpr int kRows = static_cast<int>(kClusterEncoderMaxTokens);
constexpr int kHidden = 768, kHeads = 12, kHeadSize = 64, kInter = 3072;
constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kBox = 64;  // TMA box: 64 rows of k x 64 columns of n, 128 bytes a row, 128-byte swizzle
constexpr int kBoxHalves = kBox * kBox;
constexpr int kBoxesPerChunk = 3;
constexpr int kChunkHalves = kBoxesPerChunk * kBoxHalves;  // 24 KB
#ifndef BERTSERVE_CLUSTER_STAGES
#define BERTSERVE_CLUSTER_STAGES 4
#endif
constexpr int kStages = BERTSERVE_CLUSTER_STAGES;
constexpr int kQkvChunks = kHidden / kBox;              // 12 per layer, blocks of a head
constexpr int kAttentionOutputChunks = kHidden / (kBox * kBoxesPerChunk);  // 4, blocks of a head
constexpr int kFfnChunks = kHidden / kBox;              // 12
constexpr int kFfnOutputChunks = (kInter / kBlocks / kBox) * (kHidden / (kBox * kBoxesPerChunk));  // 3 x 4
constexpr int kFfnCols = kInter / kBlocks;              // 192: a block's FFN columns, its FFN-output k
constexpr int kReduceCols = kHidden / kBlocks;          // 48: a block's share of the partial sums
static_assert(kClusterEncoderScratchBytes == int64_t{kRows} * kHidden * (2 + 4 + 4 * kBlocks), "scratch layout");
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory (dynamic, 1024-aligned for the swizzled boxes): weight stages, the layer input x [32, 768], a
// second [32, 768] (attention context, then the attention LayerNorm's output), a [32, 192] scratch (Q, K, V of
// the block's head, then its FFN activations), the stages' mbarriers and each row's sequence.
constexpr int kStageBytes = kChunkHalves * 2;
constexpr int kActBytes = kRows * kHidden * 2;
constexpr int kScratchBytes = kRows * kFfnCols * 2;
constexpr int kResidualBytes = kRows * (kHeadSize + kReduceCols) * 2;
constexpr int kSharedBytes = 1024 + kStages * kStageBytes + kActBytes + kScratchBytes + kResidualBytes + 256;

struct Params {
  CUtensorMap qkv_map, attention_output_map, intermediate_map, output_map;  // stacked [L * k, n]
  const __half *qkv_bias, *attention_output_bias, *attention_ln_gamma, *attention_ln_beta, *intermediate_bias,
      *output_bias, *output_ln_gamma, *output_ln_beta;
  const int32_t* cu_seqlens;
  int layers, batch, tokens;
  float epsilon, scale_log2;
  const __half* hidden_in;  // [tokens, 768]
  __half* hidden_out;       // [tokens, 768], or nullptr
  __half* first_out;        // [batch, 768], or nullptr
  __half* context;          // [32, 768] exchange buffers in global memory (L2)
  float* sums;              // [32, 768]
  float* partials;          // [16, 32, 768]
};

// Element (row, col) of a [rows, width] fp16 buffer whose 16-byte units are XOR-swizzled by row within groups of
// eight, so the eight rows an ldmatrix reads sit on distinct banks.
__device__ __forceinline__ int Swizzled(int width, int row, int col) {
  const int unit = col >> 3;
  return row * width + (((unit & ~7) | ((unit ^ row) & 7)) << 3) + (col & 7);
}

__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ uint32_t BlockRank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// The chunk sequence of block r over the whole forward: per layer its head's QKV (12) and attention-output (4)
// chunks when r < 12, then FFN (12) and FFN-output (12); a chunk is three boxes of one weight map.
struct Chunk {
  const CUtensorMap* map;
  int x[kBoxesPerChunk], y[kBoxesPerChunk];
};

__device__ __forceinline__ int ChunksPerLayer(int r) {
  return (r < kHeads ? kQkvChunks + kAttentionOutputChunks : 0) + kFfnChunks + kFfnOutputChunks;
}

// Chunk c of layer l for block r.
__device__ __forceinline__ void ChunkBoxes(const Params& p, int r, int l, int c, Chunk& chunk) {
  int* x = chunk.x;
  int* y = chunk.y;
  if (r < kHeads && c < kQkvChunks) {  // Q, K, V columns of head r over k rows 64c..
    chunk.map = &p.qkv_map;
    for (int j = 0; j < kBoxesPerChunk; ++j) x[j] = j * kHidden + kHeadSize * r, y[j] = l * kHidden + kBox * c;
  } else if (r < kHeads && c < kQkvChunks + kAttentionOutputChunks) {  // columns 64r.., k rows 192c..
    c -= kQkvChunks;
    chunk.map = &p.attention_output_map;
    for (int j = 0; j < kBoxesPerChunk; ++j) x[j] = kBox * r, y[j] = l * kHidden + kBox * (kBoxesPerChunk * c + j);
  } else {
    if (r < kHeads) c -= kQkvChunks + kAttentionOutputChunks;
    if (c < kFfnChunks) {  // columns 192r.., k rows 64c..
      chunk.map = &p.intermediate_map;
      for (int j = 0; j < kBoxesPerChunk; ++j) x[j] = kFfnCols * r + kBox * j, y[j] = l * kHidden + kBox * c;
    } else {  // columns 192g.. over k rows 192r + 64kc..
      c -= kFfnChunks;
      const int g = c / 3, kc = c % 3;
      chunk.map = &p.output_map;
      for (int j = 0; j < kBoxesPerChunk; ++j) {
        x[j] = kBox * kBoxesPerChunk * g + kBox * j, y[j] = l * kInter + kFfnCols * r + kBox * kc;
      }
    }
  }
}

// The weight stream of a block. Thread 0 issues the chunks in order (its cursor: layer, chunk of the layer, stage)
// into the stages; the consumers wait for chunk `next`, use it, and after every warp is done with the stage
// thread 0 refills it. (Per-stage arrival counters instead of the block barrier, the last warp refilling, measured
// slower; so did prefetching chunks into L2 ahead of the copies and six stages instead of four: the stream is not
// what a chunk waits on, the issuing thread's work between chunks is.)
struct WeightStream {
  const Params* p;
  __half* stages;
  uint64_t* full;
  int rank, next;
  int issue_layer, issue_chunk, issue_stage;  // thread 0 only

  __device__ void Issue() {
#ifdef BERTSERVE_CLUSTER_NO_STREAM
    return;
#endif
    if (issue_layer >= p->layers) return;
    Chunk chunk;
    ChunkBoxes(*p, rank, issue_layer, issue_chunk, chunk);
    ExpectBulkBytes(&full[issue_stage], kStageBytes);
    for (int j = 0; j < kBoxesPerChunk; ++j) {
      BulkTensorCopy2d(stages + issue_stage * kChunkHalves + j * kBoxHalves, chunk.map, chunk.x[j], chunk.y[j],
                       &full[issue_stage]);
    }
    if (++issue_stage == kStages) issue_stage = 0;
    if (++issue_chunk == ChunksPerLayer(rank)) issue_chunk = 0, ++issue_layer;
  }
  __device__ const __half* Wait() const {
#ifdef BERTSERVE_CLUSTER_NO_STREAM
    return stages + (next % kStages) * kChunkHalves;
#endif
    WaitBulkBarrier(&full[next % kStages], (next / kStages) & 1);
    return stages + (next % kStages) * kChunkHalves;
  }
  __device__ void Release() {
    __syncthreads();
    if (threadIdx.x == 0) Issue();
    ++next;
  }
};

// A operand (rows 16 mt.., k 16 steps from k) from a swizzled [32, width] buffer.
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const __half* buf, int width, int mt, int k) {
  const int lane = threadIdx.x & 31, row = mt * 16 + (lane & 15);
  LoadMatrixX4(a, buf + Swizzled(width, row, k + ((lane >> 4) << 3)));
}

// B operand (k rows k.. k+15, the 8 columns of 16-byte unit `unit`) from a 128-byte-swizzled [64, 64] box.
__device__ __forceinline__ void LoadB(uint32_t (&b)[2], const __half* box, int k, int unit) {
  const int row = k + (threadIdx.x & 15);
  LoadMatrixX2Trans(b, box + row * kBox + ((unit ^ (row & 7)) << 3));
}

// A wide chunk: three boxes side by side (192 columns) over the same 64 k; warp w owns columns 24w..24w+23.
// Every fragment of the chunk is loaded before the first mma.sync: the loads are volatile asm, kept in program
// order, so interleaving them with the mma.sync exposed each load's latency (a chunk took ~3x its mma time).
__device__ void MultiplyWide(float (&acc)[2][3][4], const __half* a, int width, int k0, const __half* chunk) {
#ifdef BERTSERVE_CLUSTER_NO_MMA
  return;
#endif
  const int warp = threadIdx.x >> 5;
  constexpr int kSteps = kBox / 16;
  uint32_t af[kSteps][2][4], bf[kSteps][3][2];
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    LoadA(af[ks][0], a, width, 0, k0 + 16 * ks);
    LoadA(af[ks][1], a, width, 1, k0 + 16 * ks);
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      const int t = 3 * warp + q;
      LoadB(bf[ks][q], chunk + (t >> 3) * kBoxHalves, 16 * ks, t & 7);
    }
  }
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      Mma16816(acc[0][q], af[ks][0], bf[ks][q]);
      Mma16816(acc[1][q], af[ks][1], bf[ks][q]);
    }
  }
}

// A deep chunk: three boxes stacked along k (192 k) over 64 columns; warp w owns columns 8w..8w+7. Loads first,
// as above, one box at a time.
__device__ void MultiplyDeep(float (&acc)[2][4], const __half* a, int width, int k0, const __half* chunk) {
#ifdef BERTSERVE_CLUSTER_NO_MMA
  return;
#endif
  const int warp = threadIdx.x >> 5;
  constexpr int kSteps = kBox / 16;
#pragma unroll
  for (int j = 0; j < kBoxesPerChunk; ++j) {
    uint32_t af[kSteps][2][4], bf[kSteps][2];
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      LoadA(af[ks][0], a, width, 0, k0 + kBox * j + 16 * ks);
      LoadA(af[ks][1], a, width, 1, k0 + kBox * j + 16 * ks);
      LoadB(bf[ks], chunk + j * kBoxHalves, 16 * ks, warp);
    }
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      Mma16816(acc[0], af[ks][0], bf[ks]);
      Mma16816(acc[1], af[ks][1], bf[ks]);
    }
  }
}

// The accumulator element e (0..3) of an m16n8 tile: row and column offsets within the tile.
__device__ __forceinline__ int AccRow(int e) { return ((threadIdx.x & 31) >> 2) + (e >> 1) * 8; }
__device__ __forceinline__ int AccCol(int e) { return ((threadIdx.x & 3) << 1) + (e & 1); }

// Attention of head (this block's) over the 32 rows, warps 0 and 1 taking 16 queries each: Q, K, V swizzled
// [32, 64] in shared memory, keys masked to the query's own sequence (seq), context rows to global memory.
__device__ void Attention(const __half* q, const __half* k, const __half* v, const int* seq, float scale_log2,
                          __half* context, int head) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp >= 2) return;
  float s[4][4] = {};
#pragma unroll
  for (int ks = 0; ks < kHeadSize / 16; ++ks) {
    uint32_t a[4];
    LoadA(a, q, kHeadSize, warp, 16 * ks);
#pragma unroll
    for (int kt = 0; kt < kRows / 8; ++kt) {
      uint32_t b[2];
      const int key = 8 * kt + (lane & 7);
      LoadMatrixX2(b, k + Swizzled(kHeadSize, key, 16 * ks + (((lane >> 3) & 1) << 3)));
      Mma16816(s[kt], a, b);
    }
  }
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int kt = 0; kt < kRows / 8; ++kt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + AccRow(e), key = 8 * kt + AccCol(e);
      s[kt][e] = seq[row] == seq[key] ? s[kt][e] * scale_log2 : -INFINITY;
      row_max[e >> 1] = fmaxf(row_max[e >> 1], s[kt][e]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 1));
    row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 2));
  }
#pragma unroll
  for (int kt = 0; kt < kRows / 8; ++kt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[kt][e] = exp2f(s[kt][e] - row_max[e >> 1]);
      row_sum[e >> 1] += s[kt][e];
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
  }
  float o[kHeadSize / 8][4] = {};
#pragma unroll
  for (int j = 0; j < kRows / 16; ++j) {
    const uint32_t a[4] = {PackHalf2(s[2 * j][0], s[2 * j][1]), PackHalf2(s[2 * j][2], s[2 * j][3]),
                           PackHalf2(s[2 * j + 1][0], s[2 * j + 1][1]), PackHalf2(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
    for (int dt = 0; dt < kHeadSize / 8; ++dt) {
      uint32_t b[2];
      const int key = 16 * j + (lane & 15);
      LoadMatrixX2Trans(b, v + Swizzled(kHeadSize, key, 8 * dt));
      Mma16816(o[dt], a, b);
    }
  }
#pragma unroll
  for (int dt = 0; dt < kHeadSize / 8; ++dt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * warp + AccRow(2 * h), col = head * kHeadSize + 8 * dt + AccCol(0);
      const float inv = 1.f / row_sum[h];
      *reinterpret_cast<__half2*>(context + row * kHidden + col) =
          __floats2half2_rn(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
    }
  }
}

// LayerNorm of all 32 rows of sums [32, 768] (fp32, in L2) into the swizzled fp16 buffer out; warp w takes rows
// 4w..4w+3, each lane 24 columns (six float4) of each, all loads issued before the first reduction (one L2 round
// trip, not one a row); two-pass statistics in fp32.
__device__ void NormalizeAllRows(const float* sums, const __half* gamma, const __half* beta, float epsilon,
                                 __half* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kVectors = kHidden / 4 / 32, kRowsPerWarp = kRows / kWarps;
  uint2 g[kVectors], b[kVectors];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    g[i] = *reinterpret_cast<const uint2*>(gamma + 4 * (lane + 32 * i));
    b[i] = *reinterpret_cast<const uint2*>(beta + 4 * (lane + 32 * i));
  }
  float4 x[kRowsPerWarp][kVectors];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      x[r][i] = __ldcg(reinterpret_cast<const float4*>(sums + (warp * kRowsPerWarp + r) * kHidden) + lane + 32 * i);
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kVectors; ++i) sum += x[r][i].x + x[r][i].y + x[r][i].z + x[r][i].w;
    const float mean = WarpSum(sum) * (1.f / kHidden);
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      float4& v = x[r][i];
      v.x -= mean, v.y -= mean, v.z -= mean, v.w -= mean;
      sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float inv = rsqrtf(WarpSum(sq) * (1.f / kHidden) + epsilon);
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const float2 g01 = __half22float2(*reinterpret_cast<const __half2*>(&g[i].x));
      const float2 g23 = __half22float2(*reinterpret_cast<const __half2*>(&g[i].y));
      const float2 b01 = __half22float2(*reinterpret_cast<const __half2*>(&b[i].x));
      const float2 b23 = __half22float2(*reinterpret_cast<const __half2*>(&b[i].y));
      const float4& v = x[r][i];
      const __half2 lo = __floats2half2_rn(v.x * inv * g01.x + b01.x, v.y * inv * g01.y + b01.y);
      const __half2 hi = __floats2half2_rn(v.z * inv * g23.x + b23.x, v.w * inv * g23.y + b23.y);
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(out + Swizzled(kHidden, warp * kRowsPerWarp + r, 4 * (lane + 32 * i))) = packed;
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) ClusterEncoderKernel(const __grid_constant__ Params p) {
  extern __shared__ unsigned char shared_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) & ~uintptr_t{1023});
  __half* stages = reinterpret_cast<__half*>(base);
  // x: the layer input, then the attention context, the attention LayerNorm's output, the next layer's input;
  // the residual columns a block adds are copied out before x is overwritten.
  __half* x = reinterpret_cast<__half*>(base + kStages * kStageBytes);  // [32, 768] swizzled
  __half* scratch = x + kRows * kHidden;                                 // Q, K, V [32, 64] each; FFN [32, 192]
  __half* residual_o = scratch + kRows * kFfnCols;                       // [32, 64]: x[:, 64 rank..]
  __half* residual_f = residual_o + kRows * kHeadSize;                   // [32, 48]: LN1 output[:, 48 rank..]
  uint64_t* full = reinterpret_cast<uint64_t*>(residual_f + kRows * kReduceCols);
  int* seq = reinterpret_cast<int*>(full + kStages);
  const int rank = static_cast<int>(BlockRank()), tid = threadIdx.x, warp = tid >> 5;

  WeightStream w{&p, stages, full, rank, 0, 0, 0, 0};
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) InitBulkBarrier(&full[s]);
    // Weights and the per-layer vectors need no predecessor: start streaming them before waiting for it.
    for (int i = 0; i < kStages; ++i) w.Issue();
    const uint32_t h = p.layers * kHidden * sizeof(__half);
    for (const __half* v : {p.attention_output_bias, p.attention_ln_gamma, p.attention_ln_beta, p.output_bias,
                            p.output_ln_gamma, p.output_ln_beta}) {
      PrefetchToL2(v, h);
    }
    PrefetchToL2(p.qkv_bias, 3 * h);
    PrefetchToL2(p.intermediate_bias, h / kHidden * kInter);
  }
  WaitForPrecedingKernels();
  const int real_tokens = p.cu_seqlens[p.batch];
  if (tid < kRows) seq[tid] = tid < real_tokens ? RowOfToken(p.cu_seqlens, p.batch, tid) : -1;
  for (int i = tid; i < kRows * kHidden / 8; i += kThreads) {
    const int row = i / (kHidden / 8), col = (i % (kHidden / 8)) * 8;
    const uint4 v = row < real_tokens ? *reinterpret_cast<const uint4*>(p.hidden_in + row * kHidden + col)
                                      : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(x + Swizzled(kHidden, row, col)) = v;
  }
  __syncthreads();

  BERTSERVE_CLUSTER_CLOCK();
  for (int l = 0; l < p.layers; ++l) {
    if (rank < kHeads) {
      float acc[2][3][4] = {};
      for (int c = 0; c < kQkvChunks; ++c) {
        MultiplyWide(acc, x, kHidden, kBox * c, w.Wait());
        w.Release();
      }
      // Q, K, V of head `rank` (+ bias) into scratch: local column 64j + d is part j, dimension d.
#pragma unroll
      for (int q = 0; q < 3; ++q) {
        const int t = 3 * warp + q, part = t >> 3, d = (t & 7) * 8 + AccCol(0);
        const float2 bias = __half22float2(
            *reinterpret_cast<const __half2*>(p.qkv_bias + (l * 3 + part) * kHidden + rank * kHeadSize + d));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = 16 * mt + AccRow(2 * h);
            *reinterpret_cast<__half2*>(scratch + part * kRows * kHeadSize + Swizzled(kHeadSize, row, d)) =
                __floats2half2_rn(acc[mt][q][2 * h] + bias.x, acc[mt][q][2 * h + 1] + bias.y);
          }
        }
      }
      __syncthreads();
      BERTSERVE_CLUSTER_CLOCK();
      Attention(scratch, scratch + kRows * kHeadSize, scratch + 2 * kRows * kHeadSize, seq, p.scale_log2,
                p.context, rank);
    }
    BERTSERVE_CLUSTER_CLOCK();
    ClusterSync();
    BERTSERVE_CLUSTER_CLOCK();

    if (rank < kHeads) {
      for (int i = tid; i < kRows * kHeadSize / 8; i += kThreads) {
        const int row = i / (kHeadSize / 8), col = (i % (kHeadSize / 8)) * 8;
        *reinterpret_cast<uint4*>(residual_o + row * kHeadSize + col) =
            *reinterpret_cast<const uint4*>(x + Swizzled(kHidden, row, kHeadSize * rank + col));
      }
      __syncthreads();
      for (int i = tid; i < kRows * kHidden / 8; i += kThreads) {
        const int row = i / (kHidden / 8), col = (i % (kHidden / 8)) * 8;
        *reinterpret_cast<uint4*>(x + Swizzled(kHidden, row, col)) =
            __ldcg(reinterpret_cast<const uint4*>(p.context + row * kHidden + col));
      }
      __syncthreads();
      float acc[2][4] = {};
      for (int c = 0; c < kAttentionOutputChunks; ++c) {
        MultiplyDeep(acc, x, kHidden, kBox * kBoxesPerChunk * c, w.Wait());
        w.Release();
      }
      const int col = kBox * rank + 8 * warp + AccCol(0);
      const float2 bias = __half22float2(*reinterpret_cast<const __half2*>(p.attention_output_bias + l * kHidden + col));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = 16 * mt + AccRow(2 * h);
          const float2 res =
              __half22float2(*reinterpret_cast<const __half2*>(residual_o + row * kHeadSize + col - kBox * rank));
          __stcg(reinterpret_cast<float2*>(p.sums + row * kHidden + col),
                 make_float2(acc[mt][2 * h] + bias.x + res.x, acc[mt][2 * h + 1] + bias.y + res.y));
        }
      }
    }
    BERTSERVE_CLUSTER_CLOCK();
    ClusterSync();
    BERTSERVE_CLUSTER_CLOCK();

    NormalizeAllRows(p.sums, p.attention_ln_gamma + l * kHidden, p.attention_ln_beta + l * kHidden, p.epsilon, x);
    __syncthreads();
    for (int i = tid; i < kRows * kReduceCols / 8; i += kThreads) {
      const int row = i / (kReduceCols / 8), col = (i % (kReduceCols / 8)) * 8;
      *reinterpret_cast<uint4*>(residual_f + row * kReduceCols + col) =
          *reinterpret_cast<const uint4*>(x + Swizzled(kHidden, row, kReduceCols * rank + col));
    }
    BERTSERVE_CLUSTER_CLOCK();
    {
      float acc[2][3][4] = {};
      for (int c = 0; c < kFfnChunks; ++c) {
        MultiplyWide(acc, x, kHidden, kBox * c, w.Wait());
        w.Release();
      }
#pragma unroll
      for (int q = 0; q < 3; ++q) {
        const int col = 8 * (3 * warp + q) + AccCol(0);
        const float2 bias = __half22float2(
            *reinterpret_cast<const __half2*>(p.intermediate_bias + l * kInter + kFfnCols * rank + col));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = 16 * mt + AccRow(2 * h);
            *reinterpret_cast<__half2*>(scratch + Swizzled(kFfnCols, row, col)) = __floats2half2_rn(
                GeluErf(acc[mt][q][2 * h] + bias.x), GeluErf(acc[mt][q][2 * h + 1] + bias.y));
          }
        }
      }
    }
    __syncthreads();
    BERTSERVE_CLUSTER_CLOCK();
    for (int g = 0; g < kHidden / (kBox * kBoxesPerChunk); ++g) {
      float acc[2][3][4] = {};
      for (int kc = 0; kc < kFfnCols / kBox; ++kc) {
        MultiplyWide(acc, scratch, kFfnCols, kBox * kc, w.Wait());
        w.Release();
      }
      float* partial = p.partials + rank * kRows * kHidden;
#pragma unroll
      for (int q = 0; q < 3; ++q) {
        const int col = kBox * kBoxesPerChunk * g + 8 * (3 * warp + q) + AccCol(0);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = 16 * mt + AccRow(2 * h);
            __stcg(reinterpret_cast<float2*>(partial + row * kHidden + col),
                   make_float2(acc[mt][q][2 * h], acc[mt][q][2 * h + 1]));
          }
        }
      }
    }
    BERTSERVE_CLUSTER_CLOCK();
    ClusterSync();
    BERTSERVE_CLUSTER_CLOCK();

    // Columns 48 rank.. of the 16 partial sums, + bias + residual (the attention LayerNorm output).
    for (int i = tid; i < kRows * kReduceCols / 4; i += kThreads) {
      const int row = i / (kReduceCols / 4), col = kReduceCols * rank + (i % (kReduceCols / 4)) * 4;
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(p.partials + (b * kRows + row) * kHidden + col));
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
      const __half* bias = p.output_bias + l * kHidden + col;
      const __half* res = residual_f + row * kReduceCols + col - kReduceCols * rank;
      sum.x += __half2float(bias[0]) + __half2float(res[0]);
      sum.y += __half2float(bias[1]) + __half2float(res[1]);
      sum.z += __half2float(bias[2]) + __half2float(res[2]);
      sum.w += __half2float(bias[3]) + __half2float(res[3]);
      __stcg(reinterpret_cast<float4*>(p.sums + row * kHidden + col), sum);
    }
    BERTSERVE_CLUSTER_CLOCK();
    ClusterSync();
    BERTSERVE_CLUSTER_CLOCK();
    NormalizeAllRows(p.sums, p.output_ln_gamma + l * kHidden, p.output_ln_beta + l * kHidden, p.epsilon, x);
    __syncthreads();
    BERTSERVE_CLUSTER_CLOCK();
  }

  // Output rows from x: all real tokens, or each row's first token (zeros for a row without tokens).
  if (p.hidden_out != nullptr) {
    for (int i = tid; i < real_tokens * kHidden / 8; i += kThreads) {
      const int row = i / (kHidden / 8), col = (i % (kHidden / 8)) * 8;
      if (row % kBlocks != rank) continue;
      *reinterpret_cast<uint4*>(p.hidden_out + row * kHidden + col) =
          *reinterpret_cast<const uint4*>(x + Swizzled(kHidden, row, col));
    }
  }
  if (p.first_out != nullptr) {
    for (int b = rank; b < p.batch; b += kBlocks) {
      const int row = p.cu_seqlens[b];
      const bool empty = p.cu_seqlens[b + 1] == row;
      for (int col = tid * 8; col < kHidden; col += kThreads * 8) {
        *reinterpret_cast<uint4*>(p.first_out + b * kHidden + col) =
            empty ? make_uint4(0, 0, 0, 0) : *reinterpret_cast<const uint4*>(x + Swizzled(kHidden, row, col));
      }
    }
  }
}

PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    ThrowIfFailed(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found),
                  "cuTensorMapEncodeTiled");
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      throw std::runtime_error("the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// w: [rows, n] fp16 row-major, in 64 x 64 boxes with the 128-byte swizzle the kernel's LoadB undoes.
CUtensorMap WeightMap(const fp16* w, int64_t rows, int64_t n) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(n), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(n) * sizeof(__half)};
  const cuuint32_t box[2] = {kBox, kBox};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status = TensorMapEncoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<fp16*>(w), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    throw std::runtime_error("cuTensorMapEncodeTiled failed (" + std::to_string(status) + ") for a [" +
                             std::to_string(rows) + ", " + std::to_string(n) + "] weight");
  }
  return map;
}

}  // namespace

bool ClusterEncoderSupports(const EncoderDims& dims, const PackedBatch& batch) {
  return batch.num_tokens > 0 && batch.num_tokens <= kRows && dims.num_layers > 0 && dims.hidden == kHidden &&
         dims.num_heads == kHeads && dims.intermediate == kInter;
}

void LaunchClusterEncoder(const EncoderDims& dims, const EncoderWeights<fp16>& w, const PackedBatch& batch,
                          const __half* hidden_in, __half* hidden_out, __half* first_out, void* scratch,
                          cudaStream_t stream) {
  if (!ClusterEncoderSupports(dims, batch)) {
    throw std::runtime_error("the cluster encoder does not take " + std::to_string(batch.num_tokens) +
                             " tokens of hidden " + std::to_string(dims.hidden));
  }
  static std::once_flag configured;
  std::call_once(configured, [] {
    ThrowIfFailed(cudaFuncSetAttribute(ClusterEncoderKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kSharedBytes),
                  "ClusterEncoderKernel shared memory");
    ThrowIfFailed(cudaFuncSetAttribute(ClusterEncoderKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                  "ClusterEncoderKernel cluster size");
  });
  const int64_t layers = dims.num_layers;
  Params p{};
  p.qkv_map = WeightMap(w.qkv_kernel, layers * kHidden, 3 * kHidden);
  p.attention_output_map = WeightMap(w.attention_output_kernel, layers * kHidden, kHidden);
  p.intermediate_map = WeightMap(w.intermediate_kernel, layers * kHidden, kInter);
  p.output_map = WeightMap(w.output_kernel, layers * kInter, kHidden);
  p.qkv_bias = ToDevice(w.qkv_bias);
  p.attention_output_bias = ToDevice(w.attention_output_bias);
  p.attention_ln_gamma = ToDevice(w.attention_ln_gamma);
  p.attention_ln_beta = ToDevice(w.attention_ln_beta);
  p.intermediate_bias = ToDevice(w.intermediate_bias);
  p.output_bias = ToDevice(w.output_bias);
  p.output_ln_gamma = ToDevice(w.output_ln_gamma);
  p.output_ln_beta = ToDevice(w.output_ln_beta);
  p.cu_seqlens = batch.cu_seqlens_device;
  p.layers = static_cast<int>(layers);
  p.batch = static_cast<int>(batch.batch);
  p.tokens = static_cast<int>(batch.num_tokens);
  p.epsilon = dims.layer_norm_epsilon;
  p.scale_log2 = kLog2e / sqrtf(static_cast<float>(kHeadSize));
  p.hidden_in = hidden_in;
  p.hidden_out = hidden_out;
  p.first_out = first_out;
  p.context = static_cast<__half*>(scratch);
  p.sums = reinterpret_cast<float*>(p.context + kRows * kHidden);
  p.partials = p.sums + kRows * kHidden;

  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kBlocks;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kBlocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSharedBytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = 2;
  ThrowIfFailed(cudaLaunchKernelEx(&config, ClusterEncoderKernel, p), "ClusterEncoderKernel");
}

}  // namespace cuda
}  // namespace bertserve
