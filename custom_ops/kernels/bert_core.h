// The TensorFlow-independent core of the fused BERT encoder: one API, a CPU backend (namespace cpu) and a CUDA
// backend (namespace cuda). The TF op wrappers in custom_ops/tf/ only validate, allocate and call these; the
// GPU harness in bench/gpu/ drives the CUDA backend without TensorFlow. Layouts: custom_ops/README.md.
#ifndef BERTSERVE_KERNELS_BERT_CORE_H_
#define BERTSERVE_KERNELS_BERT_CORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace bertserve {

// IEEE binary16 storage; layout-compatible with Eigen::half and CUDA's __half, so buffers pass through as is.
struct fp16 {
  uint16_t bits;
};

// Shape of an encoder stack. head_size = hidden / num_heads.
struct EncoderDims {
  int64_t hidden = 0;
  int64_t num_heads = 0;
  int64_t intermediate = 0;
  int64_t num_layers = 0;
  float layer_norm_epsilon = 1e-12f;
  int64_t head_size() const { return hidden / num_heads; }
};

// Non-owning pointers to the stacked encoder weights ([L, ...] each, row-major, TF [in, out] kernels).
template <typename T>
struct EncoderWeights {
  const T* qkv_kernel = nullptr;               // [L, H, 3H]
  const T* qkv_bias = nullptr;                 // [L, 3H]
  const T* attention_output_kernel = nullptr;  // [L, H, H]
  const T* attention_output_bias = nullptr;    // [L, H]
  const T* attention_ln_gamma = nullptr;       // [L, H]
  const T* attention_ln_beta = nullptr;        // [L, H]
  const T* intermediate_kernel = nullptr;      // [L, H, I]
  const T* intermediate_bias = nullptr;        // [L, I]
  const T* output_kernel = nullptr;            // [L, I, H]
  const T* output_bias = nullptr;              // [L, H]
  const T* output_ln_gamma = nullptr;          // [L, H]
  const T* output_ln_beta = nullptr;           // [L, H]
};

template <typename T>
struct EmbeddingWeights {
  const T* word = nullptr;        // [V, H]
  const T* position = nullptr;    // [P, H]
  const T* token_type = nullptr;  // [TV, H]
  const T* ln_gamma = nullptr;    // [H]
  const T* ln_beta = nullptr;     // [H]
  int64_t vocab_size = 0;
  int64_t max_positions = 0;
  int64_t type_vocab_size = 0;
  int64_t hidden = 0;
  float layer_norm_epsilon = 1e-12f;
};

// Non-owning pointers to a ranker's pooler and classifier (TF [in, out] kernels): scores = sigmoid of the one
// logit of tanh(first @ pooler_kernel + pooler_bias) @ classifier_kernel + classifier_bias, or with two labels the
// softmax probability of label 1 (the `scores` contract). Both backends compute it in float.
template <typename T>
struct RankerHeadWeights {
  const T* pooler_kernel = nullptr;      // [H, H]
  const T* pooler_bias = nullptr;        // [H]
  const T* classifier_kernel = nullptr;  // [H, num_labels]
  const T* classifier_bias = nullptr;    // [num_labels]
  int64_t hidden = 0;
  int64_t num_labels = 0;  // 1 or 2
};

// A packed batch: row b owns tokens [cu_seqlens[b], cu_seqlens[b+1]). The host copy is always valid (the token
// count and launch shapes are decided on the host, so a forward pass never synchronises with the device).
struct PackedBatch {
  int64_t batch = 0;
  int64_t num_tokens = 0;
  int64_t max_seqlen = 0;
  const int32_t* cu_seqlens_host = nullptr;    // [batch + 1], host memory
  const int32_t* cu_seqlens_device = nullptr;  // [batch + 1], device memory (CUDA backend only)
};

// ---- Validation shared by every backend: empty string = OK, otherwise a message naming the problem. ----

// Builds cu_seqlens ([batch + 1]) from an int32 [batch, seq] mask on the host; rejects values other than 0/1
// and gaps (a 0 before a 1).
std::string CuSeqlensFromMask(const int32_t* mask, int64_t batch, int64_t seq, int32_t* cu_seqlens);

// Checks cu_seqlens starts at 0, never decreases and ends at num_tokens.
std::string CheckCuSeqlens(const int32_t* cu_seqlens, int64_t batch, int64_t num_tokens);

// Longest row of a valid cu_seqlens.
int64_t MaxSeqlen(const int32_t* cu_seqlens, int64_t batch);

// Checks ids (and segment ids) of real positions only; padded positions are never read.
std::string CheckTokenIds(const int32_t* input_ids, const int32_t* segment_ids, const int32_t* cu_seqlens,
                          int64_t batch, int64_t seq, int64_t vocab_size, int64_t type_vocab_size);

// Checks the attrs of an encoder stack (positive sizes, hidden divisible by num_heads).
std::string CheckEncoderDims(const EncoderDims& dims);

namespace cpu {

// Runs fn(begin, end) over [0, n) in parallel chunks; cost_per_unit is a rough cycle count per item.
using ParallelFor =
    std::function<void(int64_t n, int64_t cost_per_unit, const std::function<void(int64_t, int64_t)>& fn)>;

// The threads the CPU backend may use: the TF wrapper passes TensorFlow's intra-op pool; tests and tools may
// pass a serial loop with num_threads = 1. GEMMs are split into about num_threads shards.
struct ThreadPool {
  int num_threads = 1;
  ParallelFor parallel_for;
};

// The operands of the CPU encoder's weight GEMMs (four per layer): float, or rounded to bfloat16 (to nearest even)
// with the products summed in float, which halves the weight bytes the encoder reads per call. Attention's
// products, LayerNorm, softmax, residuals and GELU stay in float either way.
enum class GemmOperands { kFloat, kBfloat16 };

// Bytes of scratch memory the encoder needs for a batch of num_tokens tokens; batch matters only when the
// encoder is asked for first tokens (below), whose rows may outnumber the tokens (rows without tokens).
template <typename T>
int64_t EncoderWorkspaceBytes(const EncoderDims& dims, int64_t num_tokens, int64_t batch = 0);

// T is float or fp16 (computed in float). All pointers are host memory.
template <typename T>
void Embedding(const EmbeddingWeights<T>& w, const int32_t* input_ids, const int32_t* segment_ids, int64_t seq,
               const PackedBatch& batch, T* hidden_out, const ThreadPool& pool);

// First-token output (both backends): when first_tokens is not null, the last layer runs for each row's first
// token only (every token of the row is still a key and value of its attention) and writes [batch, H] there,
// zeros for a row without tokens: what a first-token ([CLS]) pooler reads, GatherFirstToken of the full output,
// without the last layer's work on the other tokens past its QKV GEMM. hidden [num_tokens, H] is then scratch.

// The fp16 encoder, in place over hidden [num_tokens, H]; workspace holds EncoderWorkspaceBytes<fp16> bytes,
// 64-byte aligned; weights widened per layer, per call. float runs with packed weights (below).
void Encoder(const EncoderDims& dims, const EncoderWeights<fp16>& w, const PackedBatch& batch, fp16* hidden,
             void* workspace, const ThreadPool& pool, fp16* first_tokens = nullptr);

// The four GEMM weights of every layer of a float stack, packed once into the BLAS's own layout
// (kernels/cpu_gemm.h) for callers that run the same weights many times; it copies them, so w may change or go
// afterwards. Immutable: concurrent Encoder calls may share one.
class PackedEncoderWeights;
std::shared_ptr<const PackedEncoderWeights> PackEncoderWeights(const EncoderDims& dims,
                                                               const EncoderWeights<float>& w,
                                                               const ThreadPool& pool,
                                                               GemmOperands operands = GemmOperands::kFloat);

// The float encoder, in place like the fp16 one: each layer's GEMM weights come from `packed` (packed from w's
// kernels and these dims); the biases and LayerNorm parameters still come from w.
void Encoder(const EncoderDims& dims, const EncoderWeights<float>& w, const PackedEncoderWeights& packed,
             const PackedBatch& batch, float* hidden, void* workspace, const ThreadPool& pool,
             float* first_tokens = nullptr);

template <typename T>
void RemovePadding(const T* padded, int64_t seq, int64_t hidden, const PackedBatch& batch, T* packed);

template <typename T>
void RebuildPadding(const T* packed, int64_t seq, int64_t hidden, const PackedBatch& batch, T* padded);

template <typename T>
void GatherFirstToken(const T* packed, int64_t hidden, const PackedBatch& batch, T* first);

// Ranker scores [batch] from first tokens [batch, H] (RankerHeadWeights); fp16 weights and tokens are widened, so
// the pooler's output reaches the classifier unrounded. Throws std::bad_alloc when its scratch cannot be had.
template <typename T>
void RankerHead(const RankerHeadWeights<T>& w, const T* first_tokens, int64_t batch, float* scores,
                const ThreadPool& pool);

}  // namespace cpu

namespace cuda {

// Same operations on device memory, enqueued on `stream` (a cudaStream_t), never synchronising with the host.
// Scratch memory comes from the caller (TF's allocator in the op; the harness's own buffer), sized by
// EncoderWorkspaceBytes; `gemm` carries the cuBLASLt handle and tuned algorithms (kernels/cuda/gemm.h).
// T is float or fp16 (Tensor Cores, fp32 accumulation). batch.cu_seqlens_device is read by the kernels;
// batch.num_tokens may exceed cu_seqlens[batch] (TokenBucket below: a CUDA graph captured for a bucket, the TF
// kernel's planned shapes): rows past the real tokens are scratch, computed but never read into a real row.
// Failures throw std::runtime_error.
struct GemmContext;

template <typename T>
int64_t EncoderWorkspaceBytes(const EncoderDims& dims, int64_t max_tokens, int64_t max_batch = 0);

// The token count to run num_tokens real tokens at: multiples of 16 up to 256, then 16 steps per power of two (at
// most 6.25 % scratch rows). Callers round up to it so that GEMMs are planned, and graphs captured, for a few
// counts instead of every count: planning a count seen for the first time took 0.2-7 ms on the H200.
int64_t TokenBucket(int64_t num_tokens);

template <typename T>
void Embedding(const EmbeddingWeights<T>& w, const int32_t* input_ids, const int32_t* segment_ids, int64_t seq,
               const PackedBatch& batch, T* hidden_out, void* stream);

// first_tokens: as for the CPU backend above.
template <typename T>
void Encoder(const EncoderDims& dims, const EncoderWeights<T>& w, const PackedBatch& batch, T* hidden,
             void* workspace, GemmContext* gemm, void* stream, T* first_tokens = nullptr);

// Device memory kept between calls, the arena CUDA graphs run on (kernels/cuda/graph_cache.h): TensorFlow's
// allocator in the TF kernel, cudaMalloc in the C ABI. It goes back when the last copy of the pointer does.
using DeviceAllocator = std::function<std::shared_ptr<void>(int64_t bytes)>;
class GraphCache;

// The encoder as the TF kernel runs it, on the caller's buffers: hidden_in holds the real tokens [cu_seqlens[batch],
// H] (batch.num_tokens of them; the host cu_seqlens and max_seqlen are read, cu_seqlens_device is not); out receives
// every token's output, [cu_seqlens[batch], H], or with first_token_only each row's first token, [batch, H] (zeros
// for a row without tokens). The tokens and cu_seqlens are staged in an arena of TokenBucket rows (the rows past
// the real tokens zeroed; one kernel), the encoder runs there, and the output is copied out. With use_graphs, its
// launches are a CUDA graph per (batch, token bucket, attention size class, weights) and stream, replayed from a
// key's second call on; without, the same launches one by one on the same arena (for comparison: the TF kernel uses
// graphs).
template <typename T>
void BucketedEncoder(GraphCache& graphs, bool use_graphs, const EncoderDims& dims, const EncoderWeights<T>& w,
                     const PackedBatch& batch, const T* hidden_in, bool first_token_only, T* out, GemmContext* gemm,
                     const DeviceAllocator& allocate, void* stream);

template <typename T>
void RemovePadding(const T* padded, int64_t seq, int64_t hidden, const PackedBatch& batch, T* packed, void* stream);

template <typename T>
void RebuildPadding(const T* packed, int64_t seq, int64_t hidden, const PackedBatch& batch, T* padded,
                    void* stream);

template <typename T>
void GatherFirstToken(const T* packed, int64_t hidden, const PackedBatch& batch, T* first, void* stream);

// Bytes of device scratch RankerHead needs for `batch` rows (256-byte aligned, as cudaMalloc's): none where the
// one-kernel pooler + head runs (fp16 at batch 1, PoolerHeadSupports in kernels/cuda/kernels.h), else a cuBLASLt
// workspace and the pooler GEMM's fp32 output.
template <typename T>
int64_t RankerHeadWorkspaceBytes(int64_t batch, int64_t hidden, int64_t num_labels);

// Ranker scores [batch] (float, device) from first tokens [batch, H]: LaunchPoolerHead where it applies, else the
// pooler GEMM (fp32 accumulation and output, so tanh and the classifier see it unrounded) and LaunchRankerHead.
// workspace holds RankerHeadWorkspaceBytes.
template <typename T>
void RankerHead(const RankerHeadWeights<T>& w, const T* first_tokens, int64_t batch, void* workspace, float* scores,
                GemmContext* gemm, void* stream);

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_BERT_CORE_H_
