// BucketedEncoder (bert_core.h): the encoder on an arena of TokenBucket rows that a GraphCache keeps per stream, so
// that the TF kernel replays one CUDA graph per (batch, bucket) instead of launching ~45 kernels a call.
#include <cstring>
#include <vector>

#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/graph_cache.h"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

// The attention kernels depend on the longest row only through its size class (the fused kernel's 32, 64 or 128
// keys; the streaming kernel's grid, which may be larger than needed): the longest row rounded up to a power of two
// from 32 picks the same class, and lets one graph serve every batch of a (batch, bucket) pair.
int64_t SeqlenBound(int64_t max_seqlen) {
  int64_t bound = 32;
  while (bound < max_seqlen) bound <<= 1;
  return bound;
}

// Byte offsets into the arena: tokens [rows, H] | cu_seqlens [batch + 1] | first tokens [batch, H] | workspace.
struct ArenaLayout {
  int64_t cu = 0, first = 0, workspace = 0, total = 0;

  template <typename T>
  static ArenaLayout Of(const EncoderDims& dims, int64_t rows, int64_t batch, bool first_token_only) {
    ArenaLayout a;
    a.cu = AlignedBytes(rows * dims.hidden * sizeof(T));
    a.first = a.cu + AlignedBytes((batch + 1) * sizeof(int32_t));
    a.workspace = a.first + (first_token_only ? AlignedBytes(batch * dims.hidden * sizeof(T)) : 0);
    a.total = a.workspace + EncoderWorkspaceBytes<T>(dims, rows, first_token_only ? batch : 0);
    return a;
  }
};

// Everything the captured launches depend on besides the arena: a graph made for other weights or shapes must not
// be replayed.
template <typename T>
std::vector<int64_t> KeyOf(const EncoderDims& dims, const EncoderWeights<T>& w, int64_t batch, int64_t rows,
                           int64_t seqlen_bound, bool first_token_only) {
  int32_t epsilon_bits = 0;
  std::memcpy(&epsilon_bits, &dims.layer_norm_epsilon, sizeof(epsilon_bits));
  std::vector<int64_t> key = {static_cast<int64_t>(sizeof(T)), batch, rows, seqlen_bound, first_token_only,
                              dims.hidden, dims.num_heads, dims.intermediate, dims.num_layers, epsilon_bits};
  const T* const weights[] = {w.qkv_kernel,          w.qkv_bias,           w.attention_output_kernel,
                              w.attention_output_bias, w.attention_ln_gamma, w.attention_ln_beta,
                              w.intermediate_kernel,   w.intermediate_bias,  w.output_kernel,
                              w.output_bias,           w.output_ln_gamma,    w.output_ln_beta};
  for (const T* p : weights) key.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(p)));
  return key;
}

unsigned char* Bytes(void* arena, int64_t offset) { return static_cast<unsigned char*>(arena) + offset; }

}  // namespace

template <typename T>
void BucketedEncoder(GraphCache& graphs, bool use_graphs, const EncoderDims& dims, const EncoderWeights<T>& w,
                     const PackedBatch& batch, const T* hidden_in, bool first_token_only, T* out, GemmContext* gemm,
                     const DeviceAllocator& allocate, void* stream) {
  const cudaStream_t s = AsStream(stream);
  const int64_t h = dims.hidden, real = batch.num_tokens, row_bytes = h * static_cast<int64_t>(sizeof(T));
  if (real == 0) {
    if (first_token_only) ThrowIfFailed(cudaMemsetAsync(out, 0, batch.batch * row_bytes, s), "zero first tokens");
    return;
  }
  const int64_t rows = TokenBucket(real), seqlen_bound = SeqlenBound(batch.max_seqlen);
  const ArenaLayout a = ArenaLayout::Of<T>(dims, rows, batch.batch, first_token_only);
  GraphedCall call;
  call.key = KeyOf(dims, w, batch.batch, rows, seqlen_bound, first_token_only);
  call.arena_bytes = a.total;
  call.stage_in = [&](void* arena, cudaStream_t st) {
    LaunchStage(hidden_in, real * row_bytes, rows * row_bytes, arena, batch.cu_seqlens_host, batch.batch + 1,
                reinterpret_cast<int32_t*>(Bytes(arena, a.cu)), st);
  };
  call.forward = [&](void* arena, cudaStream_t st) {
    PackedBatch on_arena;  // no host cu_seqlens: a graph must not depend on one call's lengths
    on_arena.batch = batch.batch;
    on_arena.num_tokens = rows;
    on_arena.max_seqlen = seqlen_bound;
    on_arena.cu_seqlens_device = reinterpret_cast<const int32_t*>(Bytes(arena, a.cu));
    Encoder<T>(dims, w, on_arena, static_cast<T*>(arena), Bytes(arena, a.workspace), gemm, st,
               first_token_only ? reinterpret_cast<T*>(Bytes(arena, a.first)) : nullptr);
  };
  call.stage_out = [&](void* arena, cudaStream_t st) {
    const void* result = first_token_only ? Bytes(arena, a.first) : arena;
    ThrowIfFailed(cudaMemcpyAsync(out, result, (first_token_only ? batch.batch : real) * row_bytes,
                                  cudaMemcpyDeviceToDevice, st),
                  "copy of the encoder's output");
  };
  graphs.Run(call, use_graphs, allocate, s);
}

#define BERTSERVE_INSTANTIATE_BUCKETED_ENCODER(T)                                                              \
  template void BucketedEncoder<T>(GraphCache&, bool, const EncoderDims&, const EncoderWeights<T>&,          \
                                   const PackedBatch&, const T*, bool, T*, GemmContext*, const DeviceAllocator&, \
                                   void*);
BERTSERVE_INSTANTIATE_BUCKETED_ENCODER(float)
BERTSERVE_INSTANTIATE_BUCKETED_ENCODER(fp16)

}  // namespace cuda
}  // namespace bertserve
