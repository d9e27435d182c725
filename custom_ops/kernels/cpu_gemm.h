// Matrix products of the CPU backend, behind one interface whatever computes them: C = A * B with B (the
// weights) packed once into the layout of a GEMM backend (PackedMatrix), one product per column block over the
// caller's thread pool, so TensorFlow's intra-op pool is the only set of threads. An unpacked B would be re-packed
// by every product, which costs as much as a sixth of the encoder's time at serving batch sizes.
//
// Float backends (GemmBackendNames): "mkl", Intel MKL's packed SGEMM (sequential threading layer), and "avx512",
// the library's own AVX-512 kernels over panels of B (cpu_gemm_avx512.cc), written for the 1-640-row products of
// serving, where MKL's dispatch on some CPUs (AMD's among them) leaves much of the FMA throughput unused. Which
// one packs is chosen per process by timing both on this CPU the first time one is needed, unless the environment
// variable BERTSERVE_CPU_GEMM names one (tests run every backend that way, whatever the machine would pick).
//
// bfloat16 backends (cpu_gemm_bf16.cc), for a model that asks for bf16 GEMM operands (GemmOperands): B packed as
// bf16, A rounded to bf16 per product, sums in float; "avx512_bf16" on CPUs with AVX512_BF16, "bf16_portable"
// (the same sums) elsewhere. Never chosen by timing, since they round differently from the float ones.
#ifndef BERTSERVE_KERNELS_CPU_GEMM_H_
#define BERTSERVE_KERNELS_CPU_GEMM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "custom_ops/kernels/bert_core.h"

namespace bertserve {
namespace cpu {

// A tile of C: rows [row_begin, row_end) of columns [col_begin, col_end), which is column block `block` of row
// tile `row_tile`.
struct GemmTile {
  int64_t block, row_tile, row_begin, row_end, col_begin, col_end;
};

// Runs on a finished tile of C, on the thread that computed it, while the tile is still in its cache.
using GemmEpilogue = std::function<void(const GemmTile& tile)>;

// Runs once per row tile of C, on rows [row_begin, row_end) of all n columns, on the thread that finished the last
// of the tile's column blocks: work on whole rows (a LayerNorm) without a parallel loop of its own.
using GemmRowsEpilogue = std::function<void(int64_t row_begin, int64_t row_end)>;

class GemmBackend;

// The backends this build has, usable on this CPU or not.
std::vector<std::string> GemmBackendNames();

// The backend PackedMatrix packs for. Float operands: BERTSERVE_CPU_GEMM when set (read at every call, so a
// process may compare backends), else the fastest on this CPU, measured once per process. bfloat16 operands:
// BERTSERVE_CPU_GEMM_BF16 when set (avx512_bf16 or bf16_portable, so tests run both on a CPU with the
// instruction), else avx512_bf16 where this CPU has AVX512_BF16, else bf16_portable. Throws
// std::invalid_argument naming the problem when a variable names no backend, or one this CPU cannot run.
const GemmBackend& SelectedGemmBackend(GemmOperands operands = GemmOperands::kFloat);

// The name of a backend, as BERTSERVE_CPU_GEMM takes it.
std::string GemmBackendName(const GemmBackend& backend);

// B [k, n] (row-major, contiguous) split into the column blocks ParallelGemm shards over, each block packed into
// the layout of `backend`, all blocks in one allocation on transparent huge pages where the kernel gives them.
// Immutable once built, so concurrent GEMMs may share it; it does not refer to b afterwards. Throws std::bad_alloc
// when the packed copy cannot be allocated.
class PackedMatrix {
 public:
  PackedMatrix(const ThreadPool& pool, int64_t k, int64_t n, const float* b,
               const GemmBackend& backend = SelectedGemmBackend());

 private:
  struct AlignedFree {
    void operator()(float* p) const;
  };
  friend void ParallelGemm(const ThreadPool& pool, int64_t m, const float* a, const PackedMatrix& b, float* c,
                           const GemmEpilogue& epilogue, const GemmRowsEpilogue& rows_epilogue);

  const GemmBackend* backend_;
  int64_t k_, n_, block_columns_;
  std::unique_ptr<float, AlignedFree> storage_;
  std::vector<float*> blocks_;  // into storage_
};

// C[m, n] = A[m, k] * B[k, n], all row-major and contiguous, B packed beforehand (A has B's k columns, C its n).
// Columns are split into about 2 * pool.num_threads blocks: each reads only its slice of B (the weights) and all of
// A (the tokens), which keeps the weight traffic, the dominant cost at serving batch sizes, at one pass. Beyond 512
// rows the rows are split into tiles too, each re-reading the weights once. epilogue and rows_epilogue may be
// empty; a tile's epilogue runs before its row tile's rows_epilogue.
void ParallelGemm(const ThreadPool& pool, int64_t m, const float* a, const PackedMatrix& b, float* c,
                  const GemmEpilogue& epilogue, const GemmRowsEpilogue& rows_epilogue = {});

}  // namespace cpu
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CPU_GEMM_H_
