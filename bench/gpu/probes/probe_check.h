// What the GPU probes share: the error check (a failed CUDA call prints where and why, and ends the probe), operands
// filled with small pseudo-random fp16 values, a graph's replay time, and launches with attributes.
#ifndef BERTSERVE_BENCH_GPU_PROBES_PROBE_CHECK_H_
#define BERTSERVE_BENCH_GPU_PROBES_PROBE_CHECK_H_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

// p[i] in [-0.05, 0.05): a hash of i and the seed.
__global__ void FillKernel(__half* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = (uint32_t(i) ^ seed) * 2654435761u;
    h ^= h >> 15;
    p[i] = __float2half((float(h & 0xffff) / 65536.f - 0.5f) * 0.1f);
  }
}

// The fastest of `replays` replays of the graph after the first `warmup`, in milliseconds (events on the stream).
inline float BestReplayMs(cudaGraphExec_t exec, cudaStream_t stream, int replays, int warmup) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int r = 0; r < replays; ++r) {
    CK(cudaEventRecord(a, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r >= warmup) best = std::min(best, ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return best;
}

// A graph of `launches` calls, call i on weight copy i % copies, replayed 8 times; microseconds per call, best of
// the replays after the first 3 (the GEMM probes: back-to-back launches with the weights rotating through copies
// too large for L2 together, as in a forward).
template <typename Launch>
float GraphMicros(cudaStream_t stream, int copies, int launches, const Launch& launch) {
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  bool ok = true;
  for (int i = 0; i < launches; ++i) ok = launch(i % copies) && ok;
  CK(cudaStreamEndCapture(stream, &graph));
  if (!ok) {
    cudaGraphDestroy(graph);
    cudaGetLastError();
    return -1.f;
  }
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const float best = BestReplayMs(exec, stream, 8, 3);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return best * 1000.f / launches;
}

// Launch attributes the probes combine: programmatic dependent launch (the core's launch chain) and cooperative
// launch (every block resident at once).
inline cudaLaunchAttribute ProgrammaticLaunch() {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return attribute;
}
inline cudaLaunchAttribute CooperativeLaunch() {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  return attribute;
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) with `attributes`.
template <typename... KernelArgs, typename... Args>
void LaunchWith(std::vector<cudaLaunchAttribute> list, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                size_t shared_bytes, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = list.data();
  config.numAttrs = static_cast<unsigned>(list.size());
  CK(cudaLaunchKernelEx(&config, kernel, args...));
}

#endif  // BERTSERVE_BENCH_GPU_PROBES_PROBE_CHECK_H_
