// PinnedStaging and CopyIndicesToDevice (host_staging.h).
#include "custom_ops/kernels/cuda/host_staging.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/graph_cache.h"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

std::atomic<int64_t> pinned_bytes{0};

void Free(const PinnedStaging::Buffer& buffer) {
  cudaEventSynchronize(buffer.copied);
  cudaEventDestroy(buffer.copied);
  cudaFreeHost(buffer.host);
  pinned_bytes -= buffer.bytes;
}

}  // namespace

int64_t PinnedStagingBytes() { return pinned_bytes.load(); }

PinnedStaging::~PinnedStaging() {
  for (const Buffer& buffer : pool_) Free(buffer);
}

PinnedStaging::Buffer PinnedStaging::Acquire(int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      if (it->bytes >= bytes && cudaEventQuery(it->copied) == cudaSuccess) {
        const Buffer found = *it;
        pool_.erase(it);
        return found;
      }
    }
    if (pool_.size() >= kMaxBuffers) {  // a full pool of buffers still being read, or too small: drop the oldest
      const Buffer oldest = pool_.front();
      pool_.erase(pool_.begin());
      if (oldest.bytes >= bytes) {
        ThrowIfFailed(cudaEventSynchronize(oldest.copied), "wait for a staging copy");
        return oldest;
      }
      Free(oldest);
    }
  }
  Buffer buffer;
  buffer.bytes = int64_t{1} << 16;  // powers of 2, so that a pool serves batches of every size with a few buffers
  while (buffer.bytes < bytes) buffer.bytes <<= 1;
  if (cudaHostAlloc(&buffer.host, buffer.bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it for the next launch's check
    throw DeviceOutOfMemory("out of pinned host memory: could not stage " + std::to_string(bytes) +
                            " bytes of indices for the device");
  }
  const cudaError_t status = cudaEventCreateWithFlags(&buffer.copied, cudaEventDisableTiming);
  if (status != cudaSuccess) {
    cudaFreeHost(buffer.host);
    ThrowIfFailed(status, "staging event");
  }
  pinned_bytes += buffer.bytes;
  return buffer;
}

void PinnedStaging::Release(const Buffer& buffer) {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.push_back(buffer);
}

void CopyIndicesToDevice(std::initializer_list<IndexSpan> spans, int32_t* device, PinnedStaging& staging,
                         cudaStream_t stream) {
  int64_t total = 0;
  for (const IndexSpan& span : spans) total += span.count;
  if (total == 0) return;
  if (total <= kStageIndicesPerLaunch) {
    int32_t gathered[kStageIndicesPerLaunch];
    int32_t* next = gathered;
    for (const IndexSpan& span : spans) next = std::copy(span.data, span.data + span.count, next);
    LaunchStage(nullptr, 0, 0, nullptr, gathered, total, device, stream);
    return;
  }
  const int64_t bytes = total * static_cast<int64_t>(sizeof(int32_t));
  const PinnedStaging::Buffer buffer = staging.Acquire(bytes);
  auto* next = static_cast<int32_t*>(buffer.host);
  for (const IndexSpan& span : spans) {
    std::memcpy(next, span.data, span.count * sizeof(int32_t));
    next += span.count;
  }
  const cudaError_t copy = cudaMemcpyAsync(device, buffer.host, bytes, cudaMemcpyHostToDevice, stream);
  // Without its event, a buffer is safe to hand out again only once the stream has passed the copy.
  const cudaError_t record = copy == cudaSuccess ? cudaEventRecord(buffer.copied, stream) : cudaSuccess;
  if (record != cudaSuccess) cudaStreamSynchronize(stream);
  staging.Release(buffer);
  ThrowIfFailed(copy, "stage indices on the device");
  ThrowIfFailed(record, "event after staging indices");
}

}  // namespace cuda
}  // namespace bertserve
