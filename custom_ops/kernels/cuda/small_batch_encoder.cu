// The whole fp16 encoder stack in one persistent launch for batches of a few dozen tokens, where a launch per
// GEMM costs more than the GEMM: every block stays resident (a cooperative launch, one block per SM) and each
// layer runs as phases separated by device-wide barriers:
//   LayerNorm of the previous layer's output sums (one warp per row) -> x
//   QKV GEMM + bias -> qkv
//   attention, a block per (row, head, 8 queries) with that head's keys and values in shared memory -> context
//   attention-output GEMM, k split across blocks, fp32 partial sums (+ bias + residual) added atomically -> sums
//   attention LayerNorm -> x
//   FFN GEMM + bias + GELU -> ffn
//   FFN-output GEMM like the attention output -> sums
// and a last LayerNorm writes the encoder's output. Every block reads the GEMM inputs it needs from L2, so the
// GEMMs ending in a residual add split k finely (a block stages a slice of the input, not all of it). A GEMM
// work unit is 24 or 48 output columns over one k slice; its weights (which depend on nothing computed) are
// bulk-copied into shared memory by the TMA while the block still works on the phase before, so after the
// barrier a block stages only activations and runs mma.sync; the eight warps split the slice's k steps and sum
// their tiles through shared memory. Activations another block wrote are read through L2 (.cg), never a stale L1.
#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/kernels.h"
#include "custom_ops/kernels/cuda/mma.cuh"
#ifndef BERTSERVE_STEP_CLOCK
#define BERTSERVE_STEP_CLOCK()
#endif

namespace bertserve {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxRows = static_cast<int>(kSmallBatchMaxTokens);
constexpr int kMaxRowTiles = kMaxRows / 16;
constexpr int kMaxSliceK = static_cast<int>(kSmallBatchMaxHidden);  // also the widest LayerNorm row
constexpr int kRowPairs = kMaxSliceK / 64;                          // float2 per lane for one LayerNorm row
constexpr int kXStride = kMaxSliceK + 8;  // halves; +16 bytes keeps the 8 rows of an ldmatrix on distinct banks
constexpr int kQueriesPerItem = kWarps;   // attention: one query row per warp

// Shared memory: the activations' k slice [kMaxRows, kXStride] (after the unit's mma.sync, the warps' partial
// tiles [kWarps, kMaxRows, tile columns] in the same bytes; in the attention phase, K, V and Q of one head), the
// unit's weights [slice k, tile columns + pad], and the weights' mbarrier.
constexpr size_t kXBytes = size_t{kMaxRows} * kXStride * sizeof(__half);
constexpr size_t kWBytes = size_t{kMaxSliceK} * 24 * sizeof(__half);  // = kMaxSliceK / 2 rows of 48 columns
constexpr size_t kSharedBytes = kXBytes + kWBytes + 16;
static_assert(size_t{kWarps} * kMaxRows * 48 * sizeof(float) <= kXBytes, "partial tiles fit the input's bytes");
static_assert(kXBytes % 128 == 0, "bulk tensor copies land 128-byte aligned");

// The four GEMMs' weights, each stacked over layers as one 2-D tensor [L * k, n] for the TMA.
enum WeightMap { kQkvMap, kAttentionOutputMap, kIntermediateMap, kOutputMap, kNumWeightMaps };

struct Params {
  CUtensorMap weight_maps[kNumWeightMaps];
  int box_rows[kNumWeightMaps];  // rows of one TMA box: a unit's k slice is a whole number of boxes
  // Stacked [L, ...] vectors, as in EncoderWeights.
  const __half *qkv_bias, *attention_output_bias, *attention_ln_gamma, *attention_ln_beta, *intermediate_bias,
      *output_bias, *output_ln_gamma, *output_ln_beta;
  int layers, hidden, heads, intermediate;
  int attention_output_slices, output_slices;  // k slices of the two GEMMs that end in a residual add
  float epsilon, scale_log2;
  const int32_t* cu_seqlens;
  int batch, tokens, max_seqlen;
  __half* hidden_io;  // [tokens, H]: the embedding's output in, the encoder's output out
  SmallBatchEncoderBuffers buffers;
};

// Y[tokens, n] = X[tokens, k] @ W[k, n] with W the rows first_row .. first_row + k of a weight map; unit u covers
// columns (u % tiles) * cols .. + cols over k slice u / tiles.
struct GemmShape {
  const CUtensorMap* map;
  int first_row, box_rows;
  int n, k, slices, cols;
  __device__ int Tiles() const { return n / cols; }
  __device__ int Units() const { return Tiles() * slices; }
  __device__ int SliceK() const { return k / slices; }
};

enum class Epilogue { kBias, kBiasGelu, kAccumulate };

struct EpilogueArgs {
  const __half* bias;
  __half* out;             // kBias, kBiasGelu: [tokens, n]
  const __half* residual;  // kAccumulate: [tokens, n], added with the bias by slice 0
  float* sums;             // kAccumulate: [tokens, n], zeroed before the phase
};

struct Shared {
  __half* x;
  __half* w;
  uint64_t* w_ready;
};

__device__ __forceinline__ int RowsPadded(int tokens) { return (tokens + 15) & ~15; }

// The last warp's first thread bulk-copies unit's weight tile into shared memory; WaitForWeights returns once it
// has landed. The caller has synchronised the block since the tile's last reader. Not thread 0: the grid barrier's
// fence runs on thread 0 and measured waiting for that thread's copies in flight, which then serialised the next
// phase's weights from DRAM with the barrier instead of overlapping them.
constexpr int kWeightIssuer = kThreads - 32;

__device__ void StageWeights(const GemmShape& g, int unit, const Shared& s) {
  if (threadIdx.x != kWeightIssuer) return;
  const int tile = unit % g.Tiles(), slice = unit / g.Tiles(), slice_k = g.SliceK();
  ExpectBulkBytes(s.w_ready, static_cast<uint32_t>(slice_k * g.cols * sizeof(__half)));
  for (int r = 0; r < slice_k; r += g.box_rows) {
    BulkTensorCopy2d(s.w + r * g.cols, g.map, tile * g.cols, g.first_row + slice * slice_k + r, s.w_ready);
  }
}

__device__ __forceinline__ void WaitForWeights(const Shared& s, uint32_t& parity) {
  WaitBulkBarrier(s.w_ready, parity);
  parity ^= 1;
}

// Copies columns [k0, k0 + slice_k) of every token row of x [tokens, ld] into shared memory (plain loads: they
// measured faster here than cp.async, which stalls at issue); the rows up to the next multiple of 16 are zero.
__device__ void StageActivations(const __half* x, int ld, int k0, int slice_k, int tokens, __half* x_s) {
  const int vectors = slice_k / 8;
#pragma unroll 4
  for (int i = threadIdx.x; i < RowsPadded(tokens) * vectors; i += kThreads) {
    const int r = i / vectors, c = (i % vectors) * 8;
    if (r < tokens) {
      *reinterpret_cast<uint4*>(x_s + r * kXStride + c) =
          __ldcg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(r) * ld + k0 + c));
    } else {
      *reinterpret_cast<uint4*>(x_s + r * kXStride + c) = make_uint4(0, 0, 0, 0);
    }
  }
}

// This warp's share of the unit (every kWarps-th k step of 16), then, once every warp is done with the input,
// its partial tile into the input's bytes: [kWarps, kMaxRows, kN8 * 8] floats.
template <int kN8>
__device__ void MultiplyUnit(const Shared& s, int slice_k, int row_tiles) {
  constexpr int kCols = kN8 * 8;  // weight rows: 48 bytes (ldmatrix rows on distinct banks) or 96 (two-way)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float acc[kMaxRowTiles][kN8][4] = {};
  for (int step = warp; step < slice_k / 16; step += kWarps) {
    const __half* w_rows = s.w + (step * 16 + (lane & 15)) * kCols;
    uint32_t b[kN8][2];
#pragma unroll
    for (int nt = 0; nt + 1 < kN8; nt += 2) {  // two column tiles per ldmatrix.x4
      uint32_t r[4];
      LoadMatrixX4Trans(r, w_rows + nt * 8 + (lane >> 4) * 8);
      b[nt][0] = r[0];
      b[nt][1] = r[1];
      b[nt + 1][0] = r[2];
      b[nt + 1][1] = r[3];
    }
    if constexpr (kN8 % 2 == 1) {
      uint32_t r[2];
      LoadMatrixX2Trans(r, w_rows + (kN8 - 1) * 8);
      b[kN8 - 1][0] = r[0];
      b[kN8 - 1][1] = r[1];
    }
#pragma unroll
    for (int mt = 0; mt < kMaxRowTiles; ++mt) {
      if (mt < row_tiles) {
        uint32_t a[4];
        LoadMatrixX4(a, s.x + (mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kXStride + step * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nt = 0; nt < kN8; ++nt) Mma16816(acc[mt][nt], a, b[nt]);
      }
    }
  }
  __syncthreads();
  // Accumulator layout: rows g and g + 8 (g = lane / 4), columns 2 * (lane % 4) + {0, 1} of each n8 tile.
  float* mine = reinterpret_cast<float*>(s.x) + warp * kMaxRows * kCols;
#pragma unroll
  for (int mt = 0; mt < kMaxRowTiles; ++mt) {
    if (mt < row_tiles) {
#pragma unroll
      for (int nt = 0; nt < kN8; ++nt) {
        const int row = mt * 16 + (lane >> 2), col = nt * 8 + 2 * (lane & 3);
        *reinterpret_cast<float2*>(mine + row * kCols + col) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
        *reinterpret_cast<float2*>(mine + (row + 8) * kCols + col) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
      }
    }
  }
}

// Four halves <-> four floats.
__device__ __forceinline__ float4 LoadHalf4(const __half* p) {
  const uint2 raw = __ldcg(reinterpret_cast<const uint2*>(p));
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ void StoreHalf4(__half* p, float4 v) {
  const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
  uint2 raw;
  raw.x = *reinterpret_cast<const uint32_t*>(&lo);
  raw.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = raw;
}

// Sums the warps' partial tiles and applies the epilogue to the unit's real rows, four columns per thread (one
// 16-byte atomic add where the k slices meet).
template <Epilogue kEpilogue, int kN8>
__device__ void FinishUnit(const Shared& s, const GemmShape& g, int unit, int tokens, const EpilogueArgs& e) {
  constexpr int kCols = kN8 * 8, kQuads = kCols / 4;
  const int tile = unit % g.Tiles(), slice = unit / g.Tiles();
  const float* partials = reinterpret_cast<const float*>(s.x);
  for (int i = threadIdx.x; i < tokens * kQuads; i += kThreads) {
    const int r = i / kQuads, c = (i % kQuads) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 p = *reinterpret_cast<const float4*>(partials + (w * kMaxRows + r) * kCols + c);
      v = make_float4(v.x + p.x, v.y + p.y, v.z + p.z, v.w + p.w);
    }
    const int col = tile * kCols + c;
    const int64_t at = static_cast<int64_t>(r) * g.n + col;
    if (kEpilogue != Epilogue::kAccumulate || slice == 0) {
      const float4 b = LoadHalf4(e.bias + col);
      v = make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w);
    }
    if constexpr (kEpilogue == Epilogue::kAccumulate) {
      if (slice == 0) {
        const float4 x = LoadHalf4(e.residual + at);
        v = make_float4(v.x + x.x, v.y + x.y, v.z + x.z, v.w + x.w);
      }
      atomicAdd(reinterpret_cast<float4*>(e.sums + at), v);
    } else {
      if constexpr (kEpilogue == Epilogue::kBiasGelu) v = make_float4(GeluErf(v.x), GeluErf(v.y), GeluErf(v.z), GeluErf(v.w));
      StoreHalf4(e.out + at, v);
    }
  }
}

// Runs this block's units of g over input [tokens, g.k]. staged_unit: the unit whose weights are in (or on their
// way to) shared memory, -1 for none; on return, the unit of `next` whose weights were issued (the block's first),
// or -1.
template <Epilogue kEpilogue, int kN8>
__device__ void GemmPhase(const Shared& s, const GemmShape& g, const __half* input, int tokens,
                          const EpilogueArgs& e, const GemmShape* next, int& staged_unit, uint32_t& parity) {
  const int slice_k = g.SliceK();
  for (int unit = blockIdx.x; unit < g.Units(); unit += gridDim.x) {
    if (unit != staged_unit) StageWeights(g, unit, s);
    StageActivations(input, g.k, unit / g.Tiles() * slice_k, slice_k, tokens, s.x);
    BERTSERVE_STEP_CLOCK();
    WaitForWeights(s, parity);
    __syncthreads();
    BERTSERVE_STEP_CLOCK();
    MultiplyUnit<kN8>(s, slice_k, RowsPadded(tokens) / 16);
    __syncthreads();
    BERTSERVE_STEP_CLOCK();
    if (unit + static_cast<int>(gridDim.x) >= g.Units() && next != nullptr && blockIdx.x < next->Units()) {
      StageWeights(*next, blockIdx.x, s);  // the last unit's weights are no longer read
    }
    FinishUnit<kEpilogue, kN8>(s, g, unit, tokens, e);
    __syncthreads();
    BERTSERVE_STEP_CLOCK();
    staged_unit = -1;
  }
  staged_unit = -1;
  if (next != nullptr && blockIdx.x < next->Units()) {
    if (static_cast<int>(blockIdx.x) >= g.Units()) StageWeights(*next, blockIdx.x, s);  // no unit of g here
    staged_unit = blockIdx.x;
  }
}

// Attention of query rows q0 .. q0 + 7 of row b, head `head`: the head's keys and values (and those queries) in
// shared memory, one warp per query: lane j scores keys j and j + 32 (rows are at most kMaxRows = 64 tokens),
// a warp softmax, then lane l accumulates head dims 2l, 2l + 1 of P V.
template <int D>
__device__ void AttentionItem(const Params& p, int b, int head, int q0, __half* smem) {
  constexpr int kStride = D + 8;  // halves: the rows lanes read side by side fall on distinct banks
  constexpr int kVectors = D / 8;
  __half* k_s = smem;
  __half* v_s = k_s + kMaxRows * kStride;
  __half* q_s = v_s + kMaxRows * kStride;
  const int hidden = p.hidden, row_stride = 3 * hidden;
  const int begin = p.cu_seqlens[b], len = p.cu_seqlens[b + 1] - begin;
  const int queries = min(kQueriesPerItem, len - q0);
  const __half* head_qkv = p.buffers.qkv + static_cast<int64_t>(begin) * row_stride + head * D;
  for (int i = threadIdx.x; i < len * kVectors; i += kThreads) {
    const int r = i / kVectors, c = (i % kVectors) * 8;
    const __half* src = head_qkv + static_cast<int64_t>(r) * row_stride + c;
    CopyAsync16(k_s + r * kStride + c, src + hidden);
    CopyAsync16(v_s + r * kStride + c, src + 2 * hidden);
    if (r >= q0 && r < q0 + queries) CopyAsync16(q_s + (r - q0) * kStride + c, src);
  }
  CommitCopies();
  WaitForCopies();
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < queries) {
    const uint4* q = reinterpret_cast<const uint4*>(q_s + warp * kStride);
    float score[2];
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const int key = lane + 32 * which;
      score[which] = -INFINITY;
      if (key < len) {
        const uint4* k = reinterpret_cast<const uint4*>(k_s + key * kStride);
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < kVectors; ++i) {
          const uint4 kv = k[i], qv = q[i];
          const __half2* kh = reinterpret_cast<const __half2*>(&kv);
          const __half2* qh = reinterpret_cast<const __half2*>(&qv);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 kf = __half22float2(kh[j]), qf = __half22float2(qh[j]);
            dot = fmaf(kf.x, qf.x, fmaf(kf.y, qf.y, dot));
          }
        }
        score[which] = dot * p.scale_log2;
      }
    }
    const float row_max = WarpMax(fmaxf(score[0], score[1]));  // every row has a real key: finite
    const float weights[2] = {exp2f(score[0] - row_max), exp2f(score[1] - row_max)};  // 0 past len
    const float inv_sum = 1.f / WarpSum(weights[0] + weights[1]);
    float2 o = make_float2(0.f, 0.f);
#pragma unroll 8
    for (int key = 0; key < len; ++key) {
      const float weight = __shfl_sync(0xffffffffu, weights[key >> 5], key & 31);
      if (2 * lane < D) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(v_s + key * kStride + 2 * lane));
        o.x = fmaf(weight, v.x, o.x);
        o.y = fmaf(weight, v.y, o.y);
      }
    }
    if (2 * lane < D) {
      __half* out = p.buffers.context + static_cast<int64_t>(begin + q0 + warp) * hidden + head * D;
      *reinterpret_cast<__half2*>(out + 2 * lane) = __floats2half2_rn(o.x * inv_sum, o.y * inv_sum);
    }
  }
  __syncthreads();  // before the next item restages
}

// Every (row, head, 8 queries) item of the batch; tokens past the real ones get zero context.
template <int D>
__device__ void AttentionPhase(const Params& p, __half* smem) {
  const int chunks = (min(p.max_seqlen, kMaxRows) + kQueriesPerItem - 1) / kQueriesPerItem;
  for (int item = blockIdx.x; item < p.batch * p.heads * chunks; item += gridDim.x) {
    const int chunk = item % chunks, head = item / chunks % p.heads, b = item / (chunks * p.heads);
    if (chunk * kQueriesPerItem < p.cu_seqlens[b + 1] - p.cu_seqlens[b]) {
      AttentionItem<D>(p, b, head, chunk * kQueriesPerItem, smem);
    }
  }
  const int lane = threadIdx.x & 31;
  for (int t = p.cu_seqlens[p.batch] + blockIdx.x * kWarps + (threadIdx.x >> 5); t < p.tokens;
       t += gridDim.x * kWarps) {
    for (int c = 2 * lane; c < p.hidden; c += 64) {
      *reinterpret_cast<__half2*>(p.buffers.context + static_cast<int64_t>(t) * p.hidden + c) = __half2{};
    }
  }
}

// out = LayerNorm(sums) row by row, one warp per row over the whole grid.
__device__ void NormalizeRows(const float* sums, const __half* gamma, const __half* beta, int hidden, float epsilon,
                              int tokens, __half* out) {
  const int lane = threadIdx.x & 31;
  for (int r = blockIdx.x * kWarps + (threadIdx.x >> 5); r < tokens; r += gridDim.x * kWarps) {
    const auto* row = reinterpret_cast<const float2*>(sums + static_cast<int64_t>(r) * hidden);
    float2 v[kRowPairs];
#pragma unroll
    for (int i = 0; i < kRowPairs; ++i) {
      const int q = i * 32 + lane;
      v[i] = 2 * q < hidden ? __ldcg(row + q) : make_float2(0.f, 0.f);
    }
    LayerNormRowInRegisters<__half, kRowPairs>(v, lane, hidden, gamma, beta, epsilon,
                                               out + static_cast<int64_t>(r) * hidden);
  }
}

__device__ void ZeroSums(float* sums, int count) {
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < count / 4; i += gridDim.x * kThreads) {
    reinterpret_cast<float4*>(sums)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

constexpr int kNumLayerVectors = 8;

struct LayerVector {
  const __half* data;  // stacked [L, layer_elements]
  int layer_elements;
};

__device__ LayerVector LayerVectorOf(const Params& p, int i) {
  const int h = p.hidden;
  switch (i) {
    case 0: return {p.qkv_bias, 3 * h};
    case 1: return {p.attention_output_bias, h};
    case 2: return {p.attention_ln_gamma, h};
    case 3: return {p.attention_ln_beta, h};
    case 4: return {p.intermediate_bias, p.intermediate};
    case 5: return {p.output_bias, h};
    case 6: return {p.output_ln_gamma, h};
    default: return {p.output_ln_beta, h};
  }
}

__device__ __forceinline__ void Barrier(cg::grid_group& grid) {
  grid.sync();
#ifdef BERTSERVE_PHASE_CLOCK
  BERTSERVE_PHASE_CLOCK();
#endif
}

// Tile widths: 24 columns for the GEMMs whose k is not split (QKV, FFN), 48 for the k-split ones, whose narrower
// slices need wider tiles to keep each unit's weights at a few dozen KB.
constexpr int kWideN8 = 6, kNarrowN8 = 3;

template <int D>
__global__ void __launch_bounds__(kThreads, 1) SmallBatchEncoderKernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint32_t parity = 0;
  const Shared s{reinterpret_cast<__half*>(smem), reinterpret_cast<__half*>(smem + kXBytes),
                 reinterpret_cast<uint64_t*>(smem + kXBytes + kWBytes)};
  if (threadIdx.x == kWeightIssuer) InitBulkBarrier(s.w_ready);
  __syncthreads();
  cg::grid_group grid = cg::this_grid();
  const int h = p.hidden, inter = p.intermediate, tokens = p.tokens;
  const SmallBatchEncoderBuffers& buf = p.buffers;
  float* attention_sums = buf.sums;
  float* output_sums = buf.sums + static_cast<int64_t>(tokens) * h;
  auto shape = [&](WeightMap m, int l, int n, int k, int slices, int n8) {
    return GemmShape{&p.weight_maps[m], l * k, p.box_rows[m], n, k, slices, n8 * 8};
  };
  auto qkv_shape = [&](int l) { return shape(kQkvMap, l, 3 * h, h, 1, kNarrowN8); };
  auto attention_output_shape = [&](int l) {
    return shape(kAttentionOutputMap, l, h, h, p.attention_output_slices, kWideN8);
  };
  auto intermediate_shape = [&](int l) { return shape(kIntermediateMap, l, inter, h, 1, kNarrowN8); };
  auto output_shape = [&](int l) { return shape(kOutputMap, l, h, inter, p.output_slices, kWideN8); };

  // The weights do not depend on the kernel before (the embedding): stage the first tile, and bring every layer's
  // biases and LayerNorm parameters into L2 (their first reads would otherwise wait on DRAM mid-phase), before
  // waiting for it.
  if (threadIdx.x == 0 && blockIdx.x < kNumLayerVectors) {
    const LayerVector v = LayerVectorOf(p, blockIdx.x);
    PrefetchToL2(v.data, static_cast<uint32_t>(v.layer_elements * p.layers * sizeof(__half)));
  }
  int staged_unit = -1;
  if (blockIdx.x < qkv_shape(0).Units()) {
    StageWeights(qkv_shape(0), blockIdx.x, s);
    staged_unit = blockIdx.x;
  }
  WaitForPrecedingKernels();
#ifdef BERTSERVE_PHASE_CLOCK
  BERTSERVE_PHASE_CLOCK();
#endif
  for (int l = 0; l < p.layers; ++l) {
    if (l > 0) {  // the previous layer's output LayerNorm
      NormalizeRows(output_sums, p.output_ln_gamma + (l - 1) * h, p.output_ln_beta + (l - 1) * h, h, p.epsilon,
                    tokens, buf.x);
      Barrier(grid);
    }
    const __half* x = l == 0 ? p.hidden_io : buf.x;  // this layer's input, the attention residual
    ZeroSums(attention_sums, tokens * h);           // last read by the previous layer's attention LayerNorm
    GemmPhase<Epilogue::kBias, kNarrowN8>(s, qkv_shape(l), x, tokens,
                                          {p.qkv_bias + l * 3 * h, buf.qkv, nullptr, nullptr}, nullptr, staged_unit,
                                          parity);
    Barrier(grid);

    const GemmShape attention_output = attention_output_shape(l);
    if (blockIdx.x < attention_output.Units()) {  // meanwhile, the next GEMM's weights
      StageWeights(attention_output, blockIdx.x, s);
      staged_unit = blockIdx.x;
    }
    ZeroSums(output_sums, tokens * h);  // last read by this layer's first LayerNorm
    BERTSERVE_STEP_CLOCK();
    AttentionPhase<D>(p, s.x);
    BERTSERVE_STEP_CLOCK();
    Barrier(grid);

    const GemmShape intermediate = intermediate_shape(l);
    GemmPhase<Epilogue::kAccumulate, kWideN8>(s, attention_output, buf.context, tokens,
                                              {p.attention_output_bias + l * h, nullptr, x, attention_sums},
                                              &intermediate, staged_unit, parity);
    Barrier(grid);

    NormalizeRows(attention_sums, p.attention_ln_gamma + l * h, p.attention_ln_beta + l * h, h, p.epsilon, tokens,
                  buf.x);
    Barrier(grid);

    const GemmShape output = output_shape(l);
    GemmPhase<Epilogue::kBiasGelu, kNarrowN8>(s, intermediate, buf.x, tokens,
                                              {p.intermediate_bias + l * inter, buf.ffn, nullptr, nullptr}, &output,
                                              staged_unit, parity);
    Barrier(grid);

    const GemmShape next_qkv = qkv_shape(l + 1 < p.layers ? l + 1 : l);
    GemmPhase<Epilogue::kAccumulate, kWideN8>(s, output, buf.ffn, tokens,
                                              {p.output_bias + l * h, nullptr, buf.x, output_sums},
                                              l + 1 < p.layers ? &next_qkv : nullptr, staged_unit, parity);
    Barrier(grid);
  }
  const int last = p.layers - 1;
  NormalizeRows(output_sums, p.output_ln_gamma + last * h, p.output_ln_beta + last * h, h, p.epsilon, tokens,
                p.hidden_io);
}

// k slices for a GEMM of `tiles` column tiles: slices of at most kMaxSliceK (kMaxSliceK / 2 for wide tiles, whose
// weight rows take twice the bytes), a multiple of 16 deep, and as many as keep every unit on a block of its own
// (grid blocks); 0 when no split fits.
int SlicesFor(int64_t tiles, int64_t k, int64_t max_slice_k, int64_t grid) {
  int best = 0;
  for (int s = 1; s <= k / 16; ++s) {
    if (k % s != 0 || (k / s) % 16 != 0 || k / s > max_slice_k) continue;
    if (best == 0 || tiles * s <= grid) best = s;
    if (tiles * s > grid) break;
  }
  return best;
}

constexpr int64_t kWideCols = kWideN8 * 8;

int WideSlicesFor(int64_t n, int64_t k, int64_t grid) { return SlicesFor(n / kWideCols, k, kMaxSliceK / 2, grid); }

// One block per SM when the kernel fits on one (its shared memory allowance raised first), else 0.
template <int D>
int ResidentGrid() {
  ThrowIfFailed(cudaFuncSetAttribute(SmallBatchEncoderKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kSharedBytes),
                "SmallBatchEncoderKernel shared memory");
  int device = 0, sms = 0, per_sm = 0;
  ThrowIfFailed(cudaGetDevice(&device), "cudaGetDevice");
  ThrowIfFailed(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  ThrowIfFailed(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, SmallBatchEncoderKernel<D>, kThreads,
                                                              kSharedBytes),
                "SmallBatchEncoderKernel occupancy");
  return sms * std::min(per_sm, 1);
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

// Rows of one box (at most 256, the TMA's limit) that tile a k slice exactly.
int BoxRows(int slice_k) {
  int boxes = (slice_k + 255) / 256;
  while (slice_k % boxes != 0) ++boxes;
  return slice_k / boxes;
}

// w: [layers * k, n] fp16, row-major; boxes of cols x box_rows.
CUtensorMap WeightTensorMap(const fp16* w, int64_t rows, int64_t n, int cols, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(n), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(n) * sizeof(__half)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status = TensorMapEncoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<fp16*>(w), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    throw std::runtime_error("cuTensorMapEncodeTiled failed (" + std::to_string(status) + ") for a [" +
                             std::to_string(rows) + ", " + std::to_string(n) + "] weight");
  }
  return map;
}

template <int D>
void Launch(const EncoderDims& dims, const EncoderWeights<fp16>& w, Params p, cudaStream_t stream) {
  const int grid = ResidentGrid<D>();
  if (grid == 0) throw std::runtime_error("SmallBatchEncoderKernel does not fit on an SM");
  const int64_t h = dims.hidden, inter = dims.intermediate, layers = dims.num_layers;
  p.attention_output_slices = WideSlicesFor(h, h, grid);
  p.output_slices = WideSlicesFor(h, inter, grid);
  struct MapShape {
    const fp16* w;
    int64_t k, n, slices, cols;
  };
  const MapShape shapes[kNumWeightMaps] = {
      {w.qkv_kernel, h, 3 * h, 1, kNarrowN8 * 8},
      {w.attention_output_kernel, h, h, p.attention_output_slices, kWideCols},
      {w.intermediate_kernel, h, inter, 1, kNarrowN8 * 8},
      {w.output_kernel, inter, h, p.output_slices, kWideCols}};
  for (int m = 0; m < kNumWeightMaps; ++m) {
    const MapShape& shape = shapes[m];
    p.box_rows[m] = BoxRows(static_cast<int>(shape.k / shape.slices));
    p.weight_maps[m] = WeightTensorMap(shape.w, layers * shape.k, shape.n, static_cast<int>(shape.cols),
                                       p.box_rows[m]);
  }
  LaunchAfterPredecessor(Residency::kAllBlocksAtOnce, "SmallBatchEncoderKernel", SmallBatchEncoderKernel<D>, grid,
                         kThreads, kSharedBytes, stream, p);
}

}  // namespace

bool SmallBatchEncoderSupports(const EncoderDims& dims, const PackedBatch& batch) {
  const int64_t h = dims.hidden, head = dims.head_size();
  return batch.num_tokens > 0 && batch.num_tokens <= kSmallBatchMaxTokens && h <= kSmallBatchMaxHidden &&
         h % kWideCols == 0 && dims.intermediate % kWideCols == 0 && (head == 32 || head == 64) &&
         WideSlicesFor(h, dims.intermediate, 1) > 0;
}

void LaunchSmallBatchEncoder(const EncoderDims& dims, const EncoderWeights<fp16>& w, const PackedBatch& batch,
                             __half* hidden, const SmallBatchEncoderBuffers& buffers, cudaStream_t stream) {
  if (!SmallBatchEncoderSupports(dims, batch)) {
    throw std::runtime_error("the small-batch encoder does not take this shape (" +
                             std::to_string(batch.num_tokens) + " tokens, hidden " + std::to_string(dims.hidden) +
                             ")");
  }
  Params p{};
  p.qkv_bias = ToDevice(w.qkv_bias);
  p.attention_output_bias = ToDevice(w.attention_output_bias);
  p.attention_ln_gamma = ToDevice(w.attention_ln_gamma);
  p.attention_ln_beta = ToDevice(w.attention_ln_beta);
  p.intermediate_bias = ToDevice(w.intermediate_bias);
  p.output_bias = ToDevice(w.output_bias);
  p.output_ln_gamma = ToDevice(w.output_ln_gamma);
  p.output_ln_beta = ToDevice(w.output_ln_beta);
  p.layers = static_cast<int>(dims.num_layers);
  p.hidden = static_cast<int>(dims.hidden);
  p.heads = static_cast<int>(dims.num_heads);
  p.intermediate = static_cast<int>(dims.intermediate);
  p.epsilon = dims.layer_norm_epsilon;
  p.scale_log2 = kLog2e / sqrtf(static_cast<float>(dims.head_size()));
  p.cu_seqlens = batch.cu_seqlens_device;
  p.batch = static_cast<int>(batch.batch);
  p.tokens = static_cast<int>(batch.num_tokens);
  p.max_seqlen = static_cast<int>(batch.max_seqlen);
  p.hidden_io = hidden;
  p.buffers = buffers;
  if (dims.head_size() == 64) {
    Launch<64>(dims, w, p, stream);
  } else {
    Launch<32>(dims, w, p, stream);
  }
}

}  // namespace cuda
}  // namespace bertserve
