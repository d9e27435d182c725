// The GEMM backends with bfloat16 operands: B packed once as bf16 (half the bytes of float: the weights come from
// DRAM on every call, so at batch 1 half the traffic), A rounded to bf16 per product, products summed in float.
// Both round operands to nearest even (zero for float denormals) and sum alike, as AVX512_BF16's VDPBF16PS does
// per float lane: acc += a[2i+1] * b[2i+1], then acc += a[2i] * b[2i], each an exact product rounded once, over
// slices of kSlicePairs pairs whose sums are added onto C. "avx512_bf16" runs VDPBF16PS on the panel loop nest of
// cpu_gemm_panels.h; "bf16_portable" computes the same sums with fmaf on any x86-64 CPU (bit for bit the same on
// normal numbers; the instruction also flushes denormal sums to zero, the portable path where MXCSR says so).
//
// Packed layout (both): panels of kPanel columns; in each, one 4-byte unit per pair of rows (2q, 2q + 1) of B and
// column, bf16(b[2q][j]) in its low half, bf16(b[2q + 1][j]) in its high half (zero past the last row and column).
// A is rounded into the same pairs, so a unit of A times a unit of B is VDPBF16PS's lane.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "custom_ops/kernels/cpu_gemm_backend.h"

// The kernels alone are compiled for AVX512_BF16 (and the AVX-512 it builds on): the rest of the file runs on any
// CPU.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#include "custom_ops/kernels/cpu_gemm_panels.h"

namespace bertserve {
namespace cpu {
namespace {

// One VDPBF16PS per pair of rows of B: a pair of A broadcast, times 16 pairs of B, two products into each float.
struct Bf16Madd {
  using Unit = uint32_t;
  using Vector = __m512bh;
  static inline __m512bh Load(const uint32_t* b) { return (__m512bh)_mm512_load_si512(b); }
  static inline __m512bh Broadcast(uint32_t a) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(a)); }
  static inline __m512 Step(__m512 acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
};

// rows x k floats (row stride lda) -> rows x ceil(k / 2) pairs of bf16 (row stride out_ld units), by
// VCVTNEPS2BF16 (round to nearest even, denormals to zero).
void RoundRowsAvx512Bf16(int64_t rows, int64_t k, const float* a, int64_t lda, uint32_t* out, int64_t out_ld) {
  for (int64_t i = 0; i < rows; ++i) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(out + i * out_ld);
    for (int64_t p = 0; p < k; p += 16) {
      const __mmask16 mask = static_cast<__mmask16>(k - p >= 16 ? 0xffff : (1u << (k - p)) - 1);
      const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, a + i * lda + p));
      _mm256_mask_storeu_epi16(dst + p, mask, (__m256i)rounded);
    }
    if (k % 2 != 0) dst[k] = 0;
  }
}

}  // namespace
}  // namespace cpu
}  // namespace bertserve
#pragma GCC pop_options

// One clone per ISA level for the portable path; the dynamic loader picks the widest the CPU supports.
#define BERTSERVE_VECTORIZED __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace bertserve {
namespace cpu {
namespace {

using panels::kPanel;

// Pairs of rows of B per slice: kDepth rows, as the float kernel's slices.
constexpr int64_t kSlicePairs = panels::kDepth / 2;

// The bf16 bits of x, rounded to nearest even; zero (of x's sign) for a denormal, a quiet NaN for a NaN: what
// VCVTNEPS2BF16 gives.
uint16_t Bf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7f800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The float values of a unit's two bf16: the high half (the odd row) and the low half (the even row).
inline float High(uint32_t unit) { return FromBits(unit & 0xffff0000u); }
inline float Low(uint32_t unit) { return FromBits(unit << 16); }

// Bf16Bits over rows x k floats, into pairs as RoundRowsAvx512Bf16 writes them.
void RoundRowsPortable(int64_t rows, int64_t k, const float* a, int64_t lda, uint32_t* out, int64_t out_ld) {
  for (int64_t i = 0; i < rows; ++i) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(out + i * out_ld);
    for (int64_t p = 0; p < k; ++p) dst[p] = Bf16Bits(a[i * lda + p]);
    if (k % 2 != 0) dst[k] = 0;
  }
}

// The sums of Bf16Madd's tiles in the same order, a panel's row at a time.
BERTSERVE_VECTORIZED void MultiplyPortable(int64_t rows, int64_t cols, int64_t pairs, const uint32_t* a,
                                           int64_t lda, const uint32_t* packed, float* c, int64_t ldc) {
  for (int64_t p = 0; p < pairs; p += kSlicePairs) {
    const int64_t depth = std::min(kSlicePairs, pairs - p);
    for (int64_t j = 0; j < cols; j += kPanel) {
      const int64_t width = std::min(kPanel, cols - j);
      const uint32_t* panel = packed + j * pairs + p * kPanel;
      for (int64_t i = 0; i < rows; ++i) {
        float acc[kPanel] = {};
        const uint32_t* ai = a + i * lda + p;
        for (int64_t q = 0; q < depth; ++q) {
          const float odd = High(ai[q]), even = Low(ai[q]);
          const uint32_t* bq = panel + q * kPanel;
          for (int64_t col = 0; col < kPanel; ++col) {
            acc[col] = std::fma(odd, High(bq[col]), acc[col]);
            acc[col] = std::fma(even, Low(bq[col]), acc[col]);
          }
        }
        float* out = c + i * ldc + j;
        for (int64_t col = 0; col < width; ++col) out[col] = p > 0 ? acc[col] + out[col] : acc[col];
      }
    }
  }
}

// The packed layout and A's rounding both backends share; each multiplies its own way.
class Bf16Backend : public GemmBackend {
 public:
  int64_t ColumnAlign() const override { return kPanel; }

  int64_t PackedBytes(int64_t k, int64_t cols) const override {
    return panels::PackedBytes<uint32_t>(Pairs(k), cols);
  }

  void Pack(int64_t k, int64_t cols, const float* b, int64_t ldb, float* dest) const override {
    const int64_t pairs = Pairs(k);
    uint32_t* units = reinterpret_cast<uint32_t*>(dest);
    for (int64_t j = 0; j < cols; j += kPanel) {
      const int64_t width = std::min(kPanel, cols - j);
      uint32_t* panel = units + j * pairs;
      for (int64_t q = 0; q < pairs; ++q) {
        uint32_t* row = panel + q * kPanel;
        std::fill(row, row + kPanel, 0u);
        for (int64_t col = 0; col < width; ++col) {
          const uint32_t even = Bf16Bits(b[2 * q * ldb + j + col]);
          const uint32_t odd = 2 * q + 1 < k ? Bf16Bits(b[(2 * q + 1) * ldb + j + col]) : 0u;
          row[col] = even | odd << 16;
        }
      }
    }
  }

  void Multiply(int64_t rows, int64_t cols, int64_t k, const float* a, int64_t lda, const float* packed, float* c,
                int64_t ldc) const override {
    // A rounded to pairs in this thread's buffer: rows x k is small beside the weights it multiplies, and every
    // column block rounds it again rather than share a buffer between threads.
    thread_local std::vector<uint32_t> pairs_of_a;
    const int64_t pairs = Pairs(k);
    pairs_of_a.resize(static_cast<size_t>(rows * pairs));
    MultiplyPairs(rows, cols, k, a, lda, pairs_of_a.data(), reinterpret_cast<const uint32_t*>(packed), c, ldc);
  }

 protected:
  static int64_t Pairs(int64_t k) { return (k + 1) / 2; }

  // Rounds a into a_pairs (rows x Pairs(k)), then c = a_pairs * packed.
  virtual void MultiplyPairs(int64_t rows, int64_t cols, int64_t k, const float* a, int64_t lda, uint32_t* a_pairs,
                             const uint32_t* packed, float* c, int64_t ldc) const = 0;
};

class Avx512Bf16Backend : public Bf16Backend {
 public:
  const char* name() const override { return "avx512_bf16"; }

  bool Supported() const override {
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }

 private:
  void MultiplyPairs(int64_t rows, int64_t cols, int64_t k, const float* a, int64_t lda, uint32_t* a_pairs,
                     const uint32_t* packed, float* c, int64_t ldc) const override {
    RoundRowsAvx512Bf16(rows, k, a, lda, a_pairs, Pairs(k));
    panels::MultiplyPanels<panels::Tiles<Bf16Madd>::Tile>(rows, cols, Pairs(k), kSlicePairs, a_pairs, Pairs(k),
                                                          packed, c, ldc);
  }
};

class PortableBf16Backend : public Bf16Backend {
 public:
  const char* name() const override { return "bf16_portable"; }
  bool Supported() const override { return true; }

 private:
  void MultiplyPairs(int64_t rows, int64_t cols, int64_t k, const float* a, int64_t lda, uint32_t* a_pairs,
                     const uint32_t* packed, float* c, int64_t ldc) const override {
    RoundRowsPortable(rows, k, a, lda, a_pairs, Pairs(k));
    MultiplyPortable(rows, cols, Pairs(k), a_pairs, Pairs(k), packed, c, ldc);
  }
};

}  // namespace

const GemmBackend& Avx512Bf16GemmBackend() {
  static const Avx512Bf16Backend backend;
  return backend;
}

const GemmBackend& PortableBf16GemmBackend() {
  static const PortableBf16Backend backend;
  return backend;
}

}  // namespace cpu
}  // namespace bertserve
