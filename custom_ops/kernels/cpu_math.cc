#include "custom_ops/kernels/cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// One clone per ISA level; the dynamic loader picks the widest the CPU supports.
#define BERTSERVE_VECTORIZED __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace bertserve {
namespace cpu {
namespace {

constexpr int kLanes = 16;  // independent partial sums, so reductions vectorise without -ffast-math

// 16 floats as one value: a zmm register where the clone has AVX-512, else several narrower ones.
typedef float Floats16 __attribute__((vector_size(64)));

// Folds x with op into kLanes partial results, then the tail and the partials into one, starting from init.
template <typename Op>
inline float LaneReduce(const float* x, int64_t n, float init, Op op) {
  float acc[kLanes];
  std::fill(acc, acc + kLanes, init);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] = op(acc[l], x[i + l]);
  }
  float result = init;
  for (; i < n; ++i) result = op(result, x[i]);
  for (int l = 0; l < kLanes; ++l) result = op(result, acc[l]);
  return result;
}

inline float Sum(const float* x, int64_t n) {
  return LaneReduce(x, n, 0.0f, [](float a, float b) { return a + b; });
}

inline float Max(const float* x, int64_t n) {
  return LaneReduce(x, n, x[0], [](float a, float b) { return std::max(a, b); });
}

inline float SumSquaredDeviation(const float* x, float mean, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float d = x[i + l] - mean;
      acc[l] += d * d;
    }
  }
  float total = 0.0f;
  for (; i < n; ++i) total += (x[i] - mean) * (x[i] - mean);
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  return total;
}

// Normalises x (which already holds the pre-norm sum) in place.
inline void NormalizeInPlace(const float* gamma, const float* beta, int64_t n, float epsilon, float* x) {
  const float mean = Sum(x, n) / static_cast<float>(n);
  const float variance = SumSquaredDeviation(x, mean, n) / static_cast<float>(n);
  const float inv_std = 1.0f / std::sqrt(variance + epsilon);
  for (int64_t i = 0; i < n; ++i) x[i] = (x[i] - mean) * inv_std * gamma[i] + beta[i];
}

// erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] (|error| < 4e-7 in float), 1 beyond: a rational fit that vectorises
// (no exp, no branches).
inline float Erf(float x) {
  x = std::min(4.0f, std::max(-4.0f, x));
  const float t = x * x;
  float p = -1.214772532e-08f;
  p = p * t + 4.476579945e-06f;
  p = p * t + 3.719523367e-04f;
  p = p * t + 3.835557566e-03f;
  p = p * t + 5.416869743e-02f;
  p = p * t + 1.854368370e-01f;
  p = p * t + 1.128379168e+00f;
  float q = 6.113110592e-05f;
  q = q * t + 1.294357445e-03f;
  q = q * t + 1.540775404e-02f;
  q = q * t + 1.138962763e-01f;
  q = q * t + 4.976724943e-01f;
  q = q * t + 1.0f;
  return x * p / q;
}

}  // namespace

BERTSERVE_VECTORIZED void HalfToFloat(const fp16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    _Float16 h;
    std::memcpy(&h, &in[i], sizeof(h));
    out[i] = static_cast<float>(h);
  }
}

BERTSERVE_VECTORIZED void FloatToHalf(const float* in, fp16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const _Float16 h = static_cast<_Float16>(in[i]);
    std::memcpy(&out[i], &h, sizeof(h));
  }
}

BERTSERVE_VECTORIZED void SumLayerNorm(const float* a, const float* b, const float* c, const float* gamma,
                                       const float* beta, int64_t n, float epsilon, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i] + c[i];
  NormalizeInPlace(gamma, beta, n, epsilon, out);
}

BERTSERVE_VECTORIZED void AddBiasResidualLayerNorm(const float* y, const float* bias, const float* gamma,
                                                   const float* beta, int64_t n, float epsilon, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i] + bias[i];
  NormalizeInPlace(gamma, beta, n, epsilon, x);
}

BERTSERVE_VECTORIZED void AddBias(const float* bias, int64_t n, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] += bias[i];
}

BERTSERVE_VECTORIZED void RowsTimesMatrix(const float* a, int64_t lda, int64_t rows, const float* b, int64_t ldb,
                                          int64_t k, int64_t n, float* c, int64_t ldc) {
  // A kRowGroup x kChunk block of c stays in registers over all of k, each row of b's chunk loaded once for the
  // group; b's rows kAhead ahead are prefetched (they are a stride apart, which the hardware does not follow).
  constexpr int64_t kRowGroup = 4, kVectors = 4, kChunk = 16 * kVectors, kAhead = 8;
  for (int64_t first = 0; first < rows; first += kRowGroup) {
    const int64_t group = std::min(kRowGroup, rows - first);
    int64_t j = 0;
    for (; j + kChunk <= n; j += kChunk) {
      Floats16 acc[kRowGroup][kVectors] = {};
      for (int64_t p = 0; p < k; ++p) {
        const float* b_row = b + p * ldb + j;
        if (p + kAhead < k) {
          for (int64_t v = 0; v < kVectors; ++v) __builtin_prefetch(b_row + kAhead * ldb + 16 * v);
        }
        Floats16 b_vectors[kVectors];
        std::memcpy(b_vectors, b_row, sizeof(b_vectors));
        for (int64_t r = 0; r < kRowGroup; ++r) {
          if (r >= group) break;
          const float a_rp = a[(first + r) * lda + p];
          for (int64_t v = 0; v < kVectors; ++v) acc[r][v] += a_rp * b_vectors[v];
        }
      }
      for (int64_t r = 0; r < group; ++r) std::memcpy(c + (first + r) * ldc + j, acc[r], sizeof(acc[r]));
    }
    for (; j < n; ++j) {  // columns past the last whole chunk
      for (int64_t r = 0; r < group; ++r) {
        float sum = 0.0f;
        for (int64_t p = 0; p < k; ++p) sum += a[(first + r) * lda + p] * b[p * ldb + j];
        c[(first + r) * ldc + j] = sum;
      }
    }
  }
}

BERTSERVE_VECTORIZED void AddBiasGelu(const float* bias, int64_t n, float* x) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] + bias[i];
    x[i] = 0.5f * v * (1.0f + Erf(v * kInvSqrt2));
  }
}

BERTSERVE_VECTORIZED void SubtractRowMaxima(float* x, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * n;
    const float row_max = Max(row, n);
    for (int64_t i = 0; i < n; ++i) row[i] -= row_max;
  }
}

BERTSERVE_VECTORIZED void ScaleRowsToUnitSum(float* x, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * n;
    const float inv_sum = 1.0f / Sum(row, n);
    for (int64_t i = 0; i < n; ++i) row[i] *= inv_sum;
  }
}

}  // namespace cpu
}  // namespace bertserve
