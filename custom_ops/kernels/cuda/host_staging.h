// Host -> device copies of the index data the TF kernels keep in host memory (ids, segments, cu_seqlens), one
// transfer per call whatever the batch: a few indices travel in a kernel's parameters (no copy engine, no host
// buffer to keep alive), more through pinned memory of a pool the op instance keeps and one cudaMemcpyAsync.
#ifndef BERTSERVE_KERNELS_CUDA_HOST_STAGING_H_
#define BERTSERVE_KERNELS_CUDA_HOST_STAGING_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <vector>

namespace bertserve {
namespace cuda {

// Pinned host buffers for copies too large for kernel parameters. A buffer goes back to the pool with an event
// recorded after its copy and is handed out again only once that event has passed, so a copy never reads memory a
// later call overwrites. One pool per op instance; thread-safe (TensorFlow runs one kernel from several threads).
class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging();  // waits for the copies in flight, then frees the buffers

  struct Buffer {
    void* host = nullptr;
    int64_t bytes = 0;
    cudaEvent_t copied = nullptr;
  };

  // A buffer of at least `bytes` that no copy reads any more: a passed one of the pool, else a new one (so the pool
  // holds about one buffer per call in flight), else, with kMaxBuffers held, the oldest waited for. Throws
  // DeviceOutOfMemory (graph_cache.h) when no pinned memory can be had.
  Buffer Acquire(int64_t bytes);
  // Back to the pool, `copied` recorded on the stream after the copy that reads it.
  void Release(const Buffer& buffer);

  static constexpr size_t kMaxBuffers = 8;

 private:
  std::mutex mutex_;
  std::vector<Buffer> pool_;  // oldest first
};

// Pinned bytes all PinnedStaging pools of the process hold now (for tests: they level off under load and go back
// when a model's kernels are destroyed).
int64_t PinnedStagingBytes();

// One contiguous host array of int32 indices.
struct IndexSpan {
  const int32_t* data;
  int64_t count;
};

// The spans one after another into device[0, total), enqueued on stream in one transfer: up to
// kStageIndicesPerLaunch (kernels.h) indices in all through a kernel's parameters, more through a buffer of
// `staging`. The host data may be reused as
// soon as this returns.
void CopyIndicesToDevice(std::initializer_list<IndexSpan> spans, int32_t* device, PinnedStaging& staging,
                         cudaStream_t stream);

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_HOST_STAGING_H_
