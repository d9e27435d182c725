// Row kernels of the CPU backend, in float. Each is compiled for AVX-512, AVX2+FMA and baseline x86-64 and picks
// the best at load time (target_clones), so the library runs on any x86-64 CPU and uses wide vectors where present.
#ifndef BERTSERVE_KERNELS_CPU_MATH_H_
#define BERTSERVE_KERNELS_CPU_MATH_H_

#include <cstdint>

#include "custom_ops/kernels/bert_core.h"

namespace bertserve {
namespace cpu {

void HalfToFloat(const fp16* in, float* out, int64_t n);
void FloatToHalf(const float* in, fp16* out, int64_t n);

// out = LayerNorm(a + b + c): the embedding sum of one token.
void SumLayerNorm(const float* a, const float* b, const float* c, const float* gamma, const float* beta, int64_t n,
                  float epsilon, float* out);

// x = LayerNorm(y + bias + x): a sublayer's output projection, residual and norm, in place on the residual row.
void AddBiasResidualLayerNorm(const float* y, const float* bias, const float* gamma, const float* beta, int64_t n,
                              float epsilon, float* x);

void AddBias(const float* bias, int64_t n, float* x);

// c[rows, n] = a[rows, k] * b[k, n], row-major with row strides lda, ldb, ldc, b read in place: for products of
// a few rows, where packing b for the GEMM kernels would cost more than the product.
void RowsTimesMatrix(const float* a, int64_t lda, int64_t rows, const float* b, int64_t ldb, int64_t k, int64_t n,
                     float* c, int64_t ldc);

// x = gelu(x + bias), erf form.
void AddBiasGelu(const float* bias, int64_t n, float* x);

// The softmax's steps around the exponentials, on `rows` rows of n floats in place: subtracting each row's
// maximum (so every exponential is in (0, 1]), and dividing each row by its sum.
void SubtractRowMaxima(float* x, int64_t rows, int64_t n);
void ScaleRowsToUnitSum(float* x, int64_t rows, int64_t n);

}  // namespace cpu
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CPU_MATH_H_
