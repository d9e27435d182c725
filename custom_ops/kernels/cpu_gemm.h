// Matrix products of the CPU backend: OpenBLAS SGEMM (runtime CPU dispatch inside OpenBLAS), one single-threaded
// call per shard of the caller's thread pool, so TensorFlow's intra-op pool is the only set of threads.
#ifndef BERTSERVE_KERNELS_CPU_GEMM_H_
#define BERTSERVE_KERNELS_CPU_GEMM_H_

#include <cstdint>
#include <functional>

#include "custom_ops/kernels/bert_core.h"

namespace bertserve {
namespace cpu {

// Runs on a finished column block [col_begin, col_end) of C (all rows), on the thread that computed it.
using GemmEpilogue = std::function<void(int64_t col_begin, int64_t col_end)>;

// C[m, n] = A[m, k] * B[k, n], all row-major and contiguous. Columns are split into about pool.num_threads
// blocks: each shard reads only its slice of B (the weights) and all of A (the tokens), which keeps the weight
// traffic, the dominant cost at serving batch sizes, at one pass. epilogue may be empty.
void ParallelGemm(const ThreadPool& pool, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                  const GemmEpilogue& epilogue);

}  // namespace cpu
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CPU_GEMM_H_
