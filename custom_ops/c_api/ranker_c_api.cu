// A C ABI over the CUDA core for drivers without TensorFlow (the GPU harness, bench/gpu/core.py, loads it with
// ctypes), a sibling of the TensorFlow adapter in custom_ops/tf/: a whole ranker forward (embedding, encoder,
// first-token gather, pooler + classifier as BertRankerHead runs them) on device buffers owned by the caller, the encoder
// as the TF kernel runs it, and the padding ops. Every function returns 0 or 1 and leaves the message of a
// failure in bertserve_cuda_last_error(). Nothing here synchronises with the device.
#include <cuda_fp16.h>

#include <exception>
#include <memory>
#include <string>

#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/graph_cache.h"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

thread_local std::string last_error;

// Device pointers in this order (qkv fused as [L, H, 3H] = concat(query, key, value) on the last axis).
enum WeightIndex {
  kWord, kPosition, kTokenType, kEmbeddingGamma, kEmbeddingBeta,
  kQkvKernel, kQkvBias, kAttentionOutputKernel, kAttentionOutputBias, kAttentionGamma, kAttentionBeta,
  kIntermediateKernel, kIntermediateBias, kOutputKernel, kOutputBias, kOutputGamma, kOutputBeta,
  kPoolerKernel, kPoolerBias, kClassifierKernel, kClassifierBias, kNumWeights
};

struct Ranker {
  bool half;
  EncoderDims dims;
  int64_t vocab_size, max_positions, type_vocab_size, num_labels;
  const void* weights[kNumWeights];
  GemmContext* gemm;
  bool first_token_last_layer;  // the encoder's last layer for first tokens only (bert_core.h)
  GraphCache encoder_graphs;    // the TF kernel's encoder graphs (BucketedEncoder), for bertserve_cuda_encoder_forward
};

// The C ABI's arenas come from cudaMalloc (TensorFlow's come from its allocator).
std::shared_ptr<void> CudaMalloced(int64_t bytes) {
  void* p = nullptr;
  ThrowIfFailed(cudaMalloc(&p, bytes), "cudaMalloc of an arena");
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

int64_t ElementBytes(const Ranker& r) { return r.half ? 2 : 4; }

template <typename T>
EncoderWeights<T> EncoderWeightsOf(const Ranker& r) {
  auto p = [&r](int i) { return static_cast<const T*>(r.weights[i]); };
  EncoderWeights<T> w;
  w.qkv_kernel = p(kQkvKernel);
  w.qkv_bias = p(kQkvBias);
  w.attention_output_kernel = p(kAttentionOutputKernel);
  w.attention_output_bias = p(kAttentionOutputBias);
  w.attention_ln_gamma = p(kAttentionGamma);
  w.attention_ln_beta = p(kAttentionBeta);
  w.intermediate_kernel = p(kIntermediateKernel);
  w.intermediate_bias = p(kIntermediateBias);
  w.output_kernel = p(kOutputKernel);
  w.output_bias = p(kOutputBias);
  w.output_ln_gamma = p(kOutputGamma);
  w.output_ln_beta = p(kOutputBeta);
  return w;
}

template <typename T>
EmbeddingWeights<T> EmbeddingWeightsOf(const Ranker& r) {
  auto p = [&r](int i) { return static_cast<const T*>(r.weights[i]); };
  EmbeddingWeights<T> w;
  w.word = p(kWord);
  w.position = p(kPosition);
  w.token_type = p(kTokenType);
  w.ln_gamma = p(kEmbeddingGamma);
  w.ln_beta = p(kEmbeddingBeta);
  w.vocab_size = r.vocab_size;
  w.max_positions = r.max_positions;
  w.type_vocab_size = r.type_vocab_size;
  w.hidden = r.dims.hidden;
  w.layer_norm_epsilon = r.dims.layer_norm_epsilon;
  return w;
}

template <typename T>
RankerHeadWeights<T> HeadWeightsOf(const Ranker& r) {
  auto p = [&r](int i) { return static_cast<const T*>(r.weights[i]); };
  RankerHeadWeights<T> w;
  w.pooler_kernel = p(kPoolerKernel);
  w.pooler_bias = p(kPoolerBias);
  w.classifier_kernel = p(kClassifierKernel);
  w.classifier_bias = p(kClassifierBias);
  w.hidden = r.dims.hidden;
  w.num_labels = r.num_labels;
  return w;
}

// Workspace: packed hidden [N, H] | first tokens [B, H] | head scratch (RankerHeadWorkspaceBytes) | encoder
// scratch. The pooler and head run as the TF op BertRankerHead runs them (RankerHead). With
// first_token_last_layer the encoder writes the first tokens itself and hidden ends as its last layer's input.
template <typename T>
void Forward(const Ranker& r, const int32_t* input_ids, const int32_t* segment_ids, int64_t seq,
             const PackedBatch& batch, void* workspace, T* hidden_out, float* scores, void* stream) {
  const int64_t h = r.dims.hidden;
  auto* p = static_cast<unsigned char*>(workspace);
  T* hidden = reinterpret_cast<T*>(p);
  p += AlignedBytes(batch.num_tokens * h * sizeof(T));
  if (hidden_out != nullptr) hidden = hidden_out;
  T* first = reinterpret_cast<T*>(p);
  p += AlignedBytes(batch.batch * h * sizeof(T));
  void* head_workspace = p;
  p += RankerHeadWorkspaceBytes<T>(batch.batch, h, r.num_labels);
  void* encoder_workspace = p;

  Embedding<T>(EmbeddingWeightsOf<T>(r), input_ids, segment_ids, seq, batch, hidden, stream);
  Encoder<T>(r.dims, EncoderWeightsOf<T>(r), batch, hidden, encoder_workspace, r.gemm, stream,
             r.first_token_last_layer ? first : nullptr);
  if (!r.first_token_last_layer) {
    LaunchGatherFirstToken<DeviceT<T>>(ToDevice(hidden), h, batch.cu_seqlens_device, batch.batch, ToDevice(first),
                                       AsStream(stream));
  }
  RankerHead<T>(HeadWeightsOf<T>(r), first, batch.batch, head_workspace, scores, r.gemm, stream);
}

PackedBatch MakeBatch(int64_t batch, int64_t num_tokens, int64_t max_seqlen, const int32_t* cu_host,
                      const int32_t* cu_device) {
  PackedBatch b;
  b.batch = batch;
  b.num_tokens = num_tokens;
  b.max_seqlen = max_seqlen;
  b.cu_seqlens_host = cu_host;
  b.cu_seqlens_device = cu_device;
  return b;
}

// The encoder as the TF kernel runs it (BucketedEncoder), with the ranker's encoder weights and cudaMalloc'd arenas.
template <typename T>
void EncoderForward(Ranker& r, const PackedBatch& batch, const void* hidden_in, bool first_token_only, bool graphs,
                    void* out, void* stream) {
  BucketedEncoder<T>(r.encoder_graphs, graphs, r.dims, EncoderWeightsOf<T>(r), batch, static_cast<const T*>(hidden_in),
                     first_token_only, static_cast<T*>(out), r.gemm, CudaMalloced, stream);
}

template <typename Fn>
int Guarded(const Fn& fn) {
  try {
    fn();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

}  // namespace
}  // namespace cuda
}  // namespace bertserve

using bertserve::cuda::Ranker;

// The C ABI is all the library exports (it is built with hidden visibility): two builds loaded in one process,
// as a side-by-side comparison does, then keep their own C++ symbols, tile tables included.
#pragma GCC visibility push(default)
extern "C" {

const char* bertserve_cuda_last_error() { return bertserve::cuda::last_error.c_str(); }

// half: 1 for fp16 weights and activations, 0 for float32. weights: kNumWeights device pointers (see WeightIndex).
// autotune, custom_gemms: GemmOptions (gemm.h). first_token_last_layer: 1 runs the encoder's last layer for each
// row's first token only (what the pooler reads), 0 for every token.
void* bertserve_cuda_ranker_create(int half, int autotune, int custom_gemms, int first_token_last_layer,
                                   int64_t vocab_size, int64_t hidden, int64_t num_heads, int64_t intermediate,
                                   int64_t num_layers, int64_t max_positions, int64_t type_vocab_size,
                                   int64_t num_labels, float layer_norm_epsilon, const void* const* weights) {
  Ranker* ranker = nullptr;
  const int status = bertserve::cuda::Guarded([&] {
    if (num_labels != 1 && num_labels != 2) throw std::runtime_error("num_labels must be 1 or 2");
    auto* r = new Ranker{};
    r->half = half != 0;
    r->first_token_last_layer = first_token_last_layer != 0;
    r->dims.hidden = hidden;
    r->dims.num_heads = num_heads;
    r->dims.intermediate = intermediate;
    r->dims.num_layers = num_layers;
    r->dims.layer_norm_epsilon = layer_norm_epsilon;
    r->vocab_size = vocab_size;
    r->max_positions = max_positions;
    r->type_vocab_size = type_vocab_size;
    r->num_labels = num_labels;
    for (int i = 0; i < bertserve::cuda::kNumWeights; ++i) r->weights[i] = weights[i];
    try {
      bertserve::cuda::GemmOptions options;
      options.autotune = autotune != 0;
      options.custom_gemms = custom_gemms != 0;
      r->gemm = bertserve::cuda::CreateGemmContext(options);
    } catch (...) {
      delete r;
      throw;
    }
    ranker = r;
  });
  return status == 0 ? ranker : nullptr;
}

// How the ranker's fp16 GEMMs run for each shape planned so far (gemm.h DescribeGemmPlans).
const char* bertserve_cuda_ranker_describe_plans(void* ranker) {
  thread_local std::string description;
  description = bertserve::cuda::DescribeGemmPlans(static_cast<Ranker*>(ranker)->gemm);
  return description.c_str();
}

void bertserve_cuda_ranker_destroy(void* ranker) {
  auto* r = static_cast<Ranker*>(ranker);
  if (r == nullptr) return;
  bertserve::cuda::DestroyGemmContext(r->gemm);
  delete r;
}

int64_t bertserve_cuda_ranker_workspace_bytes(void* ranker, int64_t max_tokens, int64_t max_batch) {
  const Ranker& r = *static_cast<Ranker*>(ranker);
  const int64_t e = bertserve::cuda::ElementBytes(r);
  const int64_t encoder =
      r.half ? bertserve::cuda::EncoderWorkspaceBytes<bertserve::fp16>(r.dims, max_tokens, max_batch)
             : bertserve::cuda::EncoderWorkspaceBytes<float>(r.dims, max_tokens, max_batch);
  // The head's scratch grows with the batch (none for the one-kernel head, at batch 1 alone), so max_batch's
  // covers every smaller batch.
  const int64_t head =
      r.half ? bertserve::cuda::RankerHeadWorkspaceBytes<bertserve::fp16>(max_batch, r.dims.hidden, r.num_labels)
             : bertserve::cuda::RankerHeadWorkspaceBytes<float>(max_batch, r.dims.hidden, r.num_labels);
  return bertserve::cuda::AlignedBytes(max_tokens * r.dims.hidden * e) +
         bertserve::cuda::AlignedBytes(max_batch * r.dims.hidden * e) + head + encoder;
}

int64_t bertserve_cuda_token_bucket(int64_t num_tokens) { return bertserve::cuda::TokenBucket(num_tokens); }

// input_ids/segment_ids: device [batch, seq]; cu_seqlens on host and device; num_tokens >= cu_seqlens[batch]
// (a larger value runs a CUDA-graph bucket); hidden_out: device [num_tokens, H] or null (the encoder's output, or
// its last layer's input with first_token_last_layer); scores: device [batch].
int bertserve_cuda_ranker_forward(void* ranker, const int32_t* input_ids, const int32_t* segment_ids, int64_t seq,
                                  int64_t batch, const int32_t* cu_seqlens_host, const int32_t* cu_seqlens_device,
                                  int64_t num_tokens, int64_t max_seqlen, void* workspace, void* hidden_out,
                                  float* scores, void* stream) {
  return bertserve::cuda::Guarded([&] {
    const Ranker& r = *static_cast<Ranker*>(ranker);
    const bertserve::PackedBatch b =
        bertserve::cuda::MakeBatch(batch, num_tokens, max_seqlen, cu_seqlens_host, cu_seqlens_device);
    if (r.half) {
      bertserve::cuda::Forward<bertserve::fp16>(r, input_ids, segment_ids, seq, b, workspace,
                                                static_cast<bertserve::fp16*>(hidden_out), scores, stream);
    } else {
      bertserve::cuda::Forward<float>(r, input_ids, segment_ids, seq, b, workspace, static_cast<float*>(hidden_out),
                                      scores, stream);
    }
  });
}

// The encoder as the TF kernel runs it (BucketedEncoder), with the ranker's encoder weights: hidden_in device
// [cu_seqlens[batch], H] (the real tokens), cu_seqlens host [batch + 1], out device [cu_seqlens[batch], H] or with
// first_token_only [batch, H]; graphs 1 replays the ranker's encoder graphs (captured on a key's first call), 0
// launches the same kernels one by one on the same arena.
int bertserve_cuda_encoder_forward(void* ranker, const void* hidden_in, int64_t batch, const int32_t* cu_seqlens_host,
                                   int first_token_only, int graphs, void* out, void* stream) {
  return bertserve::cuda::Guarded([&] {
    Ranker& r = *static_cast<Ranker*>(ranker);
    const std::string problem = bertserve::CheckCuSeqlens(cu_seqlens_host, batch, cu_seqlens_host[batch]);
    if (!problem.empty()) throw std::runtime_error(problem);
    const bertserve::PackedBatch b = bertserve::cuda::MakeBatch(
        batch, cu_seqlens_host[batch], bertserve::MaxSeqlen(cu_seqlens_host, batch), cu_seqlens_host, nullptr);
    if (r.half) {
      bertserve::cuda::EncoderForward<bertserve::fp16>(r, b, hidden_in, first_token_only != 0, graphs != 0, out,
                                                       stream);
    } else {
      bertserve::cuda::EncoderForward<float>(r, b, hidden_in, first_token_only != 0, graphs != 0, out, stream);
    }
  });
}

// Encoder graphs the ranker holds now.
int64_t bertserve_cuda_encoder_graph_count(void* ranker) {
  return static_cast<Ranker*>(ranker)->encoder_graphs.size();
}

// The padding ops on fp16 or float (half = 1 or 0) device buffers.
int bertserve_cuda_remove_padding(int half, const void* padded, int64_t seq, int64_t hidden, int64_t batch,
                                  const int32_t* cu_seqlens_device, int64_t num_tokens, void* packed, void* stream) {
  return bertserve::cuda::Guarded([&] {
    const bertserve::PackedBatch b = bertserve::cuda::MakeBatch(batch, num_tokens, seq, nullptr, cu_seqlens_device);
    if (half) {
      bertserve::cuda::RemovePadding(static_cast<const bertserve::fp16*>(padded), seq, hidden, b,
                                     static_cast<bertserve::fp16*>(packed), stream);
    } else {
      bertserve::cuda::RemovePadding(static_cast<const float*>(padded), seq, hidden, b, static_cast<float*>(packed),
                                     stream);
    }
  });
}

int bertserve_cuda_rebuild_padding(int half, const void* packed, int64_t seq, int64_t hidden, int64_t batch,
                                   const int32_t* cu_seqlens_device, void* padded, void* stream) {
  return bertserve::cuda::Guarded([&] {
    const bertserve::PackedBatch b = bertserve::cuda::MakeBatch(batch, 0, seq, nullptr, cu_seqlens_device);
    if (half) {
      bertserve::cuda::RebuildPadding(static_cast<const bertserve::fp16*>(packed), seq, hidden, b,
                                      static_cast<bertserve::fp16*>(padded), stream);
    } else {
      bertserve::cuda::RebuildPadding(static_cast<const float*>(packed), seq, hidden, b, static_cast<float*>(padded),
                                      stream);
    }
  });
}

}  // extern "C"
#pragma GCC visibility pop
