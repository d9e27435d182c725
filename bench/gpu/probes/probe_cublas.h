// What the probes that time cuBLASLt share: Y[t, n] = X[t, k] @ W[k, n] planned as the core plans it
// (column-major Z = W^T X^T; fp16 in and out, fp32 compute), with cuBLASLt's bias epilogue when given a bias, and
// the heuristic's candidate algorithms for it.
#ifndef BERTSERVE_BENCH_GPU_PROBES_PROBE_CUBLAS_H_
#define BERTSERVE_BENCH_GPU_PROBES_PROBE_CUBLAS_H_

#include <cublasLt.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

struct CublasGemm {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  size_t workspace_bytes;
  static constexpr int kMaxCandidates = 32;
  cublasLtMatmulHeuristicResult_t candidates[kMaxCandidates];  // the heuristic's order: [0] is its first guess
  int found;
};

// bias: nullptr for none. Asks the heuristic for up to max_candidates (<= kMaxCandidates) algorithms within
// workspace_bytes.
inline CublasGemm MakeCublasGemm(cublasLtHandle_t handle, int t, int n, int k, const __half* bias,
                                 size_t workspace_bytes, int max_candidates) {
  CublasGemm g{};
  g.handle = handle;
  g.workspace_bytes = workspace_bytes;
  cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    const cudaDataType_t half = CUDA_R_16F;
    cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &half, sizeof(half));
    cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  }
  cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16F, n, k, n);
  cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16F, k, t, k);
  cublasLtMatrixLayoutCreate(&g.d, CUDA_R_16F, n, t, n);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  const uint64_t ws = workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulAlgoGetHeuristic(handle, g.desc, g.a, g.b, g.d, g.d, pref,
                                 std::min(max_candidates, CublasGemm::kMaxCandidates), g.candidates, &g.found);
  cublasLtMatmulPreferenceDestroy(pref);
  return g;
}

// Enqueues the GEMM with candidate `candidate`; false when cuBLASLt refuses it.
inline bool RunCublasGemm(const CublasGemm& g, int candidate, const __half* w, const __half* x, __half* y,
                          void* workspace, cudaStream_t stream) {
  const float alpha = 1.f, beta = 0.f;
  return cublasLtMatmul(g.handle, g.desc, &alpha, w, g.a, x, g.b, &beta, y, g.d, y, g.d,
                        &g.candidates[candidate].algo, workspace, g.workspace_bytes,
                        stream) == CUBLAS_STATUS_SUCCESS;
}

inline void DestroyCublasGemm(CublasGemm& g) {
  cublasLtMatrixLayoutDestroy(g.a);
  cublasLtMatrixLayoutDestroy(g.b);
  cublasLtMatrixLayoutDestroy(g.d);
  cublasLtMatmulDescDestroy(g.desc);
}

#endif  // BERTSERVE_BENCH_GPU_PROBES_PROBE_CUBLAS_H_
