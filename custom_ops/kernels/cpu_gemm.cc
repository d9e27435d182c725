#include "custom_ops/kernels/cpu_gemm.h"

#include <mkl.h>

#include <algorithm>
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
// Products with more rows are split into row tiles as well: beyond a few hundred rows the token matrix outgrows
// L2, and with column blocks alone every block would stream all of it again (3-5 % slower at 1,000+ rows).
constexpr int64_t kMaxTileRows = 512;

// Columns per block for a B with n columns; the same split for packed and unpacked B, so both give the same sums.
int64_t BlockColumns(const ThreadPool& pool, int64_t n) {
  const int64_t shards = std::max<int64_t>(1, std::min<int64_t>(kShardsPerThread * pool.num_threads,
                                                                n / kMinColumnsPerShard));
  const int64_t block = (n + shards - 1) / shards;
  return (block + kColumnAlign - 1) / kColumnAlign * kColumnAlign;
}

// Runs tile_fn over the tiles of an m x n C (column blocks of block_columns, row tiles of at most kMaxTileRows) on
// the pool; TensorFlow's cost model runs small products on fewer threads (or inline).
void ForEachTile(const ThreadPool& pool, int64_t m, int64_t n, int64_t block_columns, double flops,
                 const std::function<void(const GemmTile&)>& tile_fn) {
  const int64_t num_blocks = (n + block_columns - 1) / block_columns;
  const int64_t row_tiles = std::max<int64_t>(1, (m + kMaxTileRows - 1) / kMaxTileRows);
  const int64_t tile_rows = (m + row_tiles - 1) / row_tiles;
  auto run_tiles = [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      GemmTile tile;
      tile.block = t % num_blocks;
      tile.row_begin = t / num_blocks * tile_rows;
      tile.row_end = std::min(m, tile.row_begin + tile_rows);
      tile.col_begin = tile.block * block_columns;
      tile.col_end = std::min(n, tile.col_begin + block_columns);
      tile_fn(tile);
    }
  };
  const int64_t tiles = num_blocks * row_tiles;
  if (tiles == 1) {
    run_tiles(0, 1);
    return;
  }
  pool.parallel_for(tiles, static_cast<int64_t>(flops / tiles), run_tiles);
}

// Every MKL call of the CPU backend (these GEMMs, attention's batched GEMMs and exponentials) runs on the thread
// that makes it: MKL's own threads would compete with TensorFlow's intra-op pool, which is meant to be the only
// set of threads. Set once, when the op library loads, before any kernel can call MKL.
struct SequentialMkl {
  SequentialMkl() { mkl_set_threading_layer(MKL_THREADING_SEQUENTIAL); }
};
const SequentialMkl kSequentialMkl;

}  // namespace

void PackedMatrix::MklFree::operator()(void* p) const { mkl_free(p); }

PackedMatrix::PackedMatrix(const ThreadPool& pool, int64_t k, int64_t n, const float* b)
    : k_(k), n_(n), block_columns_(BlockColumns(pool, n)) {
  blocks_.resize((n + block_columns_ - 1) / block_columns_);
  // MKL picks the packed layout of B by the row count of A it is told: a layout packed for a few rows is copied
  // again inside every product with many rows (a tenth of the encoder's time at 256 tokens), while the layout
  // for 128 rows or more serves every row count at full speed, one row included.
  constexpr int kLayoutRows = 256;
  // One row of tiles: the packed layout does not depend on the rows of C.
  ForEachTile(pool, 1, n, block_columns_, 2.0 * k * n, [&](const GemmTile& tile) {
    const int cols = static_cast<int>(tile.col_end - tile.col_begin);
    const size_t bytes = cblas_sgemm_pack_get_size(CblasBMatrix, kLayoutRows, cols, static_cast<int>(k));
    float* dest = static_cast<float*>(mkl_malloc(bytes, kMemoryAlignment));
    if (dest == nullptr) throw std::bad_alloc();
    blocks_[tile.block].reset(dest);
    cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, CblasNoTrans, kLayoutRows, cols, static_cast<int>(k), 1.0f,
                     b + tile.col_begin, static_cast<int>(n), dest);
  });
}

void ParallelGemm(const ThreadPool& pool, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                  const GemmEpilogue& epilogue) {
  ForEachTile(pool, m, n, BlockColumns(pool, n), 2.0 * m * n * k, [&](const GemmTile& tile) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(tile.row_end - tile.row_begin),
                static_cast<int>(tile.col_end - tile.col_begin), static_cast<int>(k), 1.0f, a + tile.row_begin * k,
                static_cast<int>(k), b + tile.col_begin, static_cast<int>(n), 0.0f,
                c + tile.row_begin * n + tile.col_begin, static_cast<int>(n));
    if (epilogue) epilogue(tile);
  });
}

void ParallelGemm(const ThreadPool& pool, int64_t m, const float* a, const PackedMatrix& b, float* c,
                  const GemmEpilogue& epilogue) {
  const int64_t n = b.n_, k = b.k_;
  ForEachTile(pool, m, n, b.block_columns_, 2.0 * m * n * k, [&](const GemmTile& tile) {
    cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, static_cast<int>(tile.row_end - tile.row_begin),
                        static_cast<int>(tile.col_end - tile.col_begin), static_cast<int>(k),
                        a + tile.row_begin * k, static_cast<int>(k), b.blocks_[tile.block].get(),
                        static_cast<int>(n), 0.0f, c + tile.row_begin * n + tile.col_begin, static_cast<int>(n));
    if (epilogue) epilogue(tile);
  });
}

}  // namespace cpu
}  // namespace bertserve
