// GraphCache (graph_cache.h).
#include "custom_ops/kernels/cuda/graph_cache.h"

#include <algorithm>

#include "custom_ops/kernels/cuda/common.cuh"

namespace bertserve {
namespace cuda {
namespace {

// A non-blocking stream on the device `stream` belongs to (the caller's current device may be another one).
cudaStream_t StreamBeside(cudaStream_t stream) {
  int device = 0, current = 0;
  ThrowIfFailed(cudaStreamGetDevice(stream, &device), "device of the stream");
  ThrowIfFailed(cudaGetDevice(&current), "current device");
  if (device != current) ThrowIfFailed(cudaSetDevice(device), "switch to the stream's device");
  cudaStream_t created = nullptr;
  const cudaError_t status = cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
  if (device != current) cudaSetDevice(current);
  ThrowIfFailed(status, "stream for graph capture");
  return created;
}

}  // namespace

GraphCache::~GraphCache() {
  for (auto& [stream, state] : streams_) {
    state.graphs.clear();
    if (state.capture != nullptr) cudaStreamDestroy(state.capture);
  }
}

// Thread-local capture mode: other threads' CUDA calls (TensorFlow's allocator, other ops) go on unaffected while
// this thread captures, and nothing this thread enqueues elsewhere is swept into the graph.
GraphCache::Exec GraphCache::Capture(const ArenaWork& forward, void* arena, cudaStream_t capture) {
  ThrowIfFailed(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal), "begin graph capture");
  cudaGraph_t graph = nullptr;
  try {
    forward(arena, capture);
  } catch (...) {
    cudaStreamEndCapture(capture, &graph);  // leaves the stream usable; the partial graph is dropped
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  ThrowIfFailed(cudaStreamEndCapture(capture, &graph), "end graph capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  ThrowIfFailed(status, "graph instantiation");
  return Exec(exec);
}

void GraphCache::Run(const GraphedCall& call, bool use_graphs, const DeviceAllocator& allocate, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  PerStream& state = streams_[stream];
  const auto found = use_graphs ? state.graphs.find(call.key) : state.graphs.end();
  if (found != state.graphs.end()) {
    void* arena = found->second.arena.get();
    call.stage_in(arena, stream);
    ThrowIfFailed(cudaGraphLaunch(found->second.exec.get(), stream), "graph launch");
    call.stage_out(arena, stream);
    return;
  }
  if (state.arena_bytes < call.arena_bytes) {
    const int64_t bytes = std::max(call.arena_bytes, 2 * state.arena_bytes);
    state.arena = allocate(bytes);
    state.arena_bytes = bytes;
  }
  void* arena = state.arena.get();
  call.stage_in(arena, stream);
  call.forward(arena, stream);
  call.stage_out(arena, stream);
  if (!use_graphs) return;
  if (state.capture == nullptr) state.capture = StreamBeside(stream);
  if (state.graphs.size() >= kMaxGraphsPerStream) state.graphs.clear();
  state.graphs.emplace(call.key, Graph{Capture(call.forward, arena, state.capture), state.arena});
}

int64_t GraphCache::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t graphs = 0;
  for (const auto& [stream, state] : streams_) graphs += static_cast<int64_t>(state.graphs.size());
  return graphs;
}

}  // namespace cuda
}  // namespace bertserve
