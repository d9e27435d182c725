#include "custom_ops/kernels/cpu_gemm.h"

#include <mkl.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <new>
#include <stdexcept>

#include "custom_ops/kernels/cpu_gemm_backend.h"

namespace bertserve {
namespace cpu {
namespace {

constexpr int64_t kMinColumnsPerShard = 64;
// More blocks than threads, so a thread the OS delays on a shared machine does not hold up the whole GEMM: the
// blocks split the weights (never read twice) and re-read only the small token matrix.
constexpr int64_t kShardsPerThread = 2;
constexpr int64_t kMemoryAlignment = 64;
// Packed weights start on a 2 MiB boundary and are advised onto transparent huge pages: the encoder streams all of
// them from DRAM on every call (170 MB for 6 layers at hidden 768), and on 4 KiB pages a page walk every 4 KiB
// held the GEMM kernel up (one thread, 6 layers' GEMMs: 19 rows 80 -> 97 GFLOP/s, 32 rows 91 -> 103, 164 rows
// 103 -> 107).
constexpr int64_t kHugePageBytes = int64_t{2} << 20;
// Products with more rows are split into row tiles as well: beyond a few hundred rows the token matrix outgrows
// L2, and with column blocks alone every block would stream all of it again (3-5 % slower at 1,000+ rows).
constexpr int64_t kMaxTileRows = 512;
constexpr const char* kBackendVariable = "BERTSERVE_CPU_GEMM";
constexpr const char* kBf16BackendVariable = "BERTSERVE_CPU_GEMM_BF16";

// MKL's CBLAS takes int sizes.
int BlasInt(int64_t value) {
  if (value > INT_MAX) throw std::length_error("a GEMM size exceeds MKL's int range: " + std::to_string(value));
  return static_cast<int>(value);
}

class MklBackend : public GemmBackend {
 public:
  const char* name() const override { return "mkl"; }
  bool Supported() const override { return true; }
  int64_t ColumnAlign() const override { return 16; }  // a full AVX-512 register of floats

  // MKL picks the packed layout of B by the row count of A it is told: a layout packed for a few rows is copied
  // again inside every product with many rows (a tenth of the encoder's time at 256 tokens), while the layout for
  // 128 rows or more serves every row count at full speed, one row included.
  static constexpr int kLayoutRows = 256;

  int64_t PackedBytes(int64_t k, int64_t cols) const override {
    return static_cast<int64_t>(cblas_sgemm_pack_get_size(CblasBMatrix, kLayoutRows, BlasInt(cols), BlasInt(k)));
  }

  void Pack(int64_t k, int64_t cols, const float* b, int64_t ldb, float* dest) const override {
    cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, CblasNoTrans, kLayoutRows, BlasInt(cols), BlasInt(k), 1.0f, b,
                     BlasInt(ldb), dest);
  }

  void Multiply(int64_t rows, int64_t cols, int64_t k, const float* a, int64_t lda, const float* packed, float* c,
                int64_t ldc) const override {
    cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, BlasInt(rows), BlasInt(cols), BlasInt(k), a,
                        BlasInt(lda), packed, BlasInt(cols), 0.0f, c, BlasInt(ldc));
  }
};

// Every MKL call of the CPU backend (these GEMMs, attention's batched GEMMs and exponentials) runs on the thread
// that makes it: MKL's own threads would compete with TensorFlow's intra-op pool, which is meant to be the only
// set of threads. Set once, when the op library loads, before any kernel can call MKL.
struct SequentialMkl {
  SequentialMkl() { mkl_set_threading_layer(MKL_THREADING_SEQUENTIAL); }
};
const SequentialMkl kSequentialMkl;

const GemmBackend* const kBackends[] = {&Avx512GemmBackend(), &MklGemmBackend()};
const GemmBackend* const kBf16Backends[] = {&Avx512Bf16GemmBackend(), &PortableBf16GemmBackend()};

// Columns per block for a B with n columns.
int64_t BlockColumns(const ThreadPool& pool, const GemmBackend& backend, int64_t n) {
  const int64_t shards = std::max<int64_t>(1, std::min<int64_t>(kShardsPerThread * pool.num_threads,
                                                                n / kMinColumnsPerShard));
  const int64_t block = (n + shards - 1) / shards;
  const int64_t align = backend.ColumnAlign();
  return (block + align - 1) / align * align;
}

int64_t RowTiles(int64_t m) { return std::max<int64_t>(1, (m + kMaxTileRows - 1) / kMaxTileRows); }

// Runs tile_fn over the tiles of an m x n C (column blocks of block_columns, row tiles of at most kMaxTileRows) on
// the pool; TensorFlow's cost model runs small products on fewer threads (or inline).
void ForEachTile(const ThreadPool& pool, int64_t m, int64_t n, int64_t block_columns, double flops,
                 const std::function<void(const GemmTile&)>& tile_fn) {
  const int64_t num_blocks = (n + block_columns - 1) / block_columns;
  const int64_t row_tiles = RowTiles(m);
  const int64_t tile_rows = (m + row_tiles - 1) / row_tiles;
  auto run_tiles = [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      GemmTile tile;
      tile.block = t % num_blocks;
      tile.row_tile = t / num_blocks;
      tile.row_begin = tile.row_tile * tile_rows;
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

// A pool that runs every loop on the calling thread.
ThreadPool SerialPool() {
  ThreadPool serial;
  serial.parallel_for = [](int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) { fn(0, n); };
  return serial;
}

double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The supported backend that multiplies fastest on this CPU, on one thread, at a token count of batch 1 and one of
// a large batch against a column block of a hidden-768 weight. Time on this thread's CPU clock, best of a few
// rounds taken in turns, so that other processes on a shared machine weigh little.
const GemmBackend& FastestBackend() {
  constexpr int64_t kK = 768, kCols = 192, kRounds = 5;
  constexpr int64_t kRowCounts[] = {24, 256};
  std::vector<float> a(kRowCounts[1] * kK), b(kK * kCols), c(kRowCounts[1] * kCols);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) * 0.5f - 1.0f;
  const ThreadPool serial = SerialPool();
  const GemmBackend* best = nullptr;
  double best_seconds = 0.0;
  std::vector<const GemmBackend*> candidates;
  for (const GemmBackend* backend : kBackends) {
    if (backend->Supported()) candidates.push_back(backend);
  }
  std::vector<double> seconds(candidates.size(), 0.0);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const PackedMatrix packed(serial, kK, kCols, b.data(), *candidates[i]);
    for (int64_t rows : kRowCounts) {
      double fastest = 1e30;
      for (int64_t round = 0; round < kRounds; ++round) {
        const double start = ThreadSeconds();
        ParallelGemm(serial, rows, a.data(), packed, c.data(), {});
        fastest = std::min(fastest, ThreadSeconds() - start);
      }
      seconds[i] += fastest / static_cast<double>(rows);  // per row, so both counts weigh alike
    }
    if (best == nullptr || seconds[i] < best_seconds) {
      best = candidates[i];
      best_seconds = seconds[i];
    }
  }
  return *best;
}

}  // namespace

const GemmBackend& MklGemmBackend() {
  static const MklBackend backend;
  return backend;
}

std::vector<std::string> GemmBackendNames() {
  std::vector<std::string> names;
  for (const GemmBackend* backend : kBackends) names.emplace_back(backend->name());
  return names;
}

std::string GemmBackendName(const GemmBackend& backend) { return backend.name(); }

namespace {

// The backend among `backends` that the environment variable `variable` names, or null when it is unset or empty.
// Throws std::invalid_argument when it names none of them, or one this CPU cannot run.
template <size_t N>
const GemmBackend* RequestedBackend(const char* variable, const GemmBackend* const (&backends)[N]) {
  const char* requested = std::getenv(variable);
  if (requested == nullptr || *requested == '\0') return nullptr;
  std::string known;
  for (const GemmBackend* backend : backends) {
    if (backend->name() != std::string(requested)) {
      known += std::string(known.empty() ? "" : ", ") + backend->name();
      continue;
    }
    if (!backend->Supported()) {
      throw std::invalid_argument(std::string(variable) + "=" + requested +
                                  ": this CPU lacks the instructions that GEMM backend needs");
    }
    return backend;
  }
  throw std::invalid_argument(std::string(variable) + "=" + requested + " names no GEMM backend (known: " + known +
                              ")");
}

}  // namespace

const GemmBackend& SelectedGemmBackend(GemmOperands operands) {
  if (operands == GemmOperands::kBfloat16) {
    if (const GemmBackend* requested = RequestedBackend(kBf16BackendVariable, kBf16Backends)) return *requested;
    return Avx512Bf16GemmBackend().Supported() ? Avx512Bf16GemmBackend() : PortableBf16GemmBackend();
  }
  if (const GemmBackend* requested = RequestedBackend(kBackendVariable, kBackends)) return *requested;
  static const GemmBackend& fastest = FastestBackend();
  return fastest;
}

void PackedMatrix::AlignedFree::operator()(float* p) const { std::free(p); }

PackedMatrix::PackedMatrix(const ThreadPool& pool, int64_t k, int64_t n, const float* b, const GemmBackend& backend)
    : backend_(&backend), k_(k), n_(n), block_columns_(BlockColumns(pool, backend, n)) {
  const int64_t num_blocks = (n + block_columns_ - 1) / block_columns_;
  std::vector<int64_t> offsets(num_blocks);  // in bytes, each a multiple of kMemoryAlignment
  int64_t bytes = 0;
  for (int64_t block = 0; block < num_blocks; ++block) {
    offsets[block] = bytes;
    const int64_t cols = std::min(block_columns_, n - block * block_columns_);
    bytes += (backend.PackedBytes(k, cols) + kMemoryAlignment - 1) / kMemoryAlignment * kMemoryAlignment;
  }
  void* storage = nullptr;
  if (posix_memalign(&storage, kHugePageBytes, static_cast<size_t>(bytes)) != 0) throw std::bad_alloc();
  storage_.reset(static_cast<float*>(storage));
  // Advice only: where the kernel has no huge page to give, the weights stay on 4 KiB pages.
  madvise(storage, static_cast<size_t>(bytes / kHugePageBytes * kHugePageBytes), MADV_HUGEPAGE);
  for (int64_t offset : offsets) blocks_.push_back(storage_.get() + offset / static_cast<int64_t>(sizeof(float)));
  // One row of tiles: the packed layout does not depend on the rows of C.
  ForEachTile(pool, 1, n, block_columns_, 2.0 * k * n, [&](const GemmTile& tile) {
    backend.Pack(k, tile.col_end - tile.col_begin, b + tile.col_begin, n, blocks_[tile.block]);
  });
}

void ParallelGemm(const ThreadPool& pool, int64_t m, const float* a, const PackedMatrix& b, float* c,
                  const GemmEpilogue& epilogue, const GemmRowsEpilogue& rows_epilogue) {
  const int64_t n = b.n_, k = b.k_;
  const int64_t num_blocks = static_cast<int64_t>(b.blocks_.size());
  // Column blocks finished per row tile; the thread that finishes the last one runs rows_epilogue (the counter's
  // read-modify-write orders the other threads' stores to C before it).
  std::vector<std::atomic<int64_t>> finished(rows_epilogue ? RowTiles(m) : 0);
  ForEachTile(pool, m, n, b.block_columns_, 2.0 * m * n * k, [&](const GemmTile& tile) {
    b.backend_->Multiply(tile.row_end - tile.row_begin, tile.col_end - tile.col_begin, k, a + tile.row_begin * k, k,
                         b.blocks_[tile.block], c + tile.row_begin * n + tile.col_begin, n);
    if (epilogue) epilogue(tile);
    if (rows_epilogue && finished[tile.row_tile].fetch_add(1) + 1 == num_blocks) {
      rows_epilogue(tile.row_begin, tile.row_end);
    }
  });
}

}  // namespace cpu
}  // namespace bertserve

namespace {

// The name of the backend weights packed now for `operands` would use, or null when a variable names none this CPU
// can run.
const char* SelectedBackendName(bertserve::cpu::GemmOperands operands) {
  try {
    return bertserve::cpu::SelectedGemmBackend(operands).name();
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace

// For tools and tests through ctypes: the backends weights packed now would use, for float and for bf16 operands
// (bench/cpu_encoder.py records them beside its timings), and one product through the selected backend.
extern "C" __attribute__((visibility("default"))) const char* bertserve_cpu_gemm_backend() {
  return SelectedBackendName(bertserve::cpu::GemmOperands::kFloat);
}

extern "C" __attribute__((visibility("default"))) const char* bertserve_cpu_gemm_bf16_backend() {
  return SelectedBackendName(bertserve::cpu::GemmOperands::kBfloat16);
}

// c[m, n] = a[m, k] * b[k, n] (row-major, contiguous) on the calling thread, with bf16 operands when `bfloat16`
// is not 0; 0 on success, -1 when no backend could be selected or allocated.
extern "C" __attribute__((visibility("default"))) int bertserve_cpu_gemm(int bfloat16, int64_t m, int64_t n,
                                                                         int64_t k, const float* a,
                                                                         const float* b, float* c) {
  using namespace bertserve::cpu;
  try {
    const ThreadPool serial = SerialPool();
    const PackedMatrix packed(serial, k, n, b,
                              SelectedGemmBackend(bfloat16 != 0 ? GemmOperands::kBfloat16 : GemmOperands::kFloat));
    ParallelGemm(serial, m, a, packed, c, {});
  } catch (const std::exception&) {
    return -1;
  }
  return 0;
}
