// Inside the CUDA core only: times work enqueued on a stream as the GPU sees it, for the GEMM autotuners (which
// wait for the device, outside stream capture). The timed calls queue up behind a spin kernel, so the host's
// launch cost does not show in the measurement.
#ifndef BERTSERVE_KERNELS_CUDA_GPU_TIMER_H_
#define BERTSERVE_KERNELS_CUDA_GPU_TIMER_H_

#include <cuda_runtime.h>

#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {

class GpuTimer {
 public:
  explicit GpuTimer(cudaStream_t stream) : stream_(stream) {
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
  }
  ~GpuTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  // Milliseconds per call of `repeats` back-to-back calls; negative if the events fail. Waits for the device.
  template <typename Call>
  float MsPerCall(int repeats, const Call& call) {
    LaunchSpin(kSpinCyclesBeforeTiming, stream_);
    cudaEventRecord(start_, stream_);
    for (int i = 0; i < repeats; ++i) call();
    cudaEventRecord(stop_, stream_);
    float ms = 0.f;
    if (cudaEventSynchronize(stop_) != cudaSuccess || cudaEventElapsedTime(&ms, start_, stop_) != cudaSuccess) {
      return -1.f;
    }
    return ms / repeats;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GPU_TIMER_H_
