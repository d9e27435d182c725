// cuBLASLt GEMMs with a per-shape plan cache. See gemm.h.
#include "custom_ops/kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

namespace bertserve {
namespace cuda {
namespace {

void ThrowIfFailed(cublasStatus_t status, const std::string& what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error("cuBLASLt " + what + " failed with status " + std::to_string(static_cast<int>(status)));
  }
}

template <typename T>
cudaDataType_t DataType();
template <>
cudaDataType_t DataType<__half>() {
  return CUDA_R_16F;
}
template <>
cudaDataType_t DataType<float>() {
  return CUDA_R_32F;
}

// Descriptors and algorithm for one (m, n, k, type, with-bias) shape. Row-major Y = X W is computed as the
// column-major Y^T = W^T X^T, so cuBLAS sees A = W (n x k, ld n), B = X (k x m, ld k), D = Y (n x m, ld n),
// and the bias runs along cuBLAS's rows (our columns).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// (m, n, k, data type, with bias, pointer alignment): cuBLASLt picks kernels that may assume the alignment.
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int, bool, uint32_t>;

// Largest power of two up to 256 that divides every address (cuBLASLt's heuristics default to 256).
uint32_t CommonAlignment(std::initializer_list<const void*> pointers) {
  uint32_t alignment = 256;
  for (const void* p : pointers) {
    while (p != nullptr && reinterpret_cast<uintptr_t>(p) % alignment != 0) alignment >>= 1;
  }
  return alignment;
}

}  // namespace

struct GemmContext {
  cublasLtHandle_t handle = nullptr;
  std::mutex mutex;  // plans are shared; the bias pointer is set per call, so calls are serialised on the host
  std::map<PlanKey, Plan> plans;
};

GemmContext* CreateGemmContext() {
  auto* context = new GemmContext;
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

namespace {

template <typename T>
Plan MakePlan(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k, bool with_bias, uint32_t alignment) {
  const std::string shape = "GEMM [" + std::to_string(m) + "x" + std::to_string(k) + "] @ [" + std::to_string(k) +
                            "x" + std::to_string(n) + "]";
  Plan plan;
  const cudaDataType_t type = DataType<T>();
  ThrowIfFailed(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), shape + " descriptor");
  const cublasLtEpilogue_t epilogue = with_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  ThrowIfFailed(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
                shape + " epilogue");
  if (with_bias) {
    ThrowIfFailed(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)),
                  shape + " bias type");
  }
  ThrowIfFailed(cublasLtMatrixLayoutCreate(&plan.a, type, n, k, n), shape + " layout W");
  ThrowIfFailed(cublasLtMatrixLayoutCreate(&plan.b, type, k, m, k), shape + " layout X");
  ThrowIfFailed(cublasLtMatrixLayoutCreate(&plan.d, type, n, m, n), shape + " layout Y");

  cublasLtMatmulPreference_t preference = nullptr;
  ThrowIfFailed(cublasLtMatmulPreferenceCreate(&preference), shape + " preference");
  const uint64_t workspace = kGemmWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                       sizeof(workspace));
  for (const auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof(alignment));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.d, plan.d, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  ThrowIfFailed(status, shape + " heuristic");
  if (found == 0) throw std::runtime_error("cuBLASLt found no algorithm for " + shape);
  plan.algo = result.algo;
  return plan;
}

}  // namespace

template <typename T>
void GemmBias(GemmContext* context, const T* x, const T* w, const T* bias, T* y, int64_t m, int64_t n, int64_t k,
              void* gemm_workspace, void* stream) {
  if (m == 0) return;
  const bool with_bias = bias != nullptr;
  std::lock_guard<std::mutex> lock(context->mutex);
  const uint32_t alignment = CommonAlignment({x, w, bias, y});
  const PlanKey key{m, n, k, static_cast<int>(DataType<T>()), with_bias, alignment};
  auto it = context->plans.find(key);
  if (it == context->plans.end()) {
    it = context->plans.emplace(key, MakePlan<T>(context->handle, m, n, k, with_bias, alignment)).first;
  }
  Plan& plan = it->second;
  if (with_bias) {
    ThrowIfFailed(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "bias");
  }
  const float alpha = 1.0f, beta = 0.0f;
  ThrowIfFailed(cublasLtMatmul(context->handle, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, y, plan.d, y, plan.d,
                               &plan.algo, gemm_workspace, kGemmWorkspaceBytes, static_cast<cudaStream_t>(stream)),
                "matmul m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
}

template void GemmBias<__half>(GemmContext*, const __half*, const __half*, const __half*, __half*, int64_t, int64_t,
                               int64_t, void*, void*);
template void GemmBias<float>(GemmContext*, const float*, const float*, const float*, float*, int64_t, int64_t,
                              int64_t, void*, void*);

}  // namespace cuda
}  // namespace bertserve
