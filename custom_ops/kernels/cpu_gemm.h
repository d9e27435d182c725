// Matrix products of the CPU backend: Intel MKL SGEMM (runtime CPU dispatch inside MKL, its sequential threading
// layer), one call per column block over the caller's thread pool, so TensorFlow's intra-op pool is the only set
// of threads. Weights reused across calls can be packed once into MKL's GEMM layout (PackedMatrix): an unpacked
// call re-packs B every time, which costs as much as a sixth of the encoder's time at serving batch sizes.
#ifndef BERTSERVE_KERNELS_CPU_GEMM_H_
#define BERTSERVE_KERNELS_CPU_GEMM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "custom_ops/kernels/bert_core.h"

namespace bertserve {
namespace cpu {

// A tile of C: rows [row_begin, row_end) of columns [col_begin, col_end), which is column block `block`.
struct GemmTile {
  int64_t block, row_begin, row_end, col_begin, col_end;
};

// Runs on a finished tile of C, on the thread that computed it, while the tile is still in its cache.
using GemmEpilogue = std::function<void(const GemmTile& tile)>;

// B [k, n] (row-major, contiguous) split into the column blocks ParallelGemm shards over, each block packed into
// MKL's GEMM layout. Immutable once built, so concurrent GEMMs may share it; it does not refer to b afterwards.
class PackedMatrix {
 public:
  PackedMatrix(const ThreadPool& pool, int64_t k, int64_t n, const float* b);

 private:
  struct MklFree {
    void operator()(void* p) const;
  };
  friend void ParallelGemm(const ThreadPool& pool, int64_t m, const float* a, const PackedMatrix& b, float* c,
                           const GemmEpilogue& epilogue);

  int64_t k_, n_, block_columns_;
  std::vector<std::unique_ptr<float, MklFree>> blocks_;
};

// C[m, n] = A[m, k] * B[k, n], all row-major and contiguous. Columns are split into about 2 * pool.num_threads
// blocks: each reads only its slice of B (the weights) and all of A (the tokens), which keeps the weight traffic,
// the dominant cost at serving batch sizes, at one pass. Beyond 512 rows the rows are split into tiles too, each
// re-reading the weights once. epilogue may be empty.
void ParallelGemm(const ThreadPool& pool, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                  const GemmEpilogue& epilogue);

// The same with B packed beforehand (A has B's k columns, C its n).
void ParallelGemm(const ThreadPool& pool, int64_t m, const float* a, const PackedMatrix& b, float* c,
                  const GemmEpilogue& epilogue);

}  // namespace cpu
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CPU_GEMM_H_
