// GEMMs with a per-shape plan cache and optional autotuning: cuBLASLt, or for fp16 a CUTLASS kernel in the
// programmatic launch chain where that is faster. See gemm.h.
#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/gemm/cutlass_gemm_runners.h"
#include "custom_ops/kernels/cuda/gemm/gemm_context.h"
#include "custom_ops/kernels/cuda/gemm/gpu_timer.h"

#include <cublasLt.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace bertserve {
namespace cuda {
namespace {

void ThrowIfFailed(cublasStatus_t status, const std::string& what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error("cuBLASLt " + what + " failed with status " + std::to_string(static_cast<int>(status)));
  }
}

template <typename T>
constexpr cudaDataType_t DataType() {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, float>, "fp16 or fp32 operands");
  return std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_32F;
}

// Descriptors and algorithm for one shape. Row-major Y = X W is computed as the column-major Y^T = W^T X^T, so
// cuBLAS sees A = W (n x k, ld n), B = X (k x m, ld k), D = Y (n x m, ld n), and the bias runs along cuBLAS's
// rows (our columns). cutlass_runner >= 0: the shape runs as that CUTLASS kernel instead (fp16 only).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  int cutlass_runner = -1;
};

// (m, n, k, input type, output type, epilogue, pointer alignment).
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int, int, int, uint32_t>;

// Largest power of two up to 256 that divides every address (cuBLASLt's kernels may assume the alignment).
uint32_t CommonAlignment(std::initializer_list<const void*> pointers) {
  uint32_t alignment = 256;
  for (const void* p : pointers) {
    while (p != nullptr && reinterpret_cast<uintptr_t>(p) % alignment != 0) alignment >>= 1;
  }
  return alignment;
}

cublasLtEpilogue_t ToCublas(Epilogue e) {
  switch (e) {
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    default:
      return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

}  // namespace

struct GemmContext {
  cublasLtHandle_t handle = nullptr;
  GemmOptions options;
  int sm_count = 0;
  std::mutex mutex;  // plans are shared; the bias pointer is set per call, so calls are serialised on the host
  std::map<PlanKey, Plan> plans;
  GeluPlans gelu_plans;
  KSplitPlans ksplit_plans;
};

GemmContext* CreateGemmContext(const GemmOptions& options) {
  auto* context = new GemmContext;
  context->options = options;
  int device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&context->sm_count, cudaDevAttrMultiProcessorCount, device);
  const cublasStatus_t status = cublasLtCreate(&context->handle);
  if (status != CUBLAS_STATUS_SUCCESS) {
    delete context;
    ThrowIfFailed(status, "cublasLtCreate");
  }
  return context;
}

void DestroyGemmContext(GemmContext* context) {
  if (context == nullptr) return;
  for (auto& entry : context->plans) {
    Plan& plan = entry.second;
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.d);
    cublasLtMatmulDescDestroy(plan.desc);
  }
  cublasLtDestroy(context->handle);
  delete context;
}

const GemmOptions& OptionsOf(const GemmContext* context) { return context->options; }

std::mutex& PlanMutex(GemmContext* context) { return context->mutex; }

GeluPlans& GeluPlansOf(GemmContext* context) { return context->gelu_plans; }

KSplitPlans& KSplitPlansOf(GemmContext* context) { return context->ksplit_plans; }

int SmCountOf(const GemmContext* context) { return context->sm_count; }

namespace {

// Small-m shapes (latency-bound, where cuBLASLt's first guess is furthest off) get a wider search.
constexpr int kAutotuneCandidates = 32;
constexpr int kAutotuneCandidatesLargeM = 8;
constexpr int64_t kLargeM = 4096;

struct Operands {
  const void *x, *w, *bias;
  void* y;
  void* workspace;
  cudaStream_t stream;
  const std::function<void()>& consumer;  // enqueued after each timed candidate, if any
};

// What GpuTimer::Fastest enqueues after each candidate: the caller's consumer of its output, if any.
auto ConsumerOf(const Operands& o) {
  return [&o](int) {
    if (o.consumer) o.consumer();
  };
}

void SetBias(Plan& plan, const void* bias) {
  ThrowIfFailed(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                "bias");
}

cublasStatus_t Run(cublasLtHandle_t handle, const Plan& plan, const cublasLtMatmulAlgo_t& algo, const Operands& o) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(handle, plan.desc, &alpha, o.w, plan.a, o.x, plan.b, &beta, o.y, plan.d, o.y, plan.d, &algo,
                        o.workspace, kGemmWorkspaceBytes, o.stream);
}

// The fastest of the heuristic's candidates on these operands (events on the caller's stream; waits for them);
// its time per call goes to *best_ms.
cublasLtMatmulAlgo_t FastestAlgo(cublasLtHandle_t handle, const Plan& plan,
                                 const cublasLtMatmulHeuristicResult_t* results, int found, const Operands& o,
                                 float* best_ms) {
  *best_ms = 1e30f;
  const int best = GpuTimer(o.stream).Fastest(
      found,
      [&](int i) {
        return results[i].state == CUBLAS_STATUS_SUCCESS &&
               Run(handle, plan, results[i].algo, o) == CUBLAS_STATUS_SUCCESS;
      },
      ConsumerOf(o), best_ms);
  return results[best < 0 ? 0 : best].algo;
}

cutlass_gemm::Problem CutlassProblem(const GemmContext* context, const Operands& o, int64_t m, int64_t n, int64_t k) {
  return {static_cast<const __half*>(o.x), static_cast<const __half*>(o.w), static_cast<const __half*>(o.bias),
          o.y, m, n, k, context->sm_count};
}

cutlass_gemm::Fused CutlassFused(Epilogue epilogue) {
  return epilogue == Epilogue::kBias ? cutlass_gemm::Fused::kBias : cutlass_gemm::Fused::kNone;
}

const std::vector<cutlass_gemm::Runner>& CutlassRunners(Epilogue epilogue) {
  return cutlass_gemm::Runners(CutlassFused(epilogue));
}

// The CUTLASS kernel an fp16 shape runs as instead of cuBLASLt, or -1: among the runners cutlass_gemm::TimedAt
// the shape's rows. Timed (cublas_ms >= 0, cuBLASLt's best time): the
// fastest runner that beats it. Untimed: cutlass_gemm::DefaultPlainRunner.
int ChooseCutlassRunner(const GemmContext* context, int64_t m, int64_t n, int64_t k, Epilogue epilogue,
                        const Operands& o, float cublas_ms) {
  const cutlass_gemm::Problem p = CutlassProblem(context, o, m, n, k);
  if (!context->options.custom_gemms || !cutlass_gemm::Supports(p)) return -1;
  if (cublas_ms < 0) return cutlass_gemm::DefaultPlainRunner(CutlassFused(epilogue), p);
  const std::vector<cutlass_gemm::Runner>& runners = CutlassRunners(epilogue);
  return GpuTimer(o.stream).Fastest(
      static_cast<int>(runners.size()),
      [&](int i) {
        return cutlass_gemm::TimedAt(runners[i], m) && runners[i].run(p, o.stream) == cutlass::Status::kSuccess;
      },
      ConsumerOf(o), &cublas_ms);
}

template <typename TIn, typename TOut>
Plan MakePlan(GemmContext* context, int64_t m, int64_t n, int64_t k, Epilogue epilogue, uint32_t alignment,
              const Operands& operands) {
  const std::string shape = "GEMM [" + std::to_string(m) + "x" + std::to_string(k) + "] @ [" + std::to_string(k) +
                            "x" + std::to_string(n) + "]";
  Plan plan;
  const cudaDataType_t in_type = DataType<TIn>(), out_type = DataType<TOut>();
  ThrowIfFailed(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), shape + " descriptor");
  const cublasLtEpilogue_t e = ToCublas(epilogue);
  ThrowIfFailed(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)),
                shape + " epilogue");
  if (epilogue != Epilogue::kNone) {
    ThrowIfFailed(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &in_type, sizeof(in_type)),
        shape + " bias type");
    SetBias(plan, operands.bias);
  }
  ThrowIfFailed(cublasLtMatrixLayoutCreate(&plan.a, in_type, n, k, n), shape + " layout W");
  ThrowIfFailed(cublasLtMatrixLayoutCreate(&plan.b, in_type, k, m, k), shape + " layout X");
  ThrowIfFailed(cublasLtMatrixLayoutCreate(&plan.d, out_type, n, m, n), shape + " layout Y");

  cublasLtMatmulPreference_t preference = nullptr;
  ThrowIfFailed(cublasLtMatmulPreferenceCreate(&preference), shape + " preference");
  const uint64_t workspace = kGemmWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                       sizeof(workspace));
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof(alignment));
  }
  cublasLtMatmulHeuristicResult_t results[kAutotuneCandidates] = {};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(context->handle, plan.desc, plan.a, plan.b, plan.d, plan.d, preference,
                                     !context->options.autotune ? 1
                                     : m >= kLargeM             ? kAutotuneCandidatesLargeM
                                                                : kAutotuneCandidates,
                                     results, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  ThrowIfFailed(status, shape + " heuristic");
  if (found == 0) throw std::runtime_error("cuBLASLt found no algorithm for " + shape);
  plan.algo = results[0].algo;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(operands.stream, &capture);
  float cublas_ms = -1.f;  // not timed
  if (context->options.autotune && capture == cudaStreamCaptureStatusNone) {
    plan.algo = FastestAlgo(context->handle, plan, results, found, operands, &cublas_ms);
  }
  if constexpr (std::is_same_v<TIn, __half> && std::is_same_v<TOut, __half>) {
    plan.cutlass_runner = ChooseCutlassRunner(context, m, n, k, epilogue, operands, cublas_ms);
  }
  return plan;
}

}  // namespace

template <typename TIn, typename TOut>
void Gemm(GemmContext* context, const TIn* x, const TIn* w, const TIn* bias, TOut* y, int64_t m, int64_t n,
          int64_t k, Epilogue epilogue, void* gemm_workspace, void* stream, const std::function<void()>& consumer) {
  if (m == 0) return;
  if (epilogue == Epilogue::kNone) bias = nullptr;
  const Operands operands{x, w, bias, y, gemm_workspace, static_cast<cudaStream_t>(stream), consumer};
  std::lock_guard<std::mutex> lock(context->mutex);
  const uint32_t alignment = CommonAlignment({x, w, bias, y});
  const PlanKey key{m, n, k, static_cast<int>(DataType<TIn>()), static_cast<int>(DataType<TOut>()),
                    static_cast<int>(epilogue), alignment};
  auto it = context->plans.find(key);
  if (it == context->plans.end()) {
    it = context->plans.emplace(key, MakePlan<TIn, TOut>(context, m, n, k, epilogue, alignment, operands)).first;
  }
  Plan& plan = it->second;
  if constexpr (std::is_same_v<TIn, __half> && std::is_same_v<TOut, __half>) {
    if (plan.cutlass_runner >= 0) {
      const cutlass_gemm::Problem p = CutlassProblem(context, operands, m, n, k);
      if (CutlassRunners(epilogue)[plan.cutlass_runner].run(p, operands.stream) == cutlass::Status::kSuccess) {
        return;
      }
      cudaGetLastError();       // refused, nothing launched: cuBLASLt from now on
      plan.cutlass_runner = -1;
    }
  }
  if (epilogue != Epilogue::kNone) SetBias(plan, bias);
  ThrowIfFailed(Run(context->handle, plan, plan.algo, operands),
                "matmul m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
}

std::string DescribeGemmPlans(GemmContext* context) {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(context->mutex);
    for (const auto& [key, plan] : context->plans) {
      const auto& [m, n, k, in_type, out_type, epilogue, alignment] = key;
      if (in_type != CUDA_R_16F || out_type != CUDA_R_16F) continue;
      out += ShapeText(m, n, k) + (epilogue == static_cast<int>(Epilogue::kBias) ? " + bias: " : ": ") +
             (plan.cutlass_runner < 0 ? std::string("cuBLASLt")
                                      : std::string("CUTLASS ") +
                                            CutlassRunners(static_cast<Epilogue>(epilogue))[plan.cutlass_runner].name) +
             "\n";
    }
  }
  return out + DescribeGeluPlans(context) + DescribeKSplitPlans(context);
}

template void Gemm<__half, __half>(GemmContext*, const __half*, const __half*, const __half*, __half*, int64_t,
                                   int64_t, int64_t, Epilogue, void*, void*, const std::function<void()>&);
template void Gemm<float, float>(GemmContext*, const float*, const float*, const float*, float*, int64_t, int64_t,
                                 int64_t, Epilogue, void*, void*, const std::function<void()>&);
template void Gemm<__half, float>(GemmContext*, const __half*, const __half*, const __half*, float*, int64_t,
                                  int64_t, int64_t, Epilogue, void*, void*, const std::function<void()>&);

}  // namespace cuda
}  // namespace bertserve
