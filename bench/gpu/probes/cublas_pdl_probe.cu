// Probe: can a cuBLASLt kernel join the programmatic launch chain when its captured graph edge is made
// programmatic? cuBLASLt launches its kernels without programmatic stream serialization, so in a graph each one
// waits for the kernel before it to finish and then for its own launch; made programmatic, the edge lets it be
// scheduled while that kernel drains, which is only correct if the cuBLASLt kernel itself waits
// (griddepcontrol.wait) before it reads its operands.
//
// Correctness: a writer kernel lets its dependents launch at once, spins ~20 us, then writes X with a sign that
// flips every replay; the GEMM after it reads X. A GEMM that does not wait reads the previous replay's X, and
// its output has the wrong sign. Timing: a graph of 12 (writer without the spin, GEMM) pairs, the writers launched
// as programmatic dependents of the GEMMs, with the writer -> GEMM edges as captured and made programmatic.
// Prints one JSON line per (shape, variant).
//   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I. -I$CUBLAS/include \
//     bench/gpu/probes/cublas_pdl_probe.cu -L$CUBLAS/lib -lcublasLt -o cublas_pdl_probe
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/gpu/probes/probe_check.h"
#include "bench/gpu/probes/probe_cublas.h"

namespace {

constexpr int kPairsPerGraph = 12;
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// X = sign * base, sign = (-1)^phase; block 0 advances the phase once every block has read it (the next writer is
// stream-ordered after the GEMM, which is after this kernel).
__global__ void WriterKernel(const __half* base, __half* x, size_t count, const int* phase, long long spin_cycles) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  const __half sign = __float2half((*phase & 1) ? -1.f : 1.f);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    x[i] = __hmul(base[i], sign);
  }
}

__global__ void AdvancePhaseKernel(int* phase) { ++*phase; }

void LaunchWriter(const __half* base, __half* x, size_t count, const int* phase, long long spin, cudaStream_t s) {
  LaunchWith({ProgrammaticLaunch()}, WriterKernel, dim3(132), dim3(256), 0, s, base, x, count, phase, spin);
}

// The heuristic's first algorithm for Y[t, n] = X[t, k] @ W[k, n]; the probe ends when there is none.
CublasGemm MakeMatmul(cublasLtHandle_t handle, int t, int n, int k) {
  CublasGemm m = MakeCublasGemm(handle, t, n, k, nullptr, kWorkspaceBytes, 1);
  if (m.found == 0) {
    printf("no algorithm\n");
    exit(1);
  }
  return m;
}

void RunMatmul(const CublasGemm& m, const __half* w, const __half* x, __half* y, void* workspace, cudaStream_t s) {
  if (!RunCublasGemm(m, 0, w, x, y, workspace, s)) {
    printf("matmul failed\n");
    exit(1);
  }
}

// Makes every edge from a kernel node into a kernel node that is not programmatic yet (the captured writer ->
// cuBLASLt edges) programmatic, triggered when the upstream kernel's blocks have all let dependents launch.
int MakeEdgesIntoForeignKernelsProgrammatic(cudaGraph_t graph) {
  size_t count = 0;
  CK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> from(count), to(count);
  std::vector<cudaGraphEdgeData> data(count);
  CK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &count));
  int changed = 0;
  for (size_t i = 0; i < count; ++i) {
    cudaGraphNodeType from_type, to_type;
    CK(cudaGraphNodeGetType(from[i], &from_type));
    CK(cudaGraphNodeGetType(to[i], &to_type));
    if (from_type != cudaGraphNodeTypeKernel || to_type != cudaGraphNodeTypeKernel) continue;
    if (data[i].type == cudaGraphDependencyTypeProgrammatic) continue;
    // The runtime cannot describe cuBLASLt's kernels (launched through the driver): only ours have parameters here.
    cudaKernelNodeParams params{};
    if (cudaGraphKernelNodeGetParams(from[i], &params) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (params.func != reinterpret_cast<void*>(&WriterKernel)) continue;
    CK(cudaGraphRemoveDependencies(graph, &from[i], &to[i], &data[i], 1));
    cudaGraphEdgeData programmatic{};
    programmatic.type = cudaGraphDependencyTypeProgrammatic;
    programmatic.from_port = cudaGraphKernelNodePortProgrammatic;
    CK(cudaGraphAddDependencies(graph, &from[i], &to[i], &programmatic, 1));
    ++changed;
  }
  return changed;
}

}  // namespace

int main() {
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasLtHandle_t handle;
  cublasLtCreate(&handle);
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const long long spin = static_cast<long long>(clock_khz) * 20 / 1000;  // ~20 us
  struct Shape {
    const char* name;
    int t, n, k;
  };
  const Shape shapes[] = {{"qkv", 736, 2304, 768}, {"attn_out", 736, 768, 768}, {"ffn_out", 736, 768, 3072},
                          {"ffn_out", 192, 768, 3072}};
  __half *w, *base, *x, *y, *y_ref;
  int* phase;
  void* workspace;
  CK(cudaMalloc(&w, size_t(3072) * 3072 * 2));
  CK(cudaMalloc(&base, size_t(1024) * 3072 * 2));
  CK(cudaMalloc(&x, size_t(1024) * 3072 * 2));
  CK(cudaMalloc(&y, size_t(1024) * 3072 * 2));
  CK(cudaMalloc(&y_ref, size_t(1024) * 3072 * 2));
  CK(cudaMalloc(&phase, sizeof(int)));
  CK(cudaMalloc(&workspace, kWorkspaceBytes));
  FillKernel<<<1024, 256>>>(w, size_t(3072) * 3072, 1);
  FillKernel<<<1024, 256>>>(base, size_t(1024) * 3072, 2);
  CK(cudaDeviceSynchronize());
  for (const Shape& sh : shapes) {
    const CublasGemm m = MakeMatmul(handle, sh.t, sh.n, sh.k);
    const size_t x_count = size_t(sh.t) * sh.k, y_count = size_t(sh.t) * sh.n;
    // The reference: phase 0's output.
    CK(cudaMemset(phase, 0, sizeof(int)));
    LaunchWriter(base, x, x_count, phase, 0, stream);
    RunMatmul(m, w, x, y_ref, workspace, stream);
    CK(cudaStreamSynchronize(stream));
    std::vector<__half> want(y_count), got(y_count);
    CK(cudaMemcpy(want.data(), y_ref, y_count * 2, cudaMemcpyDeviceToHost));

    for (const bool programmatic : {false, true}) {
      // Correctness: writer (spinning) -> GEMM -> phase + 1, replayed 20 times, each output checked.
      cudaGraph_t graph;
      CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      LaunchWriter(base, x, x_count, phase, spin, stream);
      RunMatmul(m, w, x, y, workspace, stream);
      AdvancePhaseKernel<<<1, 1, 0, stream>>>(phase);
      CK(cudaStreamEndCapture(stream, &graph));
      const int changed = programmatic ? MakeEdgesIntoForeignKernelsProgrammatic(graph) : 0;
      cudaGraphExec_t exec;
      CK(cudaGraphInstantiate(&exec, graph, 0));
      CK(cudaMemset(phase, 0, sizeof(int)));
      int wrong_replays = 0;
      float worst = 0.f;
      for (int r = 0; r < 20; ++r) {
        CK(cudaGraphLaunch(exec, stream));
        CK(cudaStreamSynchronize(stream));
        CK(cudaMemcpy(got.data(), y, y_count * 2, cudaMemcpyDeviceToHost));
        const float sign = (r & 1) ? -1.f : 1.f;
        float err = 0.f;
        for (size_t i = 0; i < y_count; ++i) {
          err = std::max(err, std::abs(__half2float(got[i]) - sign * __half2float(want[i])));
        }
        worst = std::max(worst, err);
        wrong_replays += err > 1e-3f;
      }
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));

      // Timing: kPairsPerGraph (writer, GEMM) pairs, no spin; best of 20 replays after 5.
      CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kPairsPerGraph; ++i) {
        LaunchWriter(base, x, x_count, phase, 0, stream);
        RunMatmul(m, w, x, y, workspace, stream);
      }
      CK(cudaStreamEndCapture(stream, &graph));
      if (programmatic) MakeEdgesIntoForeignKernelsProgrammatic(graph);
      CK(cudaGraphInstantiate(&exec, graph, 0));
      const float best = BestReplayMs(exec, stream, 25, 5);
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
      printf("{\"gemm\": \"%s\", \"t\": %d, \"programmatic\": %s, \"edges_changed\": %d, \"wrong_replays\": %d, "
             "\"worst_abs_error\": %.3g, \"us_per_pair\": %.2f}\n",
             sh.name, sh.t, programmatic ? "true" : "false", changed, wrong_replays, worst,
             best * 1000.f / kPairsPerGraph);
      fflush(stdout);
    }
  }
  return 0;
}
