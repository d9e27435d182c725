// GemmBiasGelu (gemm.h): per shape, a CUTLASS GEMM with bias + GELU in its epilogue or cuBLASLt + a GELU pass,
// chosen by a rule or, when autotuning, by timing every candidate on the real operands once.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/gemm_context.h"
#include "custom_ops/kernels/cuda/gemm_gelu_runners.h"
#include "custom_ops/kernels/cuda/gpu_timer.h"
#include "custom_ops/kernels/cuda/kernels.h"
#include "cutlass/kernel_hardware_info.h"

namespace bertserve {
namespace cuda {
namespace {

using gemm_gelu::Problem;
using gemm_gelu::Runner;

constexpr int kAutotuneTrials = 3;           // a candidate's time is its best of these (the GPU is shared)
constexpr float kAutotuneTrialMs = 1.0f;     // each trial repeats the candidate for about this long
constexpr int kSplitCandidates[] = {2, 3, 4, 6};
constexpr int64_t kMinKPerSplit = 128;
constexpr GeluPlan kCublasPlusPass{-1, 0};

const std::vector<Runner>& AllRunners() {
  static const std::vector<Runner> runners = [] {
    std::vector<Runner> all = gemm_gelu::CooperativeRunners();
    const std::vector<Runner>& pingpong = gemm_gelu::PingpongRunners();
    all.insert(all.end(), pingpong.begin(), pingpong.end());
    return all;
  }();
  return runners;
}

// Without timing (the TF op, which sees a new token count per batch): what autotuning chose on the H200 for the
// chit-chat FFN (bench/results/gpu_h200_bench.json, timing.gelu_plans): cuBLASLt + pass below 4,096 tokens, the
// wide cooperative tile from there, ping-pong 64x256 from 8,192.
GeluPlan DefaultPlan(int64_t m) {
  if (m < kFusedGeluMinTokens) return kCublasPlusPass;
  const std::string wanted = m < 2 * kFusedGeluMinTokens ? "cooperative 128x256x64 cluster 2x1"
                                                         : "ping-pong 64x256x64 cluster 2x1";
  const std::vector<Runner>& runners = AllRunners();
  for (int i = 0; i < static_cast<int>(runners.size()); ++i) {
    if (wanted == runners[i].name) return {i, 0};
  }
  return kCublasPlusPass;
}

std::string ShapeOf(const Problem& p) {
  return "GEMM + GELU [" + std::to_string(p.m) + "x" + std::to_string(p.k) + "] @ [" + std::to_string(p.k) + "x" +
         std::to_string(p.n) + "]";
}

// Enqueues the plan; returns false when a CUTLASS configuration cannot run this shape.
bool Launch(GemmContext* context, const GeluPlan& plan, const Problem& p, void* workspace, cudaStream_t stream) {
  if (plan.runner < 0) {
    Gemm<__half, __half>(context, p.x, p.w, nullptr, p.y, p.m, p.n, p.k, Epilogue::kNone, workspace, stream);
    LaunchBiasGelu<__half>(p.y, p.bias, p.m, p.n, stream);
    return true;
  }
  return AllRunners()[plan.runner].run(p, plan.splits, workspace, kGemmWorkspaceBytes, stream) ==
         cutlass::Status::kSuccess;
}

std::vector<GeluPlan> Candidates(int64_t k) {
  std::vector<GeluPlan> out{kCublasPlusPass};
  const std::vector<Runner>& runners = AllRunners();
  for (int i = 0; i < static_cast<int>(runners.size()); ++i) {
    out.push_back({i, 0});
    if (!runners[i].stream_k) continue;
    for (const int splits : kSplitCandidates) {
      if (k >= splits * kMinKPerSplit) out.push_back({i, splits});
    }
  }
  return out;
}

// The fastest candidate on these operands (queued on the caller's stream; waits for the device).
GeluPlan FastestPlan(GemmContext* context, const Problem& p, void* workspace, cudaStream_t stream) {
  GpuTimer timer(stream);
  float best_ms = 1e30f;
  GeluPlan best = kCublasPlusPass;
  for (const GeluPlan& plan : Candidates(p.k)) {
    if (!Launch(context, plan, p, workspace, stream)) continue;  // also the warm-up (and cuBLASLt's own planning)
    const auto call = [&] { Launch(context, plan, p, workspace, stream); };
    const float once = timer.MsPerCall(1, call);
    if (once < 0) continue;
    const int repeats = std::max(3, static_cast<int>(kAutotuneTrialMs / std::max(once, 1e-3f)));
    float ms = once;
    for (int trial = 0; trial < kAutotuneTrials; ++trial) {
      const float t = timer.MsPerCall(repeats, call);
      if (t >= 0) ms = std::min(ms, t);
    }
    if (ms < best_ms) {
      best_ms = ms;
      best = plan;
    }
  }
  cudaGetLastError();  // candidates whose launch was refused must not leave their error for the next launcher
  return best;
}

}  // namespace

void GemmBiasGelu(GemmContext* context, const __half* x, const __half* w, const __half* bias, __half* y, int64_t m,
                  int64_t n, int64_t k, void* gemm_workspace, void* stream) {
  if (m == 0) return;
  static const int sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count();
  const Problem p{x, w, bias, y, m, n, k, sm_count};
  if (n % 8 != 0 || k % 8 != 0) throw std::runtime_error(ShapeOf(p) + ": n and k must be multiples of 8");
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const GeluPlanKey key{m, n, k};
  GeluPlan plan{};
  bool planned = false;
  {
    std::lock_guard<std::mutex> lock(PlanMutex(context));
    const auto it = GeluPlansOf(context).find(key);
    if (it != GeluPlansOf(context).end()) {
      plan = it->second;
      planned = true;
    }
  }
  if (!planned) {
    plan = DefaultPlan(m);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(s, &capture);
    if (OptionsOf(context).autotune && capture == cudaStreamCaptureStatusNone) {
      plan = FastestPlan(context, p, gemm_workspace, s);
    }
    std::lock_guard<std::mutex> lock(PlanMutex(context));
    plan = GeluPlansOf(context).emplace(key, plan).first->second;
  }
  if (!Launch(context, plan, p, gemm_workspace, s)) {
    // A configuration CUTLASS declines for this shape (nothing was launched): cuBLASLt + the pass, from now on.
    cudaGetLastError();  // a refused launch must not leave its error for the next launcher's check
    {
      std::lock_guard<std::mutex> lock(PlanMutex(context));
      GeluPlansOf(context)[key] = kCublasPlusPass;
    }
    Launch(context, kCublasPlusPass, p, gemm_workspace, s);
  }
}

std::string DescribeGeluPlans(GemmContext* context) {
  std::lock_guard<std::mutex> lock(PlanMutex(context));
  std::string out;
  for (const auto& [key, plan] : GeluPlansOf(context)) {
    const auto& [m, n, k] = key;
    out += std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + ": ";
    if (plan.runner < 0) {
      out += "cuBLASLt + GELU pass\n";
    } else {
      out += std::string("CUTLASS ") + AllRunners()[plan.runner].name +
             (plan.splits > 1 ? ", split-K " + std::to_string(plan.splits) : std::string()) + "\n";
    }
  }
  return out;
}

}  // namespace cuda
}  // namespace bertserve
