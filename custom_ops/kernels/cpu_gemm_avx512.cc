// The "avx512" GEMM backend: B packed in panels of kPanel columns, each panel k-major (kPanel contiguous floats per
// row of B, zeros past the last column), so the kernel streams B sequentially; A read in place. Each kernel call
// keeps a kRows x kPanel tile of C in 24 zmm registers over a slice of k (kDepth rows of B, whose panel stays in
// L2 for all of a block's row tiles). While the row tiles run over one panel slice they pull the next one into L2,
// each tile a share: at serving row counts the weights come from DRAM, and on demand the first row tile of every
// panel waited for them (2 threads, 6 layers' GEMMs: 19 rows 125 -> 148 GFLOP/s, 32 rows 154 -> 173, 164 rows
// 197 -> 206 on the AMD EPYC). Compiled for AVX-512F by function attribute, so the library still loads on a CPU
// without it (Supported() says whether this one may be used).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "custom_ops/kernels/cpu_gemm_backend.h"

namespace bertserve {
namespace cpu {
namespace {

#define BERTSERVE_AVX512 __attribute__((target("avx512f")))

constexpr int kVectors = 3;               // zmm registers across a panel
constexpr int64_t kPanel = 16 * kVectors;  // columns per panel
constexpr int kRows = 8;                  // rows of C per kernel call: 8 x 3 accumulators
constexpr int64_t kDepth = 512;           // rows of B per pass over a panel
constexpr int64_t kRowBlock = 160;        // rows of A per pass over the panels of a k-slice
constexpr int64_t kLineBytes = 64;

// Which of a panel's columns exist, per vector: a panel at the end of a block may be narrower than kPanel.
struct PanelMasks {
  __mmask16 vector[kVectors];
  explicit PanelMasks(int64_t width) {
    for (int v = 0; v < kVectors; ++v) {
      const int64_t in_vector = std::min<int64_t>(16, std::max<int64_t>(0, width - 16 * v));
      vector[v] = static_cast<__mmask16>((1u << in_vector) - 1);
    }
  }
};

// Bytes [begin, end) of B that a tile pulls into L2 (prefetcht1) while it runs, `step` bytes (whole cache lines)
// per row of its panel, so that the lines are asked for evenly over the tile's time.
struct Prefetch {
  const char* begin;
  const char* end;
  int64_t step;
};

// c[R, width] (+)= a[R, depth] * panel[depth, width], width as in masks.
template <int R>
BERTSERVE_AVX512 __attribute__((always_inline)) inline void Tile(int64_t depth, const float* a, int64_t lda,
                                                                 const float* panel, float* c, int64_t ldc,
                                                                 bool accumulate, const PanelMasks& masks,
                                                                 Prefetch prefetch) {
  __m512 acc[R][kVectors];
  for (int i = 0; i < R; ++i) {
    for (int v = 0; v < kVectors; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < depth; ++p) {
    __m512 b[kVectors];
    for (int v = 0; v < kVectors; ++v) b[v] = _mm512_load_ps(panel + p * kPanel + v * 16);
    if (prefetch.begin < prefetch.end) {
      for (int64_t line = 0; line < prefetch.step; line += kLineBytes) {
        _mm_prefetch(prefetch.begin + line, _MM_HINT_T1);
      }
      prefetch.begin += prefetch.step;
    }
    for (int i = 0; i < R; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i * lda + p]);
      for (int v = 0; v < kVectors; ++v) acc[i][v] = _mm512_fmadd_ps(ai, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int v = 0; v < kVectors; ++v) {
      const __mmask16 mask = masks.vector[v];
      float* out = c + i * ldc + v * 16;
      __m512 sum = acc[i][v];
      if (accumulate) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask, out));
      _mm512_mask_storeu_ps(out, mask, sum);
    }
  }
}

// Tiles down `rows` rows: kRows at a time, then one tile of the rows left; together they prefetch the
// next_bytes bytes at `next` (the panel slice that comes next), an equal share each.
BERTSERVE_AVX512 void PanelRows(int64_t rows, int64_t depth, const float* a, int64_t lda, const float* panel,
                                float* c, int64_t ldc, bool accumulate, const PanelMasks& masks, const char* next,
                                int64_t next_bytes) {
  const int64_t tiles = (rows + kRows - 1) / kRows;
  const int64_t share = (next_bytes / kLineBytes + tiles - 1) / tiles * kLineBytes;
  const int64_t step = (share / kLineBytes + depth - 1) / depth * kLineBytes;
  const char* const next_end = next + next_bytes;
  auto prefetch = [&](int64_t tile) {
    const char* begin = std::min(next_end, next + tile * share);
    return Prefetch{begin, std::min(next_end, begin + share), step};
  };
  int64_t i = 0;
  for (; i + kRows <= rows; i += kRows) {
    Tile<kRows>(depth, a + i * lda, lda, panel, c + i * ldc, ldc, accumulate, masks, prefetch(i / kRows));
  }
  const Prefetch last = prefetch(i / kRows);
  a += i * lda;
  c += i * ldc;
  switch (rows - i) {
    case 1: Tile<1>(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 2: Tile<2>(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 3: Tile<3>(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 4: Tile<4>(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 5: Tile<5>(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 6: Tile<6>(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 7: Tile<7>(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    default: break;
  }
}

class Avx512Backend : public GemmBackend {
 public:
  const char* name() const override { return "avx512"; }

  bool Supported() const override { return __builtin_cpu_supports("avx512f"); }

  int64_t ColumnAlign() const override { return kPanel; }

  int64_t PackedBytes(int64_t k, int64_t cols) const override {
    return (cols + kPanel - 1) / kPanel * kPanel * k * static_cast<int64_t>(sizeof(float));
  }

  void Pack(int64_t k, int64_t cols, const float* b, int64_t ldb, float* dest) const override {
    for (int64_t j = 0; j < cols; j += kPanel) {
      const int64_t width = std::min(kPanel, cols - j);
      float* panel = dest + j * k;
      for (int64_t p = 0; p < k; ++p) {
        std::memcpy(panel + p * kPanel, b + p * ldb + j, width * sizeof(float));
        std::fill(panel + p * kPanel + width, panel + (p + 1) * kPanel, 0.0f);
      }
    }
  }

  void Multiply(int64_t rows, int64_t cols, int64_t k, const float* a, int64_t lda, const float* packed, float* c,
                int64_t ldc) const override {
    for (int64_t p = 0; p < k; p += kDepth) {
      const int64_t depth = std::min(kDepth, k - p);
      for (int64_t i = 0; i < rows; i += kRowBlock) {
        const int64_t block_rows = std::min(kRowBlock, rows - i);
        for (int64_t j = 0; j < cols; j += kPanel) {
          // The panel slice after this one: the next panel's, else the first panel's next k-slice.
          const float* next = nullptr;
          int64_t next_depth = 0;
          if (j + kPanel < cols) {
            next = packed + (j + kPanel) * k + p * kPanel;
            next_depth = depth;
          } else if (p + kDepth < k) {
            next = packed + (p + kDepth) * kPanel;
            next_depth = std::min(kDepth, k - p - kDepth);
          }
          PanelRows(block_rows, depth, a + i * lda + p, lda, packed + j * k + p * kPanel, c + i * ldc + j, ldc,
                    p > 0, PanelMasks(std::min(kPanel, cols - j)), reinterpret_cast<const char*>(next),
                    next_depth * kPanel * static_cast<int64_t>(sizeof(float)));
        }
      }
    }
  }
};

}  // namespace

const GemmBackend& Avx512GemmBackend() {
  static const Avx512Backend backend;
  return backend;
}

}  // namespace cpu
}  // namespace bertserve
