#include "custom_ops/kernels/cpu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>

// scipy-openblas32 exports its symbols with a prefix (its pkg-config Cflags define BLAS_SYMBOL_PREFIX=scipy_);
// a plain OpenBLAS (Debian libopenblas-dev) has none.
#define BERTSERVE_PASTE_(a, b) a##b
#define BERTSERVE_PASTE(a, b) BERTSERVE_PASTE_(a, b)
#ifdef BLAS_SYMBOL_PREFIX
#define BERTSERVE_BLAS(name) BERTSERVE_PASTE(BLAS_SYMBOL_PREFIX, name)
#else
#define BERTSERVE_BLAS(name) name
#endif

namespace bertserve {
namespace cpu {
namespace {

constexpr int64_t kColumnAlign = 16;  // a full AVX-512 register of floats per column block
constexpr int64_t kMinColumnsPerShard = 64;
// More blocks than threads, so a thread the OS delays on a shared machine does not hold up the whole GEMM: the
// blocks split the weights (never read twice) and re-read only the small token matrix.
constexpr int64_t kShardsPerThread = 2;
constexpr double kMinFlopsPerShard = 2e6;  // below this a thread hand-off costs more than it saves

void SingleThreadedBlas() {
  static std::once_flag once;
  std::call_once(once, [] { BERTSERVE_BLAS(openblas_set_num_threads)(1); });
}

}  // namespace

void ParallelGemm(const ThreadPool& pool, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                  const GemmEpilogue& epilogue) {
  SingleThreadedBlas();
  const double flops = 2.0 * m * n * k;
  int64_t shards = std::min<int64_t>(kShardsPerThread * pool.num_threads, n / kMinColumnsPerShard);
  shards = std::min<int64_t>(shards, static_cast<int64_t>(flops / kMinFlopsPerShard));
  shards = std::max<int64_t>(shards, 1);
  const int64_t block = (n + shards - 1) / shards;
  const int64_t aligned_block = (block + kColumnAlign - 1) / kColumnAlign * kColumnAlign;
  const int64_t num_blocks = (n + aligned_block - 1) / aligned_block;
  auto run_blocks = [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      const int64_t col_begin = s * aligned_block;
      const int64_t col_end = std::min(n, col_begin + aligned_block);
      BERTSERVE_BLAS(cblas_sgemm)(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m),
                                  static_cast<int>(col_end - col_begin), static_cast<int>(k), 1.0f, a,
                                  static_cast<int>(k), b + col_begin, static_cast<int>(n), 0.0f, c + col_begin,
                                  static_cast<int>(n));
      if (epilogue) epilogue(col_begin, col_end);
    }
  };
  if (num_blocks == 1) {
    run_blocks(0, 1);
    return;
  }
  pool.parallel_for(num_blocks, static_cast<int64_t>(flops / num_blocks), run_blocks);
}

}  // namespace cpu
}  // namespace bertserve
