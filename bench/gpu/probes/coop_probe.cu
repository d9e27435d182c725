// Probe: can a cooperative kernel (every block resident at once, so grid-wide barriers are safe) also be a
// programmatic dependent launch inside a captured graph, and what does a grid barrier cost there? The first-token
// tail kernel tried in commit e108f22 (reverted) rested on both.
//
// A producer kernel (8 blocks, the launch chain's wait and trigger, then a short spin and an increment of X)
// alternates 20 times in one graph with a consumer of 128 blocks of 256 threads and 90 KB of shared memory each
// (copied before its wait, as a kernel staging weights would), launched cooperative, with and without the
// programmatic attribute, and with 0 or 3 grid barriers (each block writes a value after its wait, reads a
// neighbour's after the barrier). Correctness: after one replay the last consumer's outputs match X as the 20
// producers left it. Timing: the best of 30 replays, per producer + consumer pair. Prints one JSON line per variant.
//   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I. bench/gpu/probes/coop_probe.cu -o coop_probe
#include <cooperative_groups.h>

#include <cstdio>
#include <vector>

#include "bench/gpu/probes/probe_check.h"

namespace cg = cooperative_groups;

constexpr int kBlocks = 128, kThreads = 256, kValues = 4096, kPairs = 20;
constexpr int kStaged = 90 * 1024 / 16;  // uint4 per block

__global__ void Producer(float* x, int n, int spin) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += 1.f;
}

template <int kBarriers>
__global__ void Consumer(const float* x, int n, float* out, const uint4* staged_in) {
  extern __shared__ uint4 staged[];
  for (int i = threadIdx.x; i < kStaged; i += blockDim.x) staged[i] = staged_in[blockIdx.x * kStaged + i];
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const cg::grid_group grid = cg::this_grid();
  __syncthreads();
  float acc = 0.f;
  for (int s = 0; s < kBarriers; ++s) {
    if (threadIdx.x == 0) out[blockIdx.x + s * gridDim.x] = x[(blockIdx.x * 7 + s) % n] + float(staged[0].x);
    grid.sync();
    acc += __ldcg(out + (blockIdx.x + 1) % gridDim.x + s * gridDim.x);
  }
  if (threadIdx.x == 0) out[kBarriers * gridDim.x + blockIdx.x] = acc + x[blockIdx.x % n];
}

void LaunchProducer(cudaStream_t stream, float* x, int spin) {
  LaunchWith({ProgrammaticLaunch()}, Producer, dim3(8), dim3(128), 0, stream, x, kValues, spin);
}

void LaunchConsumer(cudaStream_t stream, bool programmatic, int barriers, const float* x, float* out,
                    const uint4* staged) {
  std::vector<cudaLaunchAttribute> attributes = {CooperativeLaunch()};
  if (programmatic) attributes.push_back(ProgrammaticLaunch());
  const size_t bytes = kStaged * sizeof(uint4);
  if (barriers == 0) {
    LaunchWith(attributes, Consumer<0>, dim3(kBlocks), dim3(kThreads), bytes, stream, x, kValues, out, staged);
  } else {
    LaunchWith(attributes, Consumer<3>, dim3(kBlocks), dim3(kThreads), bytes, stream, x, kValues, out, staged);
  }
}

int main() {
  float *x, *out;
  uint4* staged;
  CK(cudaMalloc(&x, kValues * sizeof(float)));
  CK(cudaMalloc(&out, 4 * kBlocks * sizeof(float)));
  CK(cudaMalloc(&staged, kBlocks * kStaged * sizeof(uint4)));
  CK(cudaMemset(x, 0, kValues * sizeof(float)));
  CK(cudaMemset(staged, 0, kBlocks * kStaged * sizeof(uint4)));
  CK(cudaFuncSetAttribute(Consumer<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, kStaged * sizeof(uint4)));
  CK(cudaFuncSetAttribute(Consumer<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, kStaged * sizeof(uint4)));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const bool programmatic : {false, true}) {
    for (const int barriers : {0, 3}) {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kPairs; ++i) {
        LaunchProducer(stream, x, 500);
        LaunchConsumer(stream, programmatic, barriers, x, out, staged);
      }
      CK(cudaStreamEndCapture(stream, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      CK(cudaGraphLaunch(exec, stream));
      CK(cudaStreamSynchronize(stream));
      std::vector<float> xs(kValues), outs(4 * kBlocks);
      CK(cudaMemcpy(xs.data(), x, kValues * sizeof(float), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(outs.data(), out, outs.size() * sizeof(float), cudaMemcpyDeviceToHost));
      int wrong = 0;
      for (int b = 0; b < kBlocks; ++b) {
        float expect = xs[b % kValues];
        for (int s = 0; s < barriers; ++s) expect += xs[(((b + 1) % kBlocks) * 7 + s) % kValues];
        wrong += outs[barriers * kBlocks + b] != expect;
      }
      const float ms = BestReplayMs(exec, stream, 30, 3);
      printf("{\"consumer\": \"cooperative%s\", \"grid_barriers\": %d, \"wrong_outputs\": %d, \"blocks\": %d, "
             "\"us_per_pair\": %.3f}\n",
             programmatic ? " + programmatic" : "", barriers, wrong, kBlocks, ms * 1000.f / kPairs);
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
    }
  }
  return 0;
}
