// Inside the CUDA core only: what GemmBiasGelu (gemm_gelu.cu) keeps in the GemmContext that gemm.cu owns.
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_CONTEXT_H_
#define BERTSERVE_KERNELS_CUDA_GEMM_CONTEXT_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "custom_ops/kernels/cuda/gemm.h"

namespace bertserve {
namespace cuda {

// How one shape runs: runner < 0 is cuBLASLt + a GELU pass, else an index into the CUTLASS runners (cooperative
// then ping-pong) with its split count.
struct GeluPlan {
  int runner;
  int splits;
};

// (m, n, k).
using GeluPlanKey = std::tuple<int64_t, int64_t, int64_t>;
using GeluPlans = std::map<GeluPlanKey, GeluPlan>;

// The context's lock (held while a plan is looked up or stored, never while one is timed) and its GELU plans.
std::mutex& PlanMutex(GemmContext* context);
GeluPlans& GeluPlansOf(GemmContext* context);

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_CONTEXT_H_
