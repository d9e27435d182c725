// The k-split partial products' tile table (fp32 output): the plain GEMMs' tiles, in a translation unit of its own
// so that the CUTLASS instantiations build in parallel.
#include "custom_ops/kernels/cuda/gemm/cutlass_gemm_kernels.cuh"

namespace bertserve {
namespace cuda {
namespace cutlass_gemm {

const std::vector<Runner>& PartialsRunners() { return PlainRunners<Fused::kFp32Partials>(); }

}  // namespace cutlass_gemm
}  // namespace cuda
}  // namespace bertserve
