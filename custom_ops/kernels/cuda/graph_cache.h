// GraphCache: a forward's launches replayed as a CUDA graph captured once per key, on arenas of device memory that a
// stream keeps (a graph runs on the arena it was captured on; graphs share the arena until a larger one is needed).
// A graph bakes in its kernels' arguments (pointers, shapes, plans), so a call copies its inputs into the arena,
// replays, and copies its results out; the three are enqueued under one lock, so that calls from several threads onto
// one stream (the TF kernel's, whatever thread runs it) never interleave on an arena. A graph call, its staging
// included, costs the host a fraction of launching a forward's ~45 kernels, which at a few rows takes longer than
// the forward's GPU time (bench/gpu/encoder_graphs.py measures both).
#ifndef BERTSERVE_KERNELS_CUDA_GRAPH_CACHE_H_
#define BERTSERVE_KERNELS_CUDA_GRAPH_CACHE_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "custom_ops/kernels/bert_core.h"

namespace bertserve {
namespace cuda {

// What a DeviceAllocator throws when the device has no memory for an arena, apart from CUDA failures
// (std::runtime_error): the TF kernel answers it with RESOURCE_EXHAUSTED, as TensorFlow does its own allocations.
class DeviceOutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Work a call enqueues on a stream, on the arena.
using ArenaWork = std::function<void(void* arena, cudaStream_t stream)>;

struct GraphedCall {
  std::vector<int64_t> key;  // every host-side value `forward` launches with besides the arena: shapes, flags, weights
  int64_t arena_bytes = 0;
  ArenaWork stage_in;   // copies the call's inputs into the arena (not captured: its sources change every call)
  ArenaWork forward;    // the launches captured into the key's graph; reads and writes the arena only
  ArenaWork stage_out;  // copies the results out of the arena (not captured)
};

class GraphCache {
 public:
  GraphCache() = default;
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  ~GraphCache();

  // Enqueues call on stream: stage_in, forward, stage_out. The first call of a key launches forward's kernels
  // eagerly (which also plans its GEMMs, with autotuning where the context does it) and then captures them on a
  // stream of the cache's own; later calls of that key replay the graph, on the arena it was captured on. use_graphs
  // false launches forward eagerly every time, on the stream's current arena (what the graphs are compared with).
  // A call needing more than the current arena allocates one of at least twice its size through `allocate`; the
  // graphs captured before keep the old one (so a warm-up from small batches to large ones keeps every graph, for
  // at most ~4x the largest call's arena in all).
  void Run(const GraphedCall& call, bool use_graphs, const DeviceAllocator& allocate, cudaStream_t stream);

  // Graphs held now, over all streams (for tests and benchmarks).
  int64_t size();

 private:
  struct ExecDestroyer {
    void operator()(cudaGraphExec_t exec) const { cudaGraphExecDestroy(exec); }
  };
  using Exec = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, ExecDestroyer>;

  struct Graph {
    Exec exec;
    std::shared_ptr<void> arena;  // the arena the graph's kernels point into
  };

  struct PerStream {
    std::shared_ptr<void> arena;  // where new graphs are captured
    int64_t arena_bytes = 0;
    cudaStream_t capture = nullptr;  // created on first capture, on the device of the stream it serves
    std::map<std::vector<int64_t>, Graph> graphs;
  };

  static Exec Capture(const ArenaWork& forward, void* arena, cudaStream_t capture);

  std::mutex mutex_;
  std::map<cudaStream_t, PerStream> streams_;
};

// Graphs a stream keeps before it drops them all and starts over (each holds a few dozen nodes on host and device).
constexpr size_t kMaxGraphsPerStream = 1024;

// Process-wide counts over every GraphCache, so that tests and benchmarks can see what serving does: graphs captured
// since the process started (a warmed-up server should capture none), graphs held now, and the most graphs one
// stream of one cache has held at once (kMaxGraphsPerStream at most).
int64_t GraphsCaptured();
int64_t GraphsHeld();
int64_t MostGraphsHeldPerStream();

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GRAPH_CACHE_H_
