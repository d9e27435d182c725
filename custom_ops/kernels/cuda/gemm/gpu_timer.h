// Inside the CUDA core only: times work enqueued on a stream as the GPU sees it, for the GEMM autotuners (which
// wait for the device, outside stream capture). The timed calls queue up behind a spin kernel, so the host's
// launch cost does not show in the measurement (kRepeats calls of the slowest launcher enqueue well within it).
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_GPU_TIMER_H_
#define BERTSERVE_KERNELS_CUDA_GEMM_GPU_TIMER_H_

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

  // An autotuner's measure of one candidate (a GEMM's launches): milliseconds per call, the best of kTrials
  // series of kRepeats back-to-back calls (the GPU is shared), negative if the events fail; waits for the device.
  template <typename Call>
  float BestMsPerCall(const Call& call) {
    float best = -1.f;
    for (int trial = 0; trial < kTrials; ++trial) {
      LaunchSpin(kSpinCyclesBeforeTiming, stream_);
      cudaEventRecord(start_, stream_);
      for (int i = 0; i < kRepeats; ++i) call();
      cudaEventRecord(stop_, stream_);
      float ms = 0.f;
      if (cudaEventSynchronize(stop_) != cudaSuccess || cudaEventElapsedTime(&ms, start_, stop_) != cudaSuccess) {
        return -1.f;
      }
      if (best < 0 || ms / kRepeats < best) best = ms / kRepeats;
    }
    return best;
  }

  // The fastest of `count` candidates: launch(i) enqueues candidate i and returns false when it was refused
  // (nothing launched; such a candidate is skipped), and consumer(i) then enqueues the kernel that reads its output
  // in the forward: back to back, a candidate that joins the programmatic launch chain (common.cuh) would overlap
  // its tail with a copy of itself, which nothing in a forward does. Each is launched once untimed (the warm-up),
  // then timed with BestMsPerCall. Returns its index, or -1 when none beats *best_ms (in: the time to beat; out:
  // the winner's). Leaves no error of a refused launch behind for the next launcher's check.
  template <typename Launch, typename Consumer>
  int Fastest(int count, const Launch& launch, const Consumer& consumer, float* best_ms) {
    int best = -1;
    for (int i = 0; i < count; ++i) {
      if (!launch(i)) continue;
      consumer(i);
      const float ms = BestMsPerCall([&] {
        launch(i);
        consumer(i);
      });
      if (ms >= 0 && ms < *best_ms) {
        *best_ms = ms;
        best = i;
      }
    }
    cudaGetLastError();
    return best;
  }
  template <typename Launch>
  int Fastest(int count, const Launch& launch, float* best_ms) {
    return Fastest(count, launch, [](int) {}, best_ms);
  }

 private:
  static constexpr int kTrials = 2;
  static constexpr int kRepeats = 8;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_GPU_TIMER_H_
