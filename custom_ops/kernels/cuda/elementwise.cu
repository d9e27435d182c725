// Memory-bound kernels of the CUDA core: the row kernels (one warp per row, pairs of elements (half2 / float2) per
// access, fp32 statistics), bias + GELU, and the staging of inputs. See kernels.h for the contracts.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * 32;

// The grid-stride kernels (staging, bias + GELU) launch at most a few blocks per SM of the H200 and loop over the
// rest; on another GPU the loops cover what the grid does not.
constexpr int64_t kH200Sms = 132;

// A row kernel's row is held by kRowThreads threads: one warp, or (kRowThreads = kThreads) the whole block. A warp
// per row walks a 768-wide row in 12 pairs a lane, and a kernel over a few rows then runs on a few SMs, each lane's
// dozens of loads in flight at once through one SM; at up to 128 rows the block per row spreads the same loads over
// 4x the SMs, 3 pairs a thread (DispatchRows). A block per row also issues all of a row's loads, gamma and beta
// included, before its sums (one L2 round trip); a warp per row leaves their order to ptxas, gamma and beta after
// the sums (commit ff9ae5b).
template <int kRowThreads>
struct RowSplit {
  static_assert(kRowThreads == 32 || kRowThreads == kThreads, "a warp or the whole block per row");
  static constexpr bool kBlockPerRow = kRowThreads == kThreads;
  static constexpr int kRowsPerBlock = kThreads / kRowThreads;
  __device__ static int RowInBlock() { return threadIdx.x / kRowThreads; }
  __device__ static int Row() { return blockIdx.x * kRowsPerBlock + RowInBlock(); }
  __device__ static int Lane() { return threadIdx.x % kRowThreads; }
};

// Pair i of a thread's kPairs (columns 2q, 2q + 1 with q = i * kRowThreads + lane), clamped into the row: the row
// kernels load every pair unconditionally, so that all of a thread's loads are in flight at once. Behind a branch
// per pair, each pair's loads and sums waited for the pair before (one L2 round trip per pair, 12 at hidden 768).
template <int kRowThreads>
__device__ __forceinline__ int PairInRow(int i, int lane, int width) {
  return min(i * kRowThreads + lane, width / 2 - 1);
}

// The clamped pairs' values are duplicates: zero, so that the statistics see each column once.
template <int kRowThreads, int kPairs>
__device__ __forceinline__ void ZeroPairsPastWidth(float2 (&v)[kPairs], int lane, int width) {
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    if (2 * (i * kRowThreads + lane) >= width) v[i] = make_float2(0.f, 0.f);
  }
}

// The sum of v over the kRowThreads threads of a row; `scratch` (kThreads / 32 floats of shared memory) is used
// once, so two sums in a row take two scratch arrays and no barrier between them.
template <int kRowThreads>
__device__ __forceinline__ float RowSum(float v, float* scratch) {
  v = WarpSum(v);
  if constexpr (!RowSplit<kRowThreads>::kBlockPerRow) {
    return v;
  } else {
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kRowThreads / 32; ++w) total += scratch[w];
    return total;
  }
}

// A row's gamma and beta pairs, loaded unconverted, unconditionally (clamped pairs), so that their loads are in
// flight together: behind a branch per pair, or converted to float at once, the compiler issued them one pair at a
// time (commit b392a21).
template <typename T, int kRowThreads, int kPairs>
struct RowAffine {
  typename Vec2<T>::type gamma[kPairs], beta[kPairs];

  __device__ __forceinline__ void Load(const T* g, const T* b, int lane, int width) {
    const auto* g2 = reinterpret_cast<const typename Vec2<T>::type*>(g);
    const auto* b2 = reinterpret_cast<const typename Vec2<T>::type*>(b);
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const int q = PairInRow<kRowThreads>(i, lane, width);
      gamma[i] = g2[q];
      beta[i] = b2[q];
    }
  }
};

// LayerNorm of one row held as kPairs float2 per thread (pair i of lane l is columns 2*(i*kRowThreads+l), +1);
// columns past `width` are zero and excluded. Two passes over registers: mean, then centred variance.
template <typename T, int kRowThreads, int kPairs>
__device__ __forceinline__ void LayerNormRowInRegisters(float2 (&v)[kPairs], int lane, int width,
                                                        const RowAffine<T, kRowThreads, kPairs>& affine,
                                                        float epsilon, T* out) {
  using V = Vec2<T>;
  __shared__ float sums[2][kThreads / 32];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) sum += v[i].x + v[i].y;
  const float mean = RowSum<kRowThreads>(sum, sums[0]) / width;
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int c = 2 * (i * kRowThreads + lane);
    if (c < width) {
      const float dx = v[i].x - mean, dy = v[i].y - mean;
      sq += dx * dx + dy * dy;
    }
  }
  const float rstd = rsqrtf(RowSum<kRowThreads>(sq, sums[1]) / width + epsilon);
  auto* o2 = reinterpret_cast<typename V::type*>(out);
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int p = i * kRowThreads + lane;
    if (2 * p < width) {
      const float2 gi = V::ToFloat2(affine.gamma[i]), bi = V::ToFloat2(affine.beta[i]);
      o2[p] = V::FromFloat2(make_float2((v[i].x - mean) * rstd * gi.x + bi.x, (v[i].y - mean) * rstd * gi.y + bi.y));
    }
  }
}

// Lane v of block 0 asks L2 for vector v of `vectors` (L2Prefetch): one bulk prefetch each, not waited for.
__device__ __forceinline__ void PrefetchToL2(const L2Prefetch& vectors) {
  if (blockIdx.x == 0 && threadIdx.x < L2Prefetch::kVectors && vectors.ptr[threadIdx.x] != nullptr) {
    PrefetchRangeToL2(vectors.ptr[threadIdx.x], static_cast<uint64_t>(vectors.bytes[threadIdx.x]));
  }
}

// Block (b, j) embeds positions j * kRowsPerBlock .. of sequence b, one per kRowThreads threads: the grid is the
// padded batch, so a position finds its ids at [b, p] and its packed row (PackedRowOf) with no search, and
// every lookup is one L2 round trip, all in flight together (a grid over the packed tokens had to search
// cu_seqlens for each token's sequence first: log2(batch) dependent loads). Padding positions load and return.
template <typename T, int kRowThreads, int kPairs>
__global__ void __launch_bounds__(kThreads) EmbeddingLayerNormKernel(
    const T* __restrict__ word, const T* __restrict__ position, const T* __restrict__ token_type,
    const T* __restrict__ gamma, const T* __restrict__ beta, int vocab_size, int type_vocab_size,
    const int32_t* __restrict__ input_ids, const int32_t* __restrict__ segment_ids, int seq,
    const int32_t* __restrict__ cu_seqlens, int width, float epsilon, T* __restrict__ out) {
  JoinLaunchChain();
  using V = Vec2<T>;
  using Split = RowSplit<kRowThreads>;
  const int lane = Split::Lane();
  const int b = blockIdx.x;
  const int p = blockIdx.y * Split::kRowsPerBlock + Split::RowInBlock();
  if (p >= seq) return;
  // gamma and beta as RowSplit says: a block per row loads them with the ids, a warp per row after its sums
  // (loaded first there, a few-row batch was slower; commit 8eb9b9e).
  RowAffine<T, kRowThreads, kPairs> affine;
  if constexpr (Split::kBlockPerRow) affine.Load(gamma, beta, lane, width);
  const int t = PackedRowOf(cu_seqlens, b, p);
  const int64_t at = static_cast<int64_t>(b) * seq + p;
  const int id = min(max(input_ids[at], 0), vocab_size - 1);
  const int segment = min(max(segment_ids[at], 0), type_vocab_size - 1);
  const auto* w2 = reinterpret_cast<const typename V::type*>(word + static_cast<int64_t>(id) * width);
  const auto* p2 = reinterpret_cast<const typename V::type*>(position + static_cast<int64_t>(p) * width);
  const auto* s2 = reinterpret_cast<const typename V::type*>(token_type + static_cast<int64_t>(segment) * width);
  float2 v[kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int q = PairInRow<kRowThreads>(i, lane, width);
    const float2 a = V::ToFloat2(w2[q]), c = V::ToFloat2(p2[q]), d = V::ToFloat2(s2[q]);
    v[i] = make_float2(a.x + c.x + d.x, a.y + c.y + d.y);
  }
  if (t < 0) return;  // a padding position: the same for all of a row's threads
  if constexpr (!Split::kBlockPerRow) affine.Load(gamma, beta, lane, width);
  ZeroPairsPastWidth<kRowThreads>(v, lane, width);
  LayerNormRowInRegisters<T, kRowThreads, kPairs>(v, lane, width, affine, epsilon,
                                                  out + static_cast<int64_t>(t) * width);
}

// x is kParts [num_tokens, width] blocks part_stride elements apart, summed in fp32: the GEMM output (TX = T, one
// part) or a k split's fp32 partial products (GemmKSplit).
template <typename T, int kRowThreads, int kPairs, typename TX, int kParts>
__global__ void __launch_bounds__(kThreads)
    ResidualLayerNormKernel(const TX* __restrict__ x, int64_t part_stride, const T* __restrict__ bias,
                            const T* __restrict__ gamma, const T* __restrict__ beta, int num_tokens, int width,
                            float epsilon, T* __restrict__ hidden,
                            const int32_t* __restrict__ zero_rows_without_tokens, const L2Prefetch next) {
  PrefetchToL2(next);
  JoinLaunchChain();
  using V = Vec2<T>;
  using VX = Vec2<TX>;
  using Split = RowSplit<kRowThreads>;
  const int lane = Split::Lane();
  const int t = Split::Row();
  if (t >= num_tokens) return;
  if (zero_rows_without_tokens != nullptr && zero_rows_without_tokens[t + 1] == zero_rows_without_tokens[t]) {
    for (int c = lane; c < width; c += kRowThreads) hidden[static_cast<int64_t>(t) * width + c] = FromFloat<T>(0.f);
    return;
  }
  const auto* x2 = reinterpret_cast<const typename VX::type*>(x + static_cast<int64_t>(t) * width);
  const auto* h2 = reinterpret_cast<const typename V::type*>(hidden + static_cast<int64_t>(t) * width);
  const auto* bias2 = reinterpret_cast<const typename V::type*>(bias);
  // x's parts + bias + residual of one pair, in fp32.
  const auto sum_inputs = [](const typename VX::type (&parts)[kParts], typename V::type b2, typename V::type r2) {
    float2 a = VX::ToFloat2(parts[0]);
#pragma unroll
    for (int s = 1; s < kParts; ++s) {
      const float2 part = VX::ToFloat2(parts[s]);
      a = make_float2(a.x + part.x, a.y + part.y);
    }
    const float2 b = V::ToFloat2(b2), r = V::ToFloat2(r2);
    return make_float2(a.x + b.x + r.x, a.y + b.y + r.y);
  };
  float2 v[kPairs];
  RowAffine<T, kRowThreads, kPairs> affine;
  if constexpr (!Split::kBlockPerRow) {
    // A warp per row: ptxas interleaves each pair's loads with the sums before them, and gamma and beta come
    // after; all of a lane's loads in one burst made batch 1 slower (commit 8eb9b9e).
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const int q = PairInRow<kRowThreads>(i, lane, width);
      typename VX::type parts[kParts];
#pragma unroll
      for (int s = 0; s < kParts; ++s) parts[s] = x2[s * part_stride / 2 + q];
      v[i] = sum_inputs(parts, bias2[q], h2[q]);
    }
    affine.Load(gamma, beta, lane, width);
  } else {
    // A block per row: gamma, beta and every input of the row first, then a barrier that keeps ptxas from sinking
    // the loads into the sums, so that they make one L2 round trip (commit ff9ae5b).
    affine.Load(gamma, beta, lane, width);
    typename VX::type parts[kPairs][kParts];
    typename V::type bias_pairs[kPairs], residual[kPairs];
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const int q = PairInRow<kRowThreads>(i, lane, width);
#pragma unroll
      for (int s = 0; s < kParts; ++s) parts[i][s] = x2[s * part_stride / 2 + q];
      bias_pairs[i] = bias2[q];
      residual[i] = h2[q];
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kPairs; ++i) v[i] = sum_inputs(parts[i], bias_pairs[i], residual[i]);
  }
  ZeroPairsPastWidth<kRowThreads>(v, lane, width);
  LayerNormRowInRegisters<T, kRowThreads, kPairs>(v, lane, width, affine, epsilon,
                                                  hidden + static_cast<int64_t>(t) * width);
}

// Rows of up to kBlockPerRowMaxRows (about one per SM) get a block each: a warp per row would leave most SMs idle;
// above, where a warp per row fills the SMs, a block per row was slower (commit ff9ae5b).
constexpr int64_t kBlockPerRowMaxRows = 128;

// A warp per row takes hidden sizes up to 768 (12 pairs a lane); wider rows take a block per row (8 pairs a thread
// at kMaxLayerNormHidden).
template <int kRowThreads>
constexpr int kMaxPairsPerThread = RowSplit<kRowThreads>::kBlockPerRow ? kMaxLayerNormHidden / (2 * kRowThreads) : 12;

// Launches the kernel of kPairs pairs a thread if that holds `pairs`.
template <int kRowThreads, int kPairs, typename Launch>
bool LaunchIfPairsFit(int64_t pairs, unsigned blocks, const Launch& launch) {
  if constexpr (kPairs > kMaxPairsPerThread<kRowThreads>) {
    return false;
  } else {
    if (pairs > kPairs) return false;
    launch.template operator()<kRowThreads, kPairs>(blocks);
    return true;
  }
}

// Launches the kernel of kRowThreads threads a row with the fewest pairs a thread that hold `width` columns, if any.
template <int kRowThreads, typename Launch>
bool LaunchWithRowThreads(int64_t rows, int64_t width, const Launch& launch) {
  const unsigned blocks = static_cast<unsigned>(CeilDiv(rows, RowSplit<kRowThreads>::kRowsPerBlock));
  const int64_t pairs = CeilDiv(CeilDiv(width, 2), kRowThreads);
  return [&]<int... kPairs>(std::integer_sequence<int, kPairs...>) {
    return (LaunchIfPairsFit<kRowThreads, kPairs>(pairs, blocks, launch) || ...);
  }(std::integer_sequence<int, 1, 2, 3, 4, 6, 8, 12>{});
}

// Calls launch.template operator()<kRowThreads, kPairs>(blocks): a warp per row for many rows of up to 768
// columns, else a block per row (up to kMaxLayerNormHidden columns, which CheckWidth enforces).
template <typename Launch>
void DispatchRows(int64_t rows, int64_t width, const Launch& launch) {
  if (rows > kBlockPerRowMaxRows && LaunchWithRowThreads<32>(rows, width, launch)) return;
  if (!LaunchWithRowThreads<kThreads>(rows, width, launch)) {
    throw std::runtime_error("hidden size " + std::to_string(width) + " exceeds the CUDA LayerNorm limit " +
                             std::to_string(kMaxLayerNormHidden));
  }
}

void CheckWidth(int64_t width) {
  if (width <= 0 || width % 2 != 0 || width > kMaxLayerNormHidden) {
    throw std::runtime_error("the CUDA core needs an even hidden size in 2.." + std::to_string(kMaxLayerNormHidden) +
                             ", got " + std::to_string(width));
  }
}

// 16 bytes per thread per access (8 halves or 4 floats), kUnroll independent accesses in flight per thread, the
// bias added in fp32 before GELU (one rounding of the result). Unless `vectorized` (rows made of whole 16-byte
// vectors, both pointers 16-byte aligned; intermediate sizes are multiples of 8 in practice), element by element.
template <typename T>
__global__ void BiasGeluKernel(T* __restrict__ x, const T* __restrict__ bias, int64_t count, int width,
                               bool vectorized) {
  JoinLaunchChain();
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kUnroll = 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (!vectorized) {
    for (int64_t i = first; i < count; i += stride) {
      x[i] = FromFloat<T>(GeluErf(ToFloat(x[i]) + ToFloat(bias[i % width])));
    }
    return;
  }
  const int64_t vectors = count / kVec;
  uint4* v4 = reinterpret_cast<uint4*>(x);
  const uint4* b4 = reinterpret_cast<const uint4*>(bias);
  const int vectors_per_row = width / kVec;
  for (int64_t base = first; base < vectors; base += kUnroll * stride) {
    uint4 raw[kUnroll], raw_bias[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < vectors) {
        raw[u] = v4[i];
        raw_bias[u] = b4[i % vectors_per_row];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < vectors) {
        T* v = reinterpret_cast<T*>(&raw[u]);
        const T* b = reinterpret_cast<const T*>(&raw_bias[u]);
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[e] = FromFloat<T>(GeluErf(ToFloat(v[e]) + ToFloat(b[e])));
        v4[i] = raw[u];
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) GatherFirstTokenKernel(const T* __restrict__ packed, int width,
                                                                   const int32_t* __restrict__ cu_seqlens, int batch,
                                                                   T* __restrict__ first) {
  JoinLaunchChain();
  const int lane = threadIdx.x & 31;
  const int b = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (b >= batch) return;
  const int t = PackedRowOf(cu_seqlens, b, 0);  // -1 for a row without tokens
  const T* src = packed + static_cast<int64_t>(t) * width;  // read only where t >= 0
  T* dst = first + static_cast<int64_t>(b) * width;
  for (int c = lane; c < width; c += 32) dst[c] = t >= 0 ? src[c] : FromFloat<T>(0.f);
}

// A warp per padded position (b, p), as the rebuild below: its packed row is PackedRowOf(b, p), no search.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RemovePaddingKernel(const T* __restrict__ padded, int seq, int width, const int32_t* __restrict__ cu_seqlens,
                        int batch, T* __restrict__ packed) {
  JoinLaunchChain();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);  // b * seq + p
  if (row >= static_cast<int64_t>(batch) * seq) return;  // batch * seq may exceed int
  const int t = PackedRowOf(cu_seqlens, static_cast<int>(row / seq), static_cast<int>(row % seq));
  if (t < 0) return;
  const T* src = padded + static_cast<int64_t>(row) * width;
  T* dst = packed + static_cast<int64_t>(t) * width;
  for (int c = lane; c < width; c += 32) dst[c] = src[c];
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RebuildPaddingKernel(const T* __restrict__ packed, int seq, int width, const int32_t* __restrict__ cu_seqlens,
                         int batch, T* __restrict__ padded) {
  JoinLaunchChain();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);  // b * seq + p
  if (row >= static_cast<int64_t>(batch) * seq) return;  // batch * seq may exceed int
  const int t = PackedRowOf(cu_seqlens, static_cast<int>(row / seq), static_cast<int>(row % seq));
  const T* src = packed + static_cast<int64_t>(t) * width;  // read only where t >= 0
  T* dst = padded + static_cast<int64_t>(row) * width;
  for (int c = lane; c < width; c += 32) dst[c] = t >= 0 ? src[c] : FromFloat<T>(0.f);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RankerHeadKernel(const float* __restrict__ pooled, const T* __restrict__ pooler_bias,
                     const T* __restrict__ classifier_kernel, const T* __restrict__ classifier_bias, int width,
                     int num_labels, float* __restrict__ scores) {
  JoinLaunchChain();
  // One block per row: a warp per row walked the row 32 loads at a time, latency-bound.
  __shared__ float partial[2][kWarpsPerBlock];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.x;
  const float* row = pooled + static_cast<int64_t>(b) * width;
  float logit0 = 0.f, logit1 = 0.f;
  // kChunk columns per thread loaded before any is used, from column min(c, width - 1) (no branch between the
  // loads, so they are in flight together; as in the LayerNorm kernels).
  constexpr int kChunk = 4;
  for (int base = threadIdx.x; base < width; base += kChunk * kThreads) {
    float pooled_c[kChunk], bias_c[kChunk], w0[kChunk], w1[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int c = min(base + j * kThreads, width - 1);
      pooled_c[j] = row[c];
      bias_c[j] = ToFloat(pooler_bias[c]);
      w0[j] = ToFloat(classifier_kernel[c * num_labels]);
      w1[j] = ToFloat(classifier_kernel[c * num_labels + num_labels - 1]);
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (base + j * kThreads < width) {
        const float p = tanhf(pooled_c[j] + bias_c[j]);
        logit0 += p * w0[j];
        logit1 += p * w1[j];  // label 1's weight with two labels; unused with one
      }
    }
  }
  logit0 = WarpSum(logit0);
  logit1 = WarpSum(logit1);
  if (lane == 0) {
    partial[0][warp] = logit0;
    partial[1][warp] = logit1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    logit0 = ToFloat(classifier_bias[0]);
    logit1 = ToFloat(classifier_bias[num_labels - 1]);
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      logit0 += partial[0][w];
      logit1 += partial[1][w];
    }
    scores[b] = RankerScore(logit0, logit1, num_labels);
  }
}

unsigned WarpBlocks(int64_t rows) {
  const int64_t blocks = CeilDiv(rows, kWarpsPerBlock);
  if (blocks > kMaxGridX) throw std::runtime_error(std::to_string(rows) + " rows exceed one launch's grid");
  return static_cast<unsigned>(blocks);
}

}  // namespace

template <typename T>
void LaunchEmbeddingLayerNorm(const T* word, const T* position, const T* token_type, const T* gamma, const T* beta,
                              int64_t vocab_size, int64_t type_vocab_size, const int32_t* input_ids,
                              const int32_t* segment_ids, int64_t seq, const int32_t* cu_seqlens, int64_t batch,
                              int64_t num_tokens, int64_t hidden, float epsilon, T* out, cudaStream_t stream) {
  CheckWidth(hidden);
  if (num_tokens == 0 || batch == 0 || seq == 0) return;
  // A warp or a block per row as for num_tokens rows, over the padded batch's positions.
  DispatchRows(num_tokens, hidden, [&]<int kRowThreads, int kPairs>(unsigned) {
    const int64_t position_blocks = CeilDiv(seq, RowSplit<kRowThreads>::kRowsPerBlock);
    if (batch > kMaxGridX || position_blocks > kMaxGridYZ) {
      throw std::runtime_error("the CUDA embedding's grid cannot hold " + std::to_string(batch) + " rows of " +
                               std::to_string(seq) + " positions");
    }
    const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(position_blocks));
    LaunchAfterPredecessor("EmbeddingLayerNormKernel", EmbeddingLayerNormKernel<T, kRowThreads, kPairs>, grid,
                           kThreads, 0, stream, word, position, token_type, gamma, beta, vocab_size, type_vocab_size,
                           input_ids, segment_ids, seq, cu_seqlens, hidden, epsilon, out);
  });
}

namespace {

template <typename T, typename TX, int kParts>
void LaunchResidualLayerNormOfParts(const TX* x, int64_t part_stride, const T* bias, const T* gamma, const T* beta,
                                    int64_t rows, int64_t width, float epsilon, T* hidden, cudaStream_t stream,
                                    const int32_t* zero_rows_without_tokens, const L2Prefetch& next) {
  CheckWidth(width);
  if (rows == 0) return;
  DispatchRows(rows, width, [&]<int kRowThreads, int kPairs>(unsigned blocks) {
    LaunchAfterPredecessor("ResidualLayerNormKernel", ResidualLayerNormKernel<T, kRowThreads, kPairs, TX, kParts>,
                           blocks, kThreads, 0, stream, x, part_stride, bias, gamma, beta, rows, width,
                           epsilon, hidden, zero_rows_without_tokens, next);
  });
}

}  // namespace

template <typename T>
void LaunchResidualLayerNorm(const T* x, const T* bias, const T* gamma, const T* beta, int64_t rows, int64_t width,
                             float epsilon, T* hidden, cudaStream_t stream, const int32_t* zero_rows_without_tokens,
                             const L2Prefetch& next) {
  LaunchResidualLayerNormOfParts<T, T, 1>(x, 0, bias, gamma, beta, rows, width, epsilon, hidden, stream,
                                          zero_rows_without_tokens, next);
}

template <typename T>
void LaunchPartialsResidualLayerNorm(const float* partials, int parts, const T* bias, const T* gamma, const T* beta,
                                     int64_t rows, int64_t width, float epsilon, T* hidden, cudaStream_t stream,
                                     const int32_t* zero_rows_without_tokens, const L2Prefetch& next) {
  // One kernel per part count 1..kMaxKSplits; the one for `parts` is launched.
  const bool launched = [&]<int... kIndex>(std::integer_sequence<int, kIndex...>) {
    return ((parts == kIndex + 1 &&
             (LaunchResidualLayerNormOfParts<T, float, kIndex + 1>(partials, rows * width, bias, gamma, beta, rows,
                                                                  width, epsilon, hidden, stream,
                                                                  zero_rows_without_tokens, next),
              true)) ||
            ...);
  }(std::make_integer_sequence<int, kMaxKSplits>{});
  if (!launched) throw std::runtime_error("no LayerNorm kernel sums " + std::to_string(parts) + " partial products");
}

namespace {

__global__ void SpinKernel(int64_t cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Host indices travel in the kernel's parameters (4 KB a launch), so no pageable host-to-device copy is needed.
struct HostIndices {
  int32_t values[kStageIndicesPerLaunch];
  int32_t count;
};

// dst words [0, copy_words) from src, [copy_words, total_words) zero; indices_dst[0, count) from the parameters.
__global__ void StageKernel(const uint32_t* __restrict__ src, int64_t copy_words, int64_t total_words,
                            uint32_t* __restrict__ dst, HostIndices indices, int32_t* __restrict__ indices_dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < indices.count; i += stride) indices_dst[i] = indices.values[i];
  for (int64_t i = first; i < total_words; i += stride) dst[i] = i < copy_words ? src[i] : 0u;
}

}  // namespace

void LaunchStage(const void* src, int64_t copy_bytes, int64_t total_bytes, void* dst, const int32_t* host_indices,
                 int64_t count, int32_t* indices, cudaStream_t stream) {
  if (copy_bytes % 4 != 0 || total_bytes % 4 != 0 || copy_bytes > total_bytes) {
    throw std::runtime_error("staging copies whole 4-byte words, got " + std::to_string(copy_bytes) + " of " +
                             std::to_string(total_bytes) + " bytes");
  }
  int64_t done = 0;
  do {
    HostIndices chunk{};
    chunk.count = static_cast<int32_t>(std::min<int64_t>(count - done, kStageIndicesPerLaunch));
    std::copy(host_indices + done, host_indices + done + chunk.count, chunk.values);
    const int64_t words = done == 0 ? total_bytes / 4 : 0;  // the first launch also copies the words
    const int64_t work = std::max<int64_t>(words, chunk.count);
    const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(work, 256 * 4), 1, kH200Sms * 4));
    StageKernel<<<blocks, 256, 0, stream>>>(static_cast<const uint32_t*>(src), done == 0 ? copy_bytes / 4 : 0, words,
                                            static_cast<uint32_t*>(dst), chunk, indices + done);
    CheckLaunch("StageKernel");
    done += chunk.count;
  } while (done < count);
}

void LaunchSpin(int64_t cycles, cudaStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(cycles);
  CheckLaunch("SpinKernel");
}

template <typename T>
void LaunchBiasGelu(T* x, const T* bias, int64_t rows, int64_t width, cudaStream_t stream) {
  const int64_t count = rows * width;
  if (count == 0) return;
  const int64_t vectors = std::max<int64_t>(1, count / (16 / sizeof(T)));
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(CeilDiv(vectors, 256), kH200Sms * 8));
  const bool vectorized = width % (16 / sizeof(T)) == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                          reinterpret_cast<uintptr_t>(bias) % 16 == 0;
  LaunchAfterPredecessor("BiasGeluKernel", BiasGeluKernel<T>, blocks, 256, 0, stream, x, bias, count,
                         static_cast<int>(width), vectorized);
}

template <typename T>
void LaunchGatherFirstToken(const T* packed, int64_t hidden, const int32_t* cu_seqlens, int64_t batch, T* first,
                            cudaStream_t stream) {
  if (batch == 0) return;
  LaunchAfterPredecessor("GatherFirstTokenKernel", GatherFirstTokenKernel<T>, WarpBlocks(batch), kThreads, 0, stream,
                         packed, hidden, cu_seqlens, batch, first);
}

template <typename T>
void LaunchRemovePadding(const T* padded, int64_t seq, int64_t hidden, const int32_t* cu_seqlens, int64_t batch,
                         int64_t num_tokens, T* packed, cudaStream_t stream) {
  if (num_tokens == 0) return;
  LaunchAfterPredecessor("RemovePaddingKernel", RemovePaddingKernel<T>, WarpBlocks(batch * seq), kThreads, 0, stream,
                         padded, seq, hidden, cu_seqlens, batch, packed);
}

template <typename T>
void LaunchRebuildPadding(const T* packed, int64_t seq, int64_t hidden, const int32_t* cu_seqlens, int64_t batch,
                          T* padded, cudaStream_t stream) {
  if (batch * seq == 0) return;
  LaunchAfterPredecessor("RebuildPaddingKernel", RebuildPaddingKernel<T>, WarpBlocks(batch * seq), kThreads, 0, stream,
                         packed, seq, hidden, cu_seqlens, batch, padded);
}

template <typename T>
void LaunchRankerHead(const float* pooled, const T* pooler_bias, const T* classifier_kernel,
                      const T* classifier_bias, int64_t batch, int64_t hidden, int64_t num_labels, float* scores,
                      cudaStream_t stream) {
  if (batch == 0) return;
  LaunchAfterPredecessor("RankerHeadKernel", RankerHeadKernel<T>, static_cast<unsigned>(batch), kThreads, 0, stream,
                         pooled, pooler_bias, classifier_kernel, classifier_bias, hidden, num_labels, scores);
}

#define BERTSERVE_INSTANTIATE_ELEMENTWISE(T)                                                                       \
  template void LaunchEmbeddingLayerNorm<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t,     \
                                            const int32_t*, const int32_t*, int64_t, const int32_t*, int64_t,       \
                                            int64_t, int64_t, float, T*, cudaStream_t);                             \
  template void LaunchResidualLayerNorm<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, float, T*,      \
                                           cudaStream_t, const int32_t*, const L2Prefetch&);                        \
  template void LaunchBiasGelu<T>(T*, const T*, int64_t, int64_t, cudaStream_t);                                    \
  template void LaunchGatherFirstToken<T>(const T*, int64_t, const int32_t*, int64_t, T*, cudaStream_t);            \
  template void LaunchRemovePadding<T>(const T*, int64_t, int64_t, const int32_t*, int64_t, int64_t, T*,            \
                                       cudaStream_t);                                                               \
  template void LaunchRebuildPadding<T>(const T*, int64_t, int64_t, const int32_t*, int64_t, T*, cudaStream_t);     \
  template void LaunchRankerHead<T>(const float*, const T*, const T*, const T*, int64_t, int64_t, int64_t, float*,   \
                                    cudaStream_t);

BERTSERVE_INSTANTIATE_ELEMENTWISE(__half)
BERTSERVE_INSTANTIATE_ELEMENTWISE(float)
template void LaunchPartialsResidualLayerNorm<__half>(const float*, int, const __half*, const __half*, const __half*,
                                                      int64_t, int64_t, float, __half*, cudaStream_t, const int32_t*,
                                                      const L2Prefetch&);

}  // namespace cuda
}  // namespace bertserve
