// Launchers of the CUDA core's own kernels (the GEMMs are in gemm.h). T is __half or float; every pointer is
// device memory except where a name ends in _host; every launcher only enqueues on `stream` and throws
// std::runtime_error if the launch fails. The kernels are launched with programmatic dependent launch
// (LaunchAfterPredecessor in common.cuh): each may be scheduled while the kernel before it drains and waits on the
// device for that kernel's results before touching memory.
//
// Packed rows: a launcher given num_tokens treats rows at or past cu_seqlens[batch] as scratch (a CUDA graph
// captured for a token-count bucket runs with num_tokens >= the real count): they may be computed, never read
// into a real row, and never written by the embedding.
#ifndef BERTSERVE_KERNELS_CUDA_KERNELS_H_
#define BERTSERVE_KERNELS_CUDA_KERNELS_H_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace bertserve {
namespace cuda {

// Largest hidden size the LayerNorm kernels hold in registers (a warp or a block per row); hidden must also be even.
constexpr int64_t kMaxLayerNormHidden = 2048;

// hidden[t] = LayerNorm(word[id] + position[p] + token_type[segment]) for each real packed token t (row b,
// position p). Ids are range-checked on the host by the caller; out-of-range ids are clamped, never read past.
template <typename T>
void LaunchEmbeddingLayerNorm(const T* word, const T* position, const T* token_type, const T* gamma, const T* beta,
                              int64_t vocab_size, int64_t type_vocab_size, const int32_t* input_ids,
                              const int32_t* segment_ids, int64_t seq, const int32_t* cu_seqlens, int64_t batch,
                              int64_t num_tokens, int64_t hidden, float epsilon, T* out, cudaStream_t stream);

// Weight vectors a LayerNorm kernel asks L2 for before its launch-chain wait, for the kernels after it: biases,
// gamma and beta are read once a forward, and the weights streamed between two of their reads evict them from L2,
// so unasked each one's first read is a DRAM round trip on the forward's critical path (commit 299059a). Up to
// kVectors [ptr, ptr + bytes) ranges; a null ptr is skipped.
struct L2Prefetch {
  static constexpr int kVectors = 4;
  const void* ptr[kVectors] = {};
  int64_t bytes[kVectors] = {};
};

// hidden = LayerNorm(x + bias + hidden) * gamma + beta, row by row over [rows, width], the sum in fp32 (x is a GEMM
// output without its bias, which would otherwise be rounded to T once more). With zero_rows_without_tokens (a
// cu_seqlens [rows + 1]), the rows are a batch's rows and a row without tokens is written as zeros instead.
template <typename T>
void LaunchResidualLayerNorm(const T* x, const T* bias, const T* gamma, const T* beta, int64_t rows, int64_t width,
                             float epsilon, T* hidden, cudaStream_t stream,
                             const int32_t* zero_rows_without_tokens = nullptr, const L2Prefetch& next = {});

// The same with x given as `parts` fp32 partial products [parts, rows, width] (GemmKSplit's), summed in fp32;
// parts is 1 to kMaxKSplits (gemm.h), else std::runtime_error. fp16 only.
template <typename T>
void LaunchPartialsResidualLayerNorm(const float* partials, int parts, const T* bias, const T* gamma, const T* beta,
                                     int64_t rows, int64_t width, float epsilon, T* hidden, cudaStream_t stream,
                                     const int32_t* zero_rows_without_tokens = nullptr, const L2Prefetch& next = {});

// Inputs staged on the device in one launch where a copy, a fill and a host-to-device copy would take three
// (BucketedEncoder's arena, CopyIndicesToDevice): dst [0, copy_bytes) from src, [copy_bytes, total_bytes) zeros,
// indices [0, count) from host memory through the kernel's parameters (one more launch per 1,000 indices past the
// first 1,000). Byte counts are multiples of 4, else std::runtime_error.
constexpr int64_t kStageIndicesPerLaunch = 1000;  // 4 KB of a launch's parameters
void LaunchStage(const void* src, int64_t copy_bytes, int64_t total_bytes, void* dst, const int32_t* host_indices,
                 int64_t count, int32_t* indices, cudaStream_t stream);

// Keeps the stream busy for about `cycles` GPU clocks, so that launches enqueued behind it run back to back when
// timed: the time measured is the GPU's, not the host's launch overhead.
void LaunchSpin(int64_t cycles, cudaStream_t stream);
constexpr int64_t kSpinCyclesBeforeTiming = 2000000;  // ~1 ms, longer than enqueuing a timed series

// x = GELU(x + bias) (erf form) in place over [rows, width], bias [width] added in fp32.
template <typename T>
void LaunchBiasGelu(T* x, const T* bias, int64_t rows, int64_t width, cudaStream_t stream);

// Attention of every row over its own real tokens: context[t, h*D:(h+1)*D] from qkv [num_tokens, 3H]
// (query | key | value blocks, head h at columns h*D of each). max_seqlen bounds every row's length.
template <typename T>
void LaunchAttention(const T* qkv, const int32_t* cu_seqlens, int64_t batch, int64_t max_seqlen, int64_t num_heads,
                     int64_t head_size, T* context, cudaStream_t stream);

// The attention of each row's first token only (a last layer run for first tokens alone): context [batch, H],
// row b from the query of token cu_seqlens[b] over the row's keys and values in qkv [num_tokens, 3H]; residual
// [batch, H] gets that token's row of hidden_in [num_tokens, H]. A row without tokens gets zeros in both.
template <typename T>
void LaunchFirstTokenAttention(const T* qkv, const T* hidden_in, const int32_t* cu_seqlens, int64_t batch,
                               int64_t max_seqlen, int64_t num_heads, int64_t head_size, T* context, T* residual,
                               cudaStream_t stream);

template <typename T>
void LaunchGatherFirstToken(const T* packed, int64_t hidden, const int32_t* cu_seqlens, int64_t batch, T* first,
                            cudaStream_t stream);

template <typename T>
void LaunchRemovePadding(const T* padded, int64_t seq, int64_t hidden, const int32_t* cu_seqlens, int64_t batch,
                         int64_t num_tokens, T* packed, cudaStream_t stream);

template <typename T>
void LaunchRebuildPadding(const T* packed, int64_t seq, int64_t hidden, const int32_t* cu_seqlens, int64_t batch,
                          T* padded, cudaStream_t stream);

// scores[b] = sigmoid(tanh(pooled[b] + pooler_bias) @ classifier + bias) for one label; for two labels the
// softmax probability of label 1. pooled [batch, hidden] is the pooler GEMM's fp32 output, without bias.
template <typename T>
void LaunchRankerHead(const float* pooled, const T* pooler_bias, const T* classifier_kernel,
                      const T* classifier_bias, int64_t batch, int64_t hidden, int64_t num_labels, float* scores,
                      cudaStream_t stream);

// The pooler (tanh(first @ pooler_kernel + pooler_bias)) and LaunchRankerHead's head in one kernel, for one row
// (PoolerHeadSupports: batch <= kPoolerHeadMaxBatch, hidden a multiple of 128 up to kPoolerHeadMaxHidden, one or
// two labels); first [batch, hidden]. One cluster of 16 blocks, which the H100 and H200 run. At 2 to 8 rows it
// was no faster than the pooler GEMM and the head kernel (commit 3fbca00).
constexpr int64_t kPoolerHeadMaxBatch = 1;
constexpr int64_t kPoolerHeadMaxHidden = 768;
bool PoolerHeadSupports(int64_t batch, int64_t hidden, int64_t num_labels);
void LaunchPoolerHead(const __half* first, const __half* pooler_kernel, const __half* pooler_bias,
                      const __half* classifier_kernel, const __half* classifier_bias, int64_t batch, int64_t hidden,
                      int64_t num_labels, float* scores, cudaStream_t stream);

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_KERNELS_H_
