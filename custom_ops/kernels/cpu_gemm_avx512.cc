// The "avx512" GEMM backend: B packed in panels of kPanel columns (cpu_gemm_panels.h), each panel k-major (kPanel
// contiguous floats per row of B, zeros past the last column), A read in place, C tiles of 8 x 48 over slices of
// kDepth rows of B, the next panel slice prefetched into L2 (2 threads, 6 layers' GEMMs: 19 rows 125 -> 148
// GFLOP/s, 32 rows 154 -> 173, 164 rows 197 -> 206 on the AMD EPYC). Compiled for AVX-512F by target pragma, so
// the library still loads on a CPU without it (Supported() says whether this one may be used).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "custom_ops/kernels/cpu_gemm_backend.h"

// The kernels alone are compiled for AVX-512F: the rest of the file runs on any CPU.
#pragma GCC push_options
#pragma GCC target("avx512f")
#include "custom_ops/kernels/cpu_gemm_panels.h"

namespace bertserve {
namespace cpu {
namespace {

// One multiply-add per row of B: a float of A broadcast, times 16 floats of B.
struct FloatMadd {
  using Unit = float;
  using Vector = __m512;
  static inline __m512 Load(const float* b) { return _mm512_load_ps(b); }
  static inline __m512 Broadcast(float a) { return _mm512_set1_ps(a); }
  static inline __m512 Step(__m512 acc, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, acc); }
};

}  // namespace
}  // namespace cpu
}  // namespace bertserve
#pragma GCC pop_options

namespace bertserve {
namespace cpu {
namespace {

using panels::kDepth;
using panels::kPanel;

class Avx512Backend : public GemmBackend {
 public:
  const char* name() const override { return "avx512"; }

  bool Supported() const override { return __builtin_cpu_supports("avx512f"); }

  int64_t ColumnAlign() const override { return kPanel; }

  int64_t PackedBytes(int64_t k, int64_t cols) const override {
    return panels::PackedBytes<float>(k, cols);
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
    panels::MultiplyPanels<panels::Tiles<FloatMadd>::Tile>(rows, cols, k, kDepth, a, lda, packed, c, ldc);
  }
};

}  // namespace

const GemmBackend& Avx512GemmBackend() {
  static const Avx512Backend backend;
  return backend;
}

}  // namespace cpu
}  // namespace bertserve
