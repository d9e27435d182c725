// Inside the CUDA core only: what GemmBiasGelu (gemm_gelu.cu) and GemmKSplit (gemm_ksplit.cu) keep in the
// GemmContext that gemm.cu owns.
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_GEMM_CONTEXT_H_
#define BERTSERVE_KERNELS_CUDA_GEMM_GEMM_CONTEXT_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "custom_ops/kernels/cuda/gemm.h"

namespace bertserve {
namespace cuda {

// (m, n, k)
using ShapeKey = std::tuple<int64_t, int64_t, int64_t>;

// How each GEMM + GELU shape runs: -1 is the plain GEMM + a GELU pass, else an index into cutlass_gemm::GeluRunners().
using GeluPlans = std::map<ShapeKey, int>;

// How each k-split shape runs: splits == 0 is Gemm's plan, else `splits` partial products by the runner (an index
// into cutlass_gemm::PartialsRunners()).
struct KSplitPlan {
  int runner = 0;
  int splits = 0;
};
using KSplitPlans = std::map<ShapeKey, KSplitPlan>;

// The context's lock (held while a plan is looked up or stored, never while one is timed) and its plans.
std::mutex& PlanMutex(GemmContext* context);
GeluPlans& GeluPlansOf(GemmContext* context);
KSplitPlans& KSplitPlansOf(GemmContext* context);

// The plan for `key` in `plans` (GeluPlans or KSplitPlans), made on the first call for it: `fastest()` when the
// context autotunes and `stream` is not being captured (it times candidates and waits for the device, so it runs
// without the lock), else `by_rule()`.
template <typename Plans, typename ByRule, typename Fastest>
typename Plans::mapped_type PlanFor(GemmContext* context, Plans& plans, const ShapeKey& key, cudaStream_t stream,
                                    const ByRule& by_rule, const Fastest& fastest) {
  {
    std::lock_guard<std::mutex> lock(PlanMutex(context));
    const auto it = plans.find(key);
    if (it != plans.end()) return it->second;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capture);
  const typename Plans::mapped_type plan =
      OptionsOf(context).autotune && capture == cudaStreamCaptureStatusNone ? fastest() : by_rule();
  std::lock_guard<std::mutex> lock(PlanMutex(context));
  return plans.emplace(key, plan).first->second;
}

// After the planned CUTLASS configuration refused its shape (nothing was launched): clears that launch's error, so
// that the next launcher's check does not see it, and makes `fallback` the shape's plan from now on.
template <typename Plans>
void ReplaceRefusedPlan(GemmContext* context, Plans& plans, const ShapeKey& key,
                        const typename Plans::mapped_type& fallback) {
  cudaGetLastError();
  std::lock_guard<std::mutex> lock(PlanMutex(context));
  plans[key] = fallback;
}

// "m x n x k", how DescribeGemmPlans and the lines below name a shape.
inline std::string ShapeText(int64_t m, int64_t n, int64_t k) {
  return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
}

// One line per GemmBiasGelu or GemmKSplit shape planned so far (DescribeGemmPlans' last lines).
std::string DescribeGeluPlans(GemmContext* context);
std::string DescribeKSplitPlans(GemmContext* context);

// The device's multiprocessor count, queried when the context was made (CUTLASS's persistent grids need it).
int SmCountOf(const GemmContext* context);

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_GEMM_CONTEXT_H_
