// Probe: what one dependent step of a CUDA graph costs on its own, the floor under the core's small-batch forward
// (~50 kernels one after another). Graphs of kSteps kernels, each depending on the one before, replayed back to
// back; per step = (time of the kSteps graph - time of the 1-kernel graph) / (kSteps - 1). Kernels: empty (one
// block), and a LayerNorm-sized row pass (each warp reading one 768-wide fp16 row of the previous kernel's output
// and writing its own: the traffic of a LayerNorm at 32 tokens) three ways; each launched in stream order or as a
// programmatic dependent (griddepcontrol.wait, then launch_dependents at once, as the core's kernels, or last).
// Prints one JSON line per variant.
//   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I. bench/gpu/probes/chain_probe.cu -o chain_probe
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench/gpu/probes/probe_check.h"

namespace {

constexpr int kSteps = 48;
constexpr int kRows = 32, kWidth = 768, kWarps = 4;

// How a kernel joins the chain: not at all (stream order), or waiting for the kernel before and then letting the
// next one launch, either at once (as the core's kernels do) or only after its own stores.
enum Join { kStreamOrder, kTriggerFirst, kTriggerLast };

__device__ __forceinline__ void Wait(int join) {
  if (join != kStreamOrder) asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (join == kTriggerFirst) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

__device__ __forceinline__ void TriggerLast(int join) {
  if (join == kTriggerLast) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

__global__ void EmptyKernel(int join) {
  Wait(join);
  TriggerLast(join);
}

// out[row] = in[row] * 0.5 + 1, one warp per row, half2 accesses: a pass with a LayerNorm's memory traffic. kUnrolled:
// every load of the row issued before the first store; otherwise a loop, one load-to-store round trip per step.
template <bool kUnrolled>
__global__ void RowKernel(const __half2* in, __half2* out, int join) {
  Wait(join);
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row < kRows) {
    constexpr int kPerLane = kWidth / 2 / 32;
    if constexpr (kUnrolled) {
      float2 v[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) v[i] = __half22float2(in[row * kWidth / 2 + i * 32 + lane]);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const float2 y = make_float2(v[i].x * 0.5f + 1.f, v[i].y * 0.5f + 1.f);
        out[row * kWidth / 2 + i * 32 + lane] = __float22half2_rn(y);
      }
    } else {
      for (int c = lane; c < kWidth / 2; c += 32) {
        const float2 v = __half22float2(in[row * kWidth / 2 + c]);
        out[row * kWidth / 2 + c] = __float22half2_rn(make_float2(v.x * 0.5f + 1.f, v.y * 0.5f + 1.f));
      }
    }
  }
  TriggerLast(join);
}

enum Kernel { kEmpty, kRowLoop, kRowUnrolled, kRowUnrolledWarpPerBlock };
const char* kKernelNames[] = {"empty, 1 block", "row pass 32 x 768 fp16, 8 blocks of 4 warps, load-store loop",
                              "row pass, 8 blocks of 4 warps, loads unrolled",
                              "row pass, 32 blocks of 1 warp, loads unrolled"};
const char* kJoinNames[] = {"stream order", "programmatic, trigger first", "programmatic, trigger last"};

void Launch(int kernel, int join, __half2* a, __half2* b, int step, cudaStream_t stream) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = join != kStreamOrder;
  cudaLaunchConfig_t config{};
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const __half2* in = step % 2 ? b : a;
  __half2* out = step % 2 ? a : b;
  const int warps = kernel == kRowUnrolledWarpPerBlock ? 1 : kWarps;
  config.gridDim = dim3(kernel == kEmpty ? 1 : kRows / warps);
  config.blockDim = dim3(warps * 32);
  if (kernel == kEmpty) {
    CK(cudaLaunchKernelEx(&config, EmptyKernel, join));
  } else if (kernel == kRowLoop) {
    CK(cudaLaunchKernelEx(&config, RowKernel<false>, in, out, join));
  } else {
    CK(cudaLaunchKernelEx(&config, RowKernel<true>, in, out, join));
  }
}

// Median microseconds of one replay of a graph of `steps` kernels, over 20 series of 50 back-to-back replays.
float GraphUs(int steps, int kernel, int join, __half2* a, __half2* b, cudaStream_t stream) {
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < steps; ++i) Launch(kernel, join, a, b, i, stream);
  CK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  for (int i = 0; i < 200; ++i) CK(cudaGraphLaunch(exec, stream));
  std::vector<float> series;
  for (int s = 0; s < 20; ++s) {
    CK(cudaEventRecord(start, stream));
    for (int i = 0; i < 50; ++i) CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(stop, stream));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    series.push_back(ms * 1000.f / 50);
  }
  std::sort(series.begin(), series.end());
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
  return series[series.size() / 2];
}

}  // namespace

int main() {
  __half2 *a, *b;
  CK(cudaMalloc(&a, kRows * kWidth * 2));
  CK(cudaMalloc(&b, kRows * kWidth * 2));
  CK(cudaMemset(a, 0, kRows * kWidth * 2));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int kernel = kEmpty; kernel <= kRowUnrolledWarpPerBlock; ++kernel) {
    for (int join = kStreamOrder; join <= kTriggerLast; ++join) {
      const float one = GraphUs(1, kernel, join, a, b, stream);
      const float many = GraphUs(kSteps, kernel, join, a, b, stream);
      printf("{\"kernel\": \"%s\", \"launch\": \"%s\", \"graph_1_us\": %.2f, \"graph_%d_us\": %.2f, "
             "\"us_per_step\": %.3f}\n",
             kKernelNames[kernel], kJoinNames[join], one, kSteps, many, (many - one) / (kSteps - 1));
    }
  }
  return 0;
}
