// Diagnostic builds only (-DBERTSERVE_STEP_TRACE): block (0, 0, 0) of each kernel in the launch chain records when
// its first thread reached the programmatic-launch wait, when the wait returned and when the thread left, in a
// device buffer handed in through the C ABI (bertserve_cuda_step_trace), for bench/gpu/step_trace.py to read. The
// CUPTI timeline gives each kernel's start and end; this splits a step into the wait's release after the kernel
// before ends and the kernel's own run after it. Without the macro, BERTSERVE_JOIN_LAUNCH_CHAIN is JoinLaunchChain.
#ifndef BERTSERVE_KERNELS_CUDA_STEP_TRACE_CUH_
#define BERTSERVE_KERNELS_CUDA_STEP_TRACE_CUH_

#include <cstdint>
#include <vector>

#include "custom_ops/kernels/cuda/common.cuh"

namespace bertserve {
namespace cuda {

// Kernel kinds in a record's first word.
enum StepTraceKind : uint64_t {
  kTraceEmbedding = 1,
  kTraceLayerNorm = 2,
  kTraceAttention = 3,
  kTraceFirstTokenAttention = 4,
  kTraceBiasGelu = 5,
  kTraceRowCopy = 6,
  kTraceHead = 7,
  kTraceGemmProducer = 10,  // the loader warp: its wait, then its exit once the main loop has consumed every stage
  kTraceGemmConsumer = 11,  // the math warp group: "waited" = main loop done, exit = epilogue done
};

// Buffer layout (uint64): [0] records written; record r at [kStepTraceWords * (r + 1)]: kind, two dimensions,
// reached-wait, wait-returned and exit times (%globaltimer, ns), then the SM cycles waiting and after the wait.
constexpr int kStepTraceWords = 8;
constexpr int kStepTraceRecords = 8192;

#ifdef BERTSERVE_STEP_TRACE

inline std::vector<void (*)(unsigned long long*)>& StepTraceSetters() {
  static std::vector<void (*)(unsigned long long*)> setters;
  return setters;
}

namespace {
__device__ unsigned long long* g_step_trace = nullptr;  // one per translation unit, each set by its own setter

void SetStepTraceBuffer(unsigned long long* buffer) {
  ThrowIfFailed(cudaMemcpyToSymbol(g_step_trace, &buffer, sizeof buffer), "step trace buffer");
}
const bool step_trace_registered = (StepTraceSetters().push_back(&SetStepTraceBuffer), true);
}  // namespace

__device__ __forceinline__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct StepTraceScope {
  uint64_t kind, dim0, dim1;
  unsigned long long reached_ns = 0, waited_ns = 0;
  long long reached_clock = 0, waited_clock = 0;
  bool on;

  __device__ StepTraceScope(uint64_t kind_, uint64_t dim0_, uint64_t dim1_, bool thread)
      : kind(kind_), dim0(dim0_), dim1(dim1_) {
    on = thread && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && g_step_trace != nullptr;
    if (on) {
      reached_ns = GlobalTimerNs();
      reached_clock = clock64();
    }
  }
  __device__ void Waited() {
    if (on) {
      waited_ns = GlobalTimerNs();
      waited_clock = clock64();
    }
  }
  __device__ ~StepTraceScope() {
    if (!on) return;
    const unsigned long long exit_ns = GlobalTimerNs();
    const long long exit_clock = clock64();
    const unsigned long long slot = atomicAdd(g_step_trace, 1ull);
    if (slot >= kStepTraceRecords) return;
    unsigned long long* r = g_step_trace + kStepTraceWords * (slot + 1);
    r[0] = kind;
    r[1] = dim0;
    r[2] = dim1;
    r[3] = reached_ns;
    r[4] = waited_ns;
    r[5] = exit_ns;
    r[6] = static_cast<unsigned long long>(waited_clock - reached_clock);
    r[7] = static_cast<unsigned long long>(exit_clock - waited_clock);
  }
};

#define BERTSERVE_JOIN_LAUNCH_CHAIN(kind, dim0, dim1)                                                 \
  ::bertserve::cuda::StepTraceScope step_trace_scope(kind, dim0, dim1, threadIdx.x == 0);            \
  ::bertserve::cuda::JoinLaunchChain();                                                               \
  step_trace_scope.Waited()

#else

#define BERTSERVE_JOIN_LAUNCH_CHAIN(kind, dim0, dim1) ::bertserve::cuda::JoinLaunchChain()

#endif  // BERTSERVE_STEP_TRACE

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_STEP_TRACE_CUH_
