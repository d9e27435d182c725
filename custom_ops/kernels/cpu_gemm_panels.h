// The loop nest the AVX-512 GEMM backends share (cpu_gemm_avx512.cc on floats, cpu_gemm_bf16.cc on pairs of
// bfloat16): B packed in panels of kPanel columns, each panel "unit-major" (kPanel contiguous 4-byte elements per
// unit of depth: one row of B for floats, two rows for bf16 pairs), so the kernel streams B sequentially; A read
// in place, one 4-byte element per unit. Each Tile call keeps a kRows x kPanel tile of C in 24 zmm registers over
// a slice of units whose panel stays in L2 for all of a block's row tiles. While the row tiles run over one panel
// slice they pull the next one into L2, each tile a share: at serving row counts the weights come from DRAM, and
// on demand the first row tile of every panel waited for them.
//
// Templates without a target attribute of their own: each backend includes this header inside its
// `#pragma GCC target` region, so that its Tile inlines into them. PackedBytes alone is compiled for the command
// line's target: the backends call it from code that runs on any CPU.
#ifndef BERTSERVE_KERNELS_CPU_GEMM_PANELS_H_
#define BERTSERVE_KERNELS_CPU_GEMM_PANELS_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace bertserve {
namespace cpu {
namespace panels {

constexpr int kVectors = 3;               // zmm registers across a panel
constexpr int64_t kPanel = 16 * kVectors;  // columns per panel
constexpr int kRows = 8;                  // rows of C per Tile call: 8 x 3 accumulators
constexpr int64_t kRowBlock = 160;        // rows of A per pass over the panels of a slice
constexpr int64_t kLineBytes = 64;
constexpr int64_t kDepth = 512;           // rows of B per pass over a panel (a slice)

// Bytes of B packed in panels of `units` units of depth (a unit of type Unit: a float per row of B, or a pair of
// bfloat16 per two rows), its cols columns rounded up to whole panels.
#pragma GCC push_options
#pragma GCC reset_options
template <typename Unit>
inline int64_t PackedBytes(int64_t units, int64_t cols) {
  return (cols + kPanel - 1) / kPanel * kPanel * units * static_cast<int64_t>(sizeof(Unit));
}
#pragma GCC pop_options

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
// per unit of its panel, so that the lines are asked for evenly over the tile's time.
struct Prefetch {
  const char* begin;
  const char* end;
  int64_t step;

  // Asks for this unit's share of the lines.
  __attribute__((always_inline)) inline void Next() {
    if (begin >= end) return;
    for (int64_t line = 0; line < step; line += kLineBytes) _mm_prefetch(begin + line, _MM_HINT_T1);
    begin += step;
  }
};

// Stores (or, with accumulate, adds onto C) the R x kPanel accumulators of a tile, width as in masks.
template <int R>
__attribute__((always_inline)) inline void Store(__m512 (&acc)[R][kVectors], float* c, int64_t ldc, bool accumulate,
                                                 const PanelMasks& masks) {
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

// A tile of R rows of C for a backend's multiply-add: c[R, width] (+)= a[R, depth] * panel[depth, width], width
// as in masks, one Madd::Step(acc, unit of A, panel's vector) per unit, vector and row; Madd::Unit is the type of
// a unit (float, or uint32_t for a pair of bf16) and Madd::Vector that of 16 units of the panel.
template <typename Madd>
struct Tiles {
  template <int R>
  struct Tile {
    using Unit = typename Madd::Unit;
    __attribute__((always_inline)) static inline void Run(int64_t depth, const Unit* a, int64_t lda,
                                                          const Unit* panel, float* c, int64_t ldc, bool accumulate,
                                                          const PanelMasks& masks, Prefetch prefetch) {
      __m512 acc[R][kVectors];
      for (int i = 0; i < R; ++i) {
        for (int v = 0; v < kVectors; ++v) acc[i][v] = _mm512_setzero_ps();
      }
      for (int64_t p = 0; p < depth; ++p) {
        typename Madd::Vector b[kVectors];
        for (int v = 0; v < kVectors; ++v) b[v] = Madd::Load(panel + p * kPanel + v * 16);
        prefetch.Next();
        for (int i = 0; i < R; ++i) {
          const typename Madd::Vector ai = Madd::Broadcast(a[i * lda + p]);
          for (int v = 0; v < kVectors; ++v) acc[i][v] = Madd::Step(acc[i][v], ai, b[v]);
        }
      }
      Store(acc, c, ldc, accumulate, masks);
    }
  };
};

// Tiles down `rows` rows: kRows at a time, then one tile of the rows left; together they prefetch the
// next_bytes bytes at `next` (the panel slice that comes next), an equal share each. Tile<R>::Run(depth, a, lda,
// panel, c, ldc, accumulate, masks, prefetch) computes one tile of R rows.
template <template <int> class Tile, typename Unit>
inline void PanelRows(int64_t rows, int64_t depth, const Unit* a, int64_t lda, const Unit* panel, float* c,
                      int64_t ldc, bool accumulate, const PanelMasks& masks, const char* next, int64_t next_bytes) {
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
    Tile<kRows>::Run(depth, a + i * lda, lda, panel, c + i * ldc, ldc, accumulate, masks, prefetch(i / kRows));
  }
  const Prefetch last = prefetch(i / kRows);
  a += i * lda;
  c += i * ldc;
  switch (rows - i) {
    case 1: Tile<1>::Run(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 2: Tile<2>::Run(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 3: Tile<3>::Run(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 4: Tile<4>::Run(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 5: Tile<5>::Run(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 6: Tile<6>::Run(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    case 7: Tile<7>::Run(depth, a, lda, panel, c, ldc, accumulate, masks, last); break;
    default: break;
  }
}

// c[rows, cols] (row stride ldc) = a[rows, units] (row stride lda) * packed [units, cols], in slices of
// slice_units units, each slice's sums added onto C: the rounding of every backend that shares this nest.
template <template <int> class Tile, typename Unit>
inline void MultiplyPanels(int64_t rows, int64_t cols, int64_t units, int64_t slice_units, const Unit* a,
                           int64_t lda, const Unit* packed, float* c, int64_t ldc) {
  for (int64_t p = 0; p < units; p += slice_units) {
    const int64_t depth = std::min(slice_units, units - p);
    for (int64_t i = 0; i < rows; i += kRowBlock) {
      const int64_t block_rows = std::min(kRowBlock, rows - i);
      for (int64_t j = 0; j < cols; j += kPanel) {
        // The panel slice after this one: the next panel's, else the first panel's next slice.
        const Unit* next = nullptr;
        int64_t next_depth = 0;
        if (j + kPanel < cols) {
          next = packed + (j + kPanel) * units + p * kPanel;
          next_depth = depth;
        } else if (p + slice_units < units) {
          next = packed + (p + slice_units) * kPanel;
          next_depth = std::min(slice_units, units - p - slice_units);
        }
        PanelRows<Tile>(block_rows, depth, a + i * lda + p, lda, packed + j * units + p * kPanel, c + i * ldc + j,
                        ldc, p > 0, PanelMasks(std::min(kPanel, cols - j)), reinterpret_cast<const char*>(next),
                        next_depth * kPanel * static_cast<int64_t>(sizeof(Unit)));
      }
    }
  }
}

}  // namespace panels
}  // namespace cpu
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CPU_GEMM_PANELS_H_
