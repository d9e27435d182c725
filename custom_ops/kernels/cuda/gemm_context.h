// Inside the CUDA core only: what GemmBiasGelu (gemm_gelu.cu) keeps in the GemmContext that gemm.cu owns.
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_CONTEXT_H_
#define BERTSERVE_KERNELS_CUDA_GEMM_CONTEXT_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "custom_ops/kernels/cuda/gemm.h"

namespace bertserve {
namespace cuda {

// How each (m, n, k) runs: -1 is cuBLASLt + a GELU pass, else an index into cutlass_gemm::GeluRunners().
using GeluPlanKey = std::tuple<int64_t, int64_t, int64_t>;
using GeluPlans = std::map<GeluPlanKey, int>;

// The context's lock (held while a plan is looked up or stored, never while one is timed) and its GELU plans.
std::mutex& PlanMutex(GemmContext* context);
GeluPlans& GeluPlansOf(GemmContext* context);

// One line per GemmBiasGelu shape planned so far (DescribeGemmPlans' last lines).
std::string DescribeGeluPlans(GemmContext* context);

// The device's multiprocessor count, queried when the context was made (CUTLASS's persistent grids need it).
int SmCountOf(const GemmContext* context);

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_CONTEXT_H_
