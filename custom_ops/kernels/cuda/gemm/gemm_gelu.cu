// GemmBiasGelu (gemm.h): per shape, a CUTLASS GEMM with bias + GELU in its epilogue or the plain GEMM (Gemm, which
// has a plan of its own) + a GELU pass, chosen by a rule or, when autotuning, by timing every candidate on the real
// operands once.
#include <cuda_runtime.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/gemm/gemm_context.h"
#include "custom_ops/kernels/cuda/gemm/cutlass_gemm_runners.h"
#include "custom_ops/kernels/cuda/gemm/gpu_timer.h"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

using cutlass_gemm::Problem;
using cutlass_gemm::Runner;

constexpr int kGemmPlusPass = -1;

const std::vector<Runner>& AllRunners() { return cutlass_gemm::Runners(cutlass_gemm::Fused::kBiasGelu); }

int RunnerNamed(const char* name) {
  const int index = cutlass_gemm::RunnerIndex(cutlass_gemm::Fused::kBiasGelu, name);
  return index < 0 ? kGemmPlusPass : index;
}

// Without timing (the TF op, which sees a new token count per batch): what autotuning chose on the H200 for the
// chit-chat FFN (n = 3072, k = 768). A small tile for a few hundred tokens (cutlass_gemm::SmallTileByDefault; up to
// kNarrowTileMaxTokens the narrow ping-pong tile, chosen at up to 64 rows once timed with the FFN-output GEMM
// after it; commits 060d068 and 8b4d31d). Below kWideTileMinTokens, the widest tall tile whose blocks fill at least
// cutlass_gemm::kMinWaveFill of the waves they take (TallTilePlan), else GEMM + pass; then 128x256, ping-pong
// 128x128 from 8,192, ping-pong 64x256 from 32,768. These rules give the autotuner's choice at every token bucket
// it was timed at (commit 633f8a1).
constexpr int64_t kWideTileMinTokens = 4096;

int TallTilePlan(const Problem& p) {
  struct TallTile {
    int64_t features, tokens;
    const char* runner;
  };
  constexpr TallTile kWidestFirst[] = {{256, 128, "cooperative 256x128x64 cluster 1x2"},
                                       {256, 96, "cooperative 256x96x64"},
                                       {256, 80, "cooperative 256x80x64"}};
  for (const TallTile& tile : kWidestFirst) {
    if (cutlass_gemm::WaveFill(p, tile.features, tile.tokens) >= cutlass_gemm::kMinWaveFill) {
      return RunnerNamed(tile.runner);
    }
  }
  return kGemmPlusPass;
}

int DefaultPlan(const Problem& p) {
  if (cutlass_gemm::SmallTileByDefault(p)) {
    return p.m <= cutlass_gemm::kNarrowTileMaxTokens ? cutlass_gemm::kNarrowTile : cutlass_gemm::DefaultSmallTile(p);
  }
  if (p.m < kWideTileMinTokens) return TallTilePlan(p);
  if (p.m < 2 * kWideTileMinTokens) return RunnerNamed("cooperative 128x256x64 cluster 2x1");
  return RunnerNamed(p.m < 8 * kWideTileMinTokens ? "ping-pong 128x128x64 cluster 2x1"
                                                  : "ping-pong 64x256x64 cluster 2x1");
}

// Enqueues the plan; returns false when a CUTLASS configuration cannot run this shape.
bool Launch(GemmContext* context, int plan, const Problem& p, void* workspace, cudaStream_t stream) {
  if (plan == kGemmPlusPass) {
    __half* y = static_cast<__half*>(p.y);
    Gemm<__half, __half>(context, p.x, p.w, nullptr, y, p.m, p.n, p.k, Epilogue::kNone, workspace, stream);
    LaunchBiasGelu<__half>(y, p.bias, p.m, p.n, stream);
    return true;
  }
  return AllRunners()[plan].run(p, stream) == cutlass::Status::kSuccess;
}

// The fastest candidate on these operands, each followed by `consumer` when given (queued on the caller's stream;
// waits for the device). Candidate i is plan i - 1 (kGemmPlusPass first); its warm-up also makes the plain GEMM's own
// plan. The CUTLASS configurations are candidates where cutlass_gemm::TimedAt the shape's rows (above 256 all but
// the small tiles).
int FastestPlan(GemmContext* context, const Problem& p, void* workspace, cudaStream_t stream,
                const std::function<void()>& consumer) {
  float best_ms = 1e30f;
  const int best = GpuTimer(stream).Fastest(
      static_cast<int>(AllRunners().size()) + 1,
      [&](int i) {
        const int plan = i - 1;
        if (plan != kGemmPlusPass && !cutlass_gemm::TimedAt(AllRunners()[plan], p.m)) return false;
        return Launch(context, plan, p, workspace, stream);
      },
      [&](int) {
        if (consumer) consumer();
      },
      &best_ms);
  return best < 0 ? kGemmPlusPass : best - 1;
}

}  // namespace

void GemmBiasGelu(GemmContext* context, const __half* x, const __half* w, const __half* bias, __half* y, int64_t m,
                  int64_t n, int64_t k, void* gemm_workspace, void* stream, const std::function<void()>& consumer) {
  if (m == 0) return;
  const Problem p{x, w, bias, y, m, n, k, SmCountOf(context)};
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (!cutlass_gemm::Supports(p)) {  // not for CUTLASS's TMA
    Launch(context, kGemmPlusPass, p, gemm_workspace, s);
    return;
  }
  const ShapeKey key{m, n, k};
  const int plan = PlanFor(
      context, GeluPlansOf(context), key, s, [&] { return DefaultPlan(p); },
      [&] { return FastestPlan(context, p, gemm_workspace, s, consumer); });
  if (!Launch(context, plan, p, gemm_workspace, s)) {
    // A configuration CUTLASS declines for this shape (nothing was launched): GEMM + the pass, from now on.
    ReplaceRefusedPlan(context, GeluPlansOf(context), key, kGemmPlusPass);
    Launch(context, kGemmPlusPass, p, gemm_workspace, s);
  }
}

std::string DescribeGeluPlans(GemmContext* context) {
  std::lock_guard<std::mutex> lock(PlanMutex(context));
  std::string out;
  for (const auto& [key, plan] : GeluPlansOf(context)) {
    const auto& [m, n, k] = key;
    out += ShapeText(m, n, k) + " + bias + GELU: " +
           (plan == kGemmPlusPass ? std::string("GEMM + GELU pass") : std::string("CUTLASS ") +
                                                                              AllRunners()[plan].name) +
           "\n";
  }
  return out;
}

}  // namespace cuda
}  // namespace bertserve
