#include "custom_ops/kernels/cpu_gemm.h"

#include <mkl.h>

#include <algorithm>
#include <mutex>
#include <new>

namespace bertserve {
namespace cpu {
namespace {

constexpr int64_t kColumnAlign = 16;  // a full AVX-512 register of floats per column block
constexpr int64_t kMinColumnsPerShard = 64;
// More blocks than threads, so a thread the OS delays on a shared machine does not hold up the whole GEMM: the
// blocks split the weights (never read twice) and re-read only the small token matrix.
constexpr int64_t kShardsPerThread = 2;
constexpr int kMemoryAlignment = 64;

// Columns per block for a B with n columns; the same split for packed and unpacked B, so both give the same sums.
int64_t BlockColumns(const ThreadPool& pool, int64_t n) {
  const int64_t shards = std::max<int64_t>(1, std::min<int64_t>(kShardsPerThread * pool.num_threads,
                                                                n / kMinColumnsPerShard));
  const int64_t block = (n + shards - 1) / shards;
  return (block + kColumnAlign - 1) / kColumnAlign * kColumnAlign;
}

// Runs block_fn(col_begin, col_end) over the column blocks of an n-column C on the pool; TensorFlow's cost model
// runs small products on fewer threads (or inline).
void ForEachBlock(const ThreadPool& pool, int64_t n, int64_t block_columns, double flops,
                  const std::function<void(int64_t, int64_t, int64_t)>& block_fn) {
  const int64_t num_blocks = (n + block_columns - 1) / block_columns;
  auto run_blocks = [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      const int64_t col_begin = s * block_columns;
      block_fn(s, col_begin, std::min(n, col_begin + block_columns));
    }
  };
  if (num_blocks == 1) {
    run_blocks(0, 1);
    return;
  }
  pool.parallel_for(num_blocks, static_cast<int64_t>(flops / num_blocks), run_blocks);
}

}  // namespace

// MKL's own threads would compete with TensorFlow's pool.
void UseSequentialMkl() {
  static std::once_flag once;
  std::call_once(once, [] { mkl_set_threading_layer(MKL_THREADING_SEQUENTIAL); });
}

void PackedMatrix::MklFree::operator()(void* p) const { mkl_free(p); }

PackedMatrix::PackedMatrix(const ThreadPool& pool, int64_t k, int64_t n, const float* b)
    : k_(k), n_(n), block_columns_(BlockColumns(pool, n)) {
  UseSequentialMkl();
  blocks_.resize((n + block_columns_ - 1) / block_columns_);
  // MKL picks the packed layout of B by the row count of A it is told: a layout packed for a few rows is copied
  // again inside every product with many rows (a tenth of the encoder's time at 256 tokens), while the layout
  // for 128 rows or more serves every row count at full speed, one row included.
  constexpr int kLayoutRows = 256;
  ForEachBlock(pool, n, block_columns_, 2.0 * k * n, [&](int64_t s, int64_t col_begin, int64_t col_end) {
    const int cols = static_cast<int>(col_end - col_begin);
    const size_t bytes = cblas_sgemm_pack_get_size(CblasBMatrix, kLayoutRows, cols, static_cast<int>(k));
    float* dest = static_cast<float*>(mkl_malloc(bytes, kMemoryAlignment));
    if (dest == nullptr) throw std::bad_alloc();
    blocks_[s].reset(dest);
    cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, CblasNoTrans, kLayoutRows, cols, static_cast<int>(k), 1.0f,
                     b + col_begin, static_cast<int>(n), dest);
  });
}

void ParallelGemm(const ThreadPool& pool, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                  const GemmEpilogue& epilogue) {
  UseSequentialMkl();
  ForEachBlock(pool, n, BlockColumns(pool, n), 2.0 * m * n * k, [&](int64_t, int64_t col_begin, int64_t col_end) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(col_end - col_begin),
                static_cast<int>(k), 1.0f, a, static_cast<int>(k), b + col_begin, static_cast<int>(n), 0.0f,
                c + col_begin, static_cast<int>(n));
    if (epilogue) epilogue(col_begin, col_end);
  });
}

void ParallelGemm(const ThreadPool& pool, int64_t m, const float* a, const PackedMatrix& b, float* c,
                  const GemmEpilogue& epilogue) {
  const int64_t n = b.n_, k = b.k_;
  ForEachBlock(pool, n, b.block_columns_, 2.0 * m * n * k, [&](int64_t s, int64_t col_begin, int64_t col_end) {
    cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, static_cast<int>(m),
                        static_cast<int>(col_end - col_begin), static_cast<int>(k), a, static_cast<int>(k),
                        b.blocks_[s].get(), static_cast<int>(n), 0.0f, c + col_begin, static_cast<int>(n));
    if (epilogue) epilogue(col_begin, col_end);
  });
}

}  // namespace cpu
}  // namespace bertserve
