// What a GEMM backend of cpu_gemm.h provides: its own packed layout of a column block of B and the product of a
// tile of A with such a block. Only cpu_gemm*.cc see it; the encoder uses cpu_gemm.h.
#ifndef BERTSERVE_KERNELS_CPU_GEMM_BACKEND_H_
#define BERTSERVE_KERNELS_CPU_GEMM_BACKEND_H_

#include <cstdint>

namespace bertserve {
namespace cpu {

class GemmBackend {
 public:
  virtual ~GemmBackend() = default;
  virtual const char* name() const = 0;
  // Whether this CPU has the instructions the backend's kernels use.
  virtual bool Supported() const = 0;
  // Column blocks are multiples of this many columns (all but the last).
  virtual int64_t ColumnAlign() const = 0;
  // Bytes of a packed block of `cols` columns and k rows.
  virtual int64_t PackedBytes(int64_t k, int64_t cols) const = 0;
  // Packs columns [0, cols) of b (k rows, row stride ldb) into dest: PackedBytes bytes, 64-byte aligned.
  virtual void Pack(int64_t k, int64_t cols, const float* b, int64_t ldb, float* dest) const = 0;
  // c[rows, cols] (row stride ldc) = a[rows, k] (row stride lda) * the packed block of `cols` columns.
  virtual void Multiply(int64_t rows, int64_t cols, int64_t k, const float* a, int64_t lda, const float* packed,
                        float* c, int64_t ldc) const = 0;
};

const GemmBackend& MklGemmBackend();
const GemmBackend& Avx512GemmBackend();
// bfloat16 operands (cpu_gemm_bf16.cc): one packed layout, one rounding, two ways to multiply.
const GemmBackend& Avx512Bf16GemmBackend();
const GemmBackend& PortableBf16GemmBackend();

}  // namespace cpu
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CPU_GEMM_BACKEND_H_
