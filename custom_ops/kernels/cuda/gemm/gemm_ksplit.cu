// GemmKSplit (gemm.h): per shape, fp32 partial products over slices of k by a CUTLASS kernel in the launch chain,
// or 0 for Gemm's own plan; chosen by a rule or, when autotuning, by timing every (tile, split) on the real
// operands once against Gemm's plan.
#include <cuda_runtime.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "custom_ops/kernels/cuda/gemm/cutlass_gemm_runners.h"
#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/gemm/gemm_context.h"
#include "custom_ops/kernels/cuda/gemm/gpu_timer.h"

namespace bertserve {
namespace cuda {
namespace {

using cutlass_gemm::Problem;

const std::vector<cutlass_gemm::Runner>& AllRunners() {
  return cutlass_gemm::Runners(cutlass_gemm::Fused::kFp32Partials);
}

Problem WithSplits(Problem p, int splits) {
  p.k_splits = splits;
  return p;
}

// Without timing (the TF op, which sees a new token count per batch): a small tile with k / n slices where
// k > n, i.e. the FFN output (k = 4n), whose output tiles alone occupy n / 64 blocks; and where k = n (the attention
// output) up to kSquareSplitMaxTokens rows, 3 slices of the narrow tile up to kNarrowTileMaxTokens rows and 4 of
// the basic 64x64x64 tile above: what autotuning chose at up to 128 rows in most processes (commits 8a6892a and
// 8b4d31d).
constexpr int64_t kSquareSplitMaxTokens = 128;

KSplitPlan DefaultPlan(const Problem& p) {
  const bool square = p.k == p.n && p.m <= kSquareSplitMaxTokens;
  if (!square && (p.k <= p.n || p.k % p.n != 0 || p.k / p.n > kMaxKSplits)) return {};
  const bool narrow = p.m <= cutlass_gemm::kNarrowTileMaxTokens;
  const KSplitPlan plan = !square ? KSplitPlan{cutlass_gemm::DefaultSmallTile(p), static_cast<int>(p.k / p.n)}
                          : narrow ? KSplitPlan{cutlass_gemm::kBasicNarrowTile, 3}
                                   : KSplitPlan{cutlass_gemm::kBasicSmallTile, 4};
  return cutlass_gemm::Supports(WithSplits(p, plan.splits)) ? plan : KSplitPlan{};
}

// Enqueues the plan (Gemm's when splits == 0, its output [m, n] fp16 in the partials buffer); false when the
// CUTLASS configuration cannot run the shape (nothing launched).
bool Launch(GemmContext* context, const KSplitPlan& plan, const Problem& p, void* workspace, cudaStream_t stream) {
  if (plan.splits == 0) {
    Gemm<__half, __half>(context, p.x, p.w, nullptr, static_cast<__half*>(p.y), p.m, p.n, p.k, Epilogue::kNone,
                         workspace, stream);
    return true;
  }
  return AllRunners()[plan.runner].run(WithSplits(p, plan.splits), stream) == cutlass::Status::kSuccess;
}

// The fastest of Gemm's plan and every (tile, split) CUTLASS can take, each timed with the consumer after it (on
// the caller's stream; waits for the device). The first candidate, Gemm's plan, also makes that plan.
KSplitPlan FastestPlan(GemmContext* context, const Problem& p, void* workspace, cudaStream_t stream,
                       const std::function<void(int)>& consumer) {
  std::vector<KSplitPlan> candidates = {KSplitPlan{}};
  for (int runner = 0; runner < static_cast<int>(AllRunners().size()); ++runner) {
    for (int splits = 2; splits <= kMaxKSplits; ++splits) {
      if (cutlass_gemm::Supports(WithSplits(p, splits))) candidates.push_back({runner, splits});
    }
  }
  float best_ms = 1e30f;
  const int best = GpuTimer(stream).Fastest(
      static_cast<int>(candidates.size()),
      [&](int i) { return Launch(context, candidates[i], p, workspace, stream); },
      [&](int i) { consumer(candidates[i].splits); }, &best_ms);
  return best < 0 ? KSplitPlan{} : candidates[best];
}

}  // namespace

int GemmKSplit(GemmContext* context, const __half* x, const __half* w, float* partials, int64_t m, int64_t n,
               int64_t k, void* gemm_workspace, void* stream, const std::function<void(int parts)>& consumer) {
  const Problem p{x, w, nullptr, partials, m, n, k, SmCountOf(context)};
  if (m == 0 || m > kKSplitMaxTokens || !OptionsOf(context).custom_gemms || !cutlass_gemm::Supports(p)) return 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const ShapeKey key{m, n, k};
  const KSplitPlan plan = PlanFor(
      context, KSplitPlansOf(context), key, s, [&] { return DefaultPlan(p); },
      [&] { return FastestPlan(context, p, gemm_workspace, s, consumer); });
  if (plan.splits == 0) return 0;
  if (!Launch(context, plan, p, gemm_workspace, s)) {
    // A configuration CUTLASS declines for this shape (nothing was launched): Gemm's plan, from now on.
    ReplaceRefusedPlan(context, KSplitPlansOf(context), key, KSplitPlan{});
    return 0;
  }
  return plan.splits;
}

std::string DescribeKSplitPlans(GemmContext* context) {
  std::lock_guard<std::mutex> lock(PlanMutex(context));
  std::string out;
  for (const auto& [key, plan] : KSplitPlansOf(context)) {
    const auto& [m, n, k] = key;
    out += ShapeText(m, n, k) + " before a LayerNorm: " +
           (plan.splits == 0 ? std::string("Gemm's plan")
                             : std::string("CUTLASS ") + AllRunners()[plan.runner].name + ", " +
                                   std::to_string(plan.splits) + " fp32 k-slices") +
           "\n";
  }
  return out;
}

}  // namespace cuda
}  // namespace bertserve
