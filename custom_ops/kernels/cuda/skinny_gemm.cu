// GEMMs with few rows (m <= 32: a batch of one or two short rows), where cuBLASLt's kernels run at a fraction of
// the weight-streaming rate and need a second split-K reduction launch. One block per 16 output columns, its 16
// warps splitting k among themselves: each warp runs mma.sync m16n8k16 over its k16 chunks (fragments loaded
// straight from global memory: the rows of X are few and L2-resident, W is read exactly once), the warps'
// partial sums meet in shared memory, and the epilogue (bias, optionally erf-GELU) writes fp16. One launch per
// GEMM, GELU included, and every SM streams weights.
#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

constexpr int kSkinnyWarps = 16;
constexpr int kColumns = 16;  // per block: two n8 tiles

__device__ __forceinline__ uint32_t LoadPair(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ uint32_t PackPair(__half lo, __half hi) {
  const __half2 h = __halves2half2(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <int kMTiles, bool kGelu>
__global__ void __launch_bounds__(kSkinnyWarps * 32)
    SkinnyGemmKernel(const __half* __restrict__ x, const __half* __restrict__ w, const __half* __restrict__ bias,
                     __half* __restrict__ y, int m, int n, int k) {
  __shared__ float partial[kSkinnyWarps][kMTiles * 16][kColumns + 1];  // +1: rows of a warp's writes differ in bank
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * kColumns;
  float acc[kMTiles][2][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  }
  const int chunks = k / 16;
#pragma unroll 4
  for (int c = warp; c < chunks; c += kSkinnyWarps) {
    const int k0 = c * 16 + 2 * t;
    // A (16x16 of X, row-major): rows g and g+8 of the tile, k pairs k0 and k0+8. Rows past m are zero.
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int r0 = mt * 16 + g, r1 = r0 + 8;
      a[mt][0] = r0 < m ? LoadPair(x + static_cast<int64_t>(r0) * k + k0) : 0u;
      a[mt][1] = r1 < m ? LoadPair(x + static_cast<int64_t>(r1) * k + k0) : 0u;
      a[mt][2] = r0 < m ? LoadPair(x + static_cast<int64_t>(r0) * k + k0 + 8) : 0u;
      a[mt][3] = r1 < m ? LoadPair(x + static_cast<int64_t>(r1) * k + k0 + 8) : 0u;
    }
    // B (16x8 of W, column-major view): column g of the tile, k pairs k0 and k0+8 (two rows of W each).
    uint32_t b[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const __half* col = w + static_cast<int64_t>(k0) * n + n0 + j * 8 + g;
      b[j][0] = PackPair(col[0], col[n]);
      b[j][1] = PackPair(col[8 * static_cast<int64_t>(n)], col[9 * static_cast<int64_t>(n)]);
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) Mma16816(acc[mt][j], a[mt], b[j]);
    }
  }
  // Accumulator layout: [0..1] row g, columns 2t, 2t+1 of the n8 tile; [2..3] row g+8.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      partial[warp][mt * 16 + g][j * 8 + 2 * t] = acc[mt][j][0];
      partial[warp][mt * 16 + g][j * 8 + 2 * t + 1] = acc[mt][j][1];
      partial[warp][mt * 16 + g + 8][j * 8 + 2 * t] = acc[mt][j][2];
      partial[warp][mt * 16 + g + 8][j * 8 + 2 * t + 1] = acc[mt][j][3];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kMTiles * 16 * kColumns; e += blockDim.x) {
    const int r = e / kColumns, col = e % kColumns;
    if (r >= m) continue;
    float sum = __half2float(bias[n0 + col]);
#pragma unroll
    for (int v = 0; v < kSkinnyWarps; ++v) sum += partial[v][r][col];
    if (kGelu) sum = GeluErf(sum);
    y[static_cast<int64_t>(r) * n + n0 + col] = __float2half_rn(sum);
  }
}

template <int kMTiles>
void Launch(const __half* x, const __half* w, const __half* bias, __half* y, int64_t m, int64_t n, int64_t k,
            bool gelu, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(n / kColumns);
  if (gelu) {
    SkinnyGemmKernel<kMTiles, true><<<blocks, kSkinnyWarps * 32, 0, stream>>>(x, w, bias, y, m, n, k);
  } else {
    SkinnyGemmKernel<kMTiles, false><<<blocks, kSkinnyWarps * 32, 0, stream>>>(x, w, bias, y, m, n, k);
  }
  CheckLaunch("SkinnyGemmKernel");
}

}  // namespace

bool LaunchSkinnyGemm(const __half* x, const __half* w, const __half* bias, __half* y, int64_t m, int64_t n,
                      int64_t k, bool gelu, cudaStream_t stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 4 == 0;
  if (m == 0 || m > kSkinnyMaxRows || n % kColumns != 0 || k % 16 != 0 || bias == nullptr || !aligned) return false;
  if (m <= 16) {
    Launch<1>(x, w, bias, y, m, n, k, gelu, stream);
  } else {
    Launch<2>(x, w, bias, y, m, n, k, gelu, stream);
  }
  return true;
}

}  // namespace cuda
}  // namespace bertserve
