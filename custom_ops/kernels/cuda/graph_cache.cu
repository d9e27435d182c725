// GraphCache (graph_cache.h).
#include "custom_ops/kernels/cuda/graph_cache.h"

#include <algorithm>
#include <atomic>

#include "custom_ops/kernels/cuda/common.cuh"

namespace bertserve {
namespace cuda {
namespace {

std::atomic<int64_t> graphs_captured{0};
std::atomic<int64_t> graphs_held{0};
std::atomic<int64_t> most_graphs_held_per_stream{0};

// Drops a stream's graphs, keeping the process-wide count of graphs held.
template <typename Graphs>
void DropGraphs(Graphs& graphs) {
  graphs_held -= static_cast<int64_t>(graphs.size());
  graphs.clear();
}

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
    DropGraphs(state.graphs);
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
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // read here, or the next launch check on this thread would report it as its own
    throw DeviceOutOfMemory("graph instantiation: out of device memory");
  }
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
  if (state.graphs.size() >= kMaxGraphsPerStream) DropGraphs(state.graphs);
  state.graphs.emplace(call.key, Graph{Capture(call.forward, arena, state.capture), state.arena});
  graphs_captured += 1;
  graphs_held += 1;
  const int64_t held = static_cast<int64_t>(state.graphs.size());
  int64_t most = most_graphs_held_per_stream.load();
  while (most < held && !most_graphs_held_per_stream.compare_exchange_weak(most, held)) {
  }
}

int64_t GraphCache::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t graphs = 0;
  for (const auto& [stream, state] : streams_) graphs += static_cast<int64_t>(state.graphs.size());
  return graphs;
}

int64_t GraphsCaptured() { return graphs_captured.load(); }
int64_t GraphsHeld() { return graphs_held.load(); }
int64_t MostGraphsHeldPerStream() { return most_graphs_held_per_stream.load(); }

}  // namespace cuda
}  // namespace bertserve
