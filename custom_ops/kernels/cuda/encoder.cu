// The CUDA backend of bert_core.h: per layer one QKV GEMM (bias in the cuBLASLt epilogue), fused attention,
// output GEMM + (bias + residual + LayerNorm), FFN GEMM + bias + GELU (in fp16 through GemmBiasGelu, which puts
// them in a CUTLASS GEMM's epilogue where that is faster), FFN output GEMM + (bias + residual + LayerNorm); asked
// for first tokens, the last layer past its QKV GEMM runs on one row per sequence. Tokens stay packed throughout;
// the launch shapes come from the host-side PackedBatch, so nothing waits on the device.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

// GemmKSplit's partial products, fp16 encoders only.
template <typename T>
int64_t PartialsBytes(const EncoderDims& dims, int64_t rows) {
  if (!std::is_same_v<T, __half> && !std::is_same_v<T, fp16>) return 0;
  return kMaxKSplits * std::min(rows, kKSplitMaxTokens) * dims.hidden * static_cast<int64_t>(sizeof(float));
}

// Carves the caller's workspace into the encoder's buffers, in the order EncoderWorkspaceBytes counts them.
template <typename T>
struct EncoderBuffers {
  void* gemm_workspace;
  T* qkv;      // [N, 3H]
  T* context;  // [N, H]
  T* dense;    // [N, H]: a GEMM output before residual + LayerNorm
  T* ffn;      // [N, I]
  float* partials;  // fp16: [kMaxKSplits, min(N, kKSplitMaxTokens), H], GemmKSplit's partial products

  EncoderBuffers(const EncoderDims& dims, int64_t tokens, void* workspace) {
    auto* p = static_cast<unsigned char*>(workspace);
    auto take = [&p](int64_t bytes) {
      void* out = p;
      p += AlignedBytes(bytes);
      return out;
    };
    gemm_workspace = take(kGemmWorkspaceBytes);
    qkv = static_cast<T*>(take(tokens * 3 * dims.hidden * sizeof(T)));
    context = static_cast<T*>(take(tokens * dims.hidden * sizeof(T)));
    dense = static_cast<T*>(take(tokens * dims.hidden * sizeof(T)));
    ffn = static_cast<T*>(take(tokens * dims.intermediate * sizeof(T)));
    partials = static_cast<float*>(take(PartialsBytes<T>(dims, tokens)));
  }
};

void CheckDims(const EncoderDims& dims) {
  if (dims.num_heads <= 0 || dims.hidden % dims.num_heads != 0) {
    throw std::runtime_error("hidden " + std::to_string(dims.hidden) + " is not divisible by num_heads " +
                             std::to_string(dims.num_heads));
  }
  if (dims.intermediate % 2 != 0) {
    throw std::runtime_error("the CUDA core needs an even intermediate size, got " +
                             std::to_string(dims.intermediate));
  }
}

// One layer's slices of the stacked weights, as device types.
template <typename D>
struct LayerWeights {
  const D *qkv_kernel, *qkv_bias, *attention_output_kernel, *attention_output_bias, *attention_ln_gamma,
      *attention_ln_beta, *intermediate_kernel, *intermediate_bias, *output_kernel, *output_bias, *output_ln_gamma,
      *output_ln_beta;

  template <typename T>
  LayerWeights(const EncoderDims& dims, const EncoderWeights<T>& w, int64_t l) {
    const int64_t h = dims.hidden, inter = dims.intermediate;
    qkv_kernel = ToDevice(w.qkv_kernel) + l * h * 3 * h;
    qkv_bias = ToDevice(w.qkv_bias) + l * 3 * h;
    attention_output_kernel = ToDevice(w.attention_output_kernel) + l * h * h;
    attention_output_bias = ToDevice(w.attention_output_bias) + l * h;
    attention_ln_gamma = ToDevice(w.attention_ln_gamma) + l * h;
    attention_ln_beta = ToDevice(w.attention_ln_beta) + l * h;
    intermediate_kernel = ToDevice(w.intermediate_kernel) + l * h * inter;
    intermediate_bias = ToDevice(w.intermediate_bias) + l * inter;
    output_kernel = ToDevice(w.output_kernel) + l * inter * h;
    output_bias = ToDevice(w.output_bias) + l * h;
    output_ln_gamma = ToDevice(w.output_ln_gamma) + l * h;
    output_ln_beta = ToDevice(w.output_ln_beta) + l * h;
  }
};

// The vectors a layer reads up to its first LayerNorm (QKV bias; attention-output bias, gamma, beta), which the
// layer before's last LayerNorm asks L2 for.
template <typename D>
L2Prefetch VectorsBeforeFirstLayerNorm(const EncoderDims& dims, const LayerWeights<D>& w) {
  const int64_t h = dims.hidden * static_cast<int64_t>(sizeof(D));
  return {{w.qkv_bias, w.attention_output_bias, w.attention_ln_gamma, w.attention_ln_beta}, {3 * h, h, h, h}};
}

// The vectors a layer reads after its first LayerNorm (FFN bias; FFN-output bias, gamma, beta), which that
// LayerNorm asks L2 for.
template <typename D>
L2Prefetch VectorsAfterFirstLayerNorm(const EncoderDims& dims, const LayerWeights<D>& w) {
  const int64_t h = dims.hidden * static_cast<int64_t>(sizeof(D));
  const int64_t inter = dims.intermediate * static_cast<int64_t>(sizeof(D));
  return {{w.intermediate_bias, w.output_bias, w.output_ln_gamma, w.output_ln_beta}, {inter, h, h, h}};
}

}  // namespace

template <typename T>
int64_t EncoderWorkspaceBytes(const EncoderDims& dims, int64_t max_tokens, int64_t max_batch) {
  const int64_t element = sizeof(T), rows = std::max(max_tokens, max_batch);
  return AlignedBytes(kGemmWorkspaceBytes) + AlignedBytes(rows * 3 * dims.hidden * element) +
         2 * AlignedBytes(rows * dims.hidden * element) + AlignedBytes(rows * dims.intermediate * element) +
         AlignedBytes(PartialsBytes<T>(dims, rows));
}

template <typename T>
void Embedding(const EmbeddingWeights<T>& w, const int32_t* input_ids, const int32_t* segment_ids, int64_t seq,
               const PackedBatch& batch, T* hidden_out, void* stream) {
  LaunchEmbeddingLayerNorm(ToDevice(w.word), ToDevice(w.position), ToDevice(w.token_type), ToDevice(w.ln_gamma),
                           ToDevice(w.ln_beta), w.vocab_size, w.type_vocab_size, input_ids, segment_ids, seq,
                           batch.cu_seqlens_device, batch.batch, batch.num_tokens, w.hidden, w.layer_norm_epsilon,
                           ToDevice(hidden_out), AsStream(stream));
}

namespace {

// fp16 with custom_gemms: the FFN GEMM + GELU through GemmBiasGelu (see gemm.h).
bool UsesCustomGemms(const GemmContext* gemm, const EncoderDims& dims, bool half) {
  return half && OptionsOf(gemm).custom_gemms && dims.hidden % 8 == 0 && dims.intermediate % 8 == 0;
}

// Every token's attention over buf.qkv into buf.context.
template <typename D>
void Attention(const EncoderDims& dims, const PackedBatch& batch, const EncoderBuffers<D>& buf, void* stream) {
  LaunchAttention<D>(buf.qkv, batch.cu_seqlens_device, batch.batch, batch.max_seqlen, dims.num_heads,
                     dims.head_size(), buf.context, AsStream(stream));
}

// The QKV GEMM into buf.qkv, autotuned (when it is) with the attention after each candidate, into buf.context,
// which the layer's attention then writes anyway.
template <typename D>
void QkvGemm(const EncoderDims& dims, const LayerWeights<D>& w, const PackedBatch& batch, const EncoderBuffers<D>& buf,
             const D* x, GemmContext* gemm, void* stream) {
  Gemm<D, D>(gemm, x, w.qkv_kernel, w.qkv_bias, buf.qkv, batch.num_tokens, 3 * dims.hidden, dims.hidden,
             Epilogue::kBias, buf.gemm_workspace, stream, [&] { Attention<D>(dims, batch, buf, stream); });
}

// The GEMM before a residual LayerNorm, in @ weight over `rows` rows, into scratch: in fp16 with custom GEMMs as
// k-split partial products in buf.partials where GemmKSplit plans them (returns their count), else into buf.dense
// (returns 0). Planned (when autotuned) with the LayerNorm that reads it, on buf.dense.
template <typename D>
int GemmBeforeLayerNorm(const EncoderDims& dims, const D* in, const D* weight, int64_t k_in, const D* bias,
                        const D* gamma, const D* beta, int64_t rows, const EncoderBuffers<D>& buf, bool custom_gemms,
                        GemmContext* context, void* stream) {
  const int64_t h = dims.hidden;
  if constexpr (std::is_same_v<D, __half>) {
    if (custom_gemms) {
      // What the autotuner times each k split with: its LayerNorm, reading the partials (or Gemm's fp16 output
      // there) and writing buf.dense, which a k split leaves unused.
      const auto layer_norm_on_scratch = [&](int parts) {
        const cudaStream_t s = AsStream(stream);
        if (parts == 0) {
          LaunchResidualLayerNorm<D>(reinterpret_cast<const D*>(buf.partials), bias, gamma, beta, rows, h,
                                     dims.layer_norm_epsilon, buf.dense, s, nullptr);
        } else {
          LaunchPartialsResidualLayerNorm<D>(buf.partials, parts, bias, gamma, beta, rows, h,
                                             dims.layer_norm_epsilon, buf.dense, s, nullptr);
        }
      };
      const int parts = GemmKSplit(context, in, weight, buf.partials, rows, h, k_in, buf.gemm_workspace, stream,
                                   layer_norm_on_scratch);
      if (parts > 0) return parts;
    }
  }
  // The bias is left to the LayerNorm, which adds it in fp32.
  Gemm<D, D>(context, in, weight, nullptr, buf.dense, rows, h, k_in, Epilogue::kNone, buf.gemm_workspace, stream);
  return 0;
}

// x = LayerNorm(in @ weight + bias + x) over `rows` rows: GemmBeforeLayerNorm, then the LayerNorm summing its k-split
// partial products or reading buf.dense.
template <typename D>
void GemmResidualLayerNorm(const EncoderDims& dims, const D* in, const D* weight, int64_t k_in, const D* bias,
                           const D* gamma, const D* beta, int64_t rows, const EncoderBuffers<D>& buf,
                           bool custom_gemms, D* x, GemmContext* context, void* stream,
                           const int32_t* zero_rows_without_tokens, const L2Prefetch& next) {
  const int64_t h = dims.hidden;
  const cudaStream_t s = AsStream(stream);
  const int parts = GemmBeforeLayerNorm<D>(dims, in, weight, k_in, bias, gamma, beta, rows, buf, custom_gemms,
                                           context, stream);
  if constexpr (std::is_same_v<D, __half>) {
    if (parts > 0) {
      LaunchPartialsResidualLayerNorm<D>(buf.partials, parts, bias, gamma, beta, rows, h, dims.layer_norm_epsilon, x,
                                         s, zero_rows_without_tokens, next);
      return;
    }
  }
  LaunchResidualLayerNorm<D>(buf.dense, bias, gamma, beta, rows, h, dims.layer_norm_epsilon, x, s,
                             zero_rows_without_tokens, next);
}

// The layer after its attention, on `rows` rows of buf.context (attention output) and x (the layer's input,
// overwritten with its output): attention-output GEMM + bias + residual + LayerNorm, FFN GEMM + bias + GELU,
// FFN-output GEMM + bias + residual + LayerNorm. zero_rows_without_tokens: see LaunchResidualLayerNorm. next: what
// the last LayerNorm asks L2 for (the next layer's VectorsBeforeFirstLayerNorm).
template <typename D>
void AfterAttention(const EncoderDims& dims, const LayerWeights<D>& w, int64_t rows, const EncoderBuffers<D>& buf,
                    bool custom_gemms, D* x, GemmContext* context, void* stream, const L2Prefetch& next,
                    const int32_t* zero_rows_without_tokens = nullptr) {
  const int64_t h = dims.hidden, inter = dims.intermediate;
  GemmResidualLayerNorm<D>(dims, buf.context, w.attention_output_kernel, h, w.attention_output_bias,
                           w.attention_ln_gamma, w.attention_ln_beta, rows, buf, custom_gemms, x, context, stream,
                           nullptr, VectorsAfterFirstLayerNorm<D>(dims, w));
  if (custom_gemms) {  // fp16 only (UsesCustomGemms)
    if constexpr (std::is_same_v<D, __half>) {
      // Planned (when autotuned) with the FFN-output GEMM after it, on scratch.
      GemmBiasGelu(context, x, w.intermediate_kernel, w.intermediate_bias, buf.ffn, rows, inter, h,
                   buf.gemm_workspace, stream, [&] {
                     GemmBeforeLayerNorm<D>(dims, buf.ffn, w.output_kernel, inter, w.output_bias, w.output_ln_gamma,
                                            w.output_ln_beta, rows, buf, custom_gemms, context, stream);
                   });
    }
  } else {
    Gemm<D, D>(context, x, w.intermediate_kernel, nullptr, buf.ffn, rows, inter, h, Epilogue::kNone,
               buf.gemm_workspace, stream);
    LaunchBiasGelu<D>(buf.ffn, w.intermediate_bias, rows, inter, AsStream(stream));
  }
  GemmResidualLayerNorm<D>(dims, buf.ffn, w.output_kernel, inter, w.output_bias, w.output_ln_gamma,
                           w.output_ln_beta, rows, buf, custom_gemms, x, context, stream, zero_rows_without_tokens,
                           next);
}

template <typename D>
void Layer(const EncoderDims& dims, const LayerWeights<D>& w, const PackedBatch& batch, const EncoderBuffers<D>& buf,
           bool custom_gemms, D* x, GemmContext* gemm, void* stream, const L2Prefetch& next) {
  QkvGemm<D>(dims, w, batch, buf, x, gemm, stream);
  Attention<D>(dims, batch, buf, stream);
  AfterAttention<D>(dims, w, batch.num_tokens, buf, custom_gemms, x, gemm, stream, next);
}

// A layer for each row's first token only: the QKV GEMM still runs on every token (all are keys and values), the
// rest on [batch, H] rows, the output going to `first` (the attention kernel copies the residual rows there).
template <typename D>
void FirstTokenLayer(const EncoderDims& dims, const LayerWeights<D>& w, const PackedBatch& batch,
                     const EncoderBuffers<D>& buf, bool custom_gemms, const D* x, D* first, GemmContext* gemm,
                     void* stream) {
  QkvGemm<D>(dims, w, batch, buf, x, gemm, stream);
  LaunchFirstTokenAttention<D>(buf.qkv, x, batch.cu_seqlens_device, batch.batch, batch.max_seqlen, dims.num_heads,
                               dims.head_size(), buf.context, first, AsStream(stream));
  AfterAttention<D>(dims, w, batch.batch, buf, custom_gemms, first, gemm, stream, L2Prefetch{},
                    batch.cu_seqlens_device);
}

}  // namespace

int64_t TokenBucket(int64_t num_tokens) {
  if (num_tokens <= 256) return std::max<int64_t>(16, (num_tokens + 15) / 16 * 16);
  int64_t step = 1;
  while ((step << 5) <= num_tokens) step <<= 1;  // 2^(bit_length - 5)
  return (num_tokens + step - 1) / step * step;
}

template <typename T>
void Encoder(const EncoderDims& dims, const EncoderWeights<T>& w, const PackedBatch& batch, T* hidden,
             void* workspace, GemmContext* gemm, void* stream, T* first_tokens) {
  CheckDims(dims);
  using D = DeviceT<T>;
  const cudaStream_t s = AsStream(stream);
  if (batch.num_tokens == 0) {
    if (first_tokens != nullptr) {
      ThrowIfFailed(cudaMemsetAsync(first_tokens, 0, batch.batch * dims.hidden * sizeof(T), s), "zero first tokens");
    }
    return;
  }
  const EncoderBuffers<D> buf(dims, std::max(batch.num_tokens, batch.batch), workspace);
  const bool custom_gemms = UsesCustomGemms(gemm, dims, std::is_same_v<D, __half>);
  const int64_t all_token_layers = first_tokens == nullptr ? dims.num_layers : dims.num_layers - 1;
  for (int64_t l = 0; l < all_token_layers; ++l) {
    const L2Prefetch next = l + 1 < dims.num_layers
                                ? VectorsBeforeFirstLayerNorm<D>(dims, LayerWeights<D>(dims, w, l + 1))
                                : L2Prefetch{};
    Layer<D>(dims, LayerWeights<D>(dims, w, l), batch, buf, custom_gemms, ToDevice(hidden), gemm, stream, next);
  }
  if (first_tokens == nullptr) return;
  if (dims.num_layers == 0) {
    LaunchGatherFirstToken<D>(ToDevice(hidden), dims.hidden, batch.cu_seqlens_device, batch.batch,
                              ToDevice(first_tokens), s);
    return;
  }
  FirstTokenLayer<D>(dims, LayerWeights<D>(dims, w, dims.num_layers - 1), batch, buf, custom_gemms, ToDevice(hidden),
                     ToDevice(first_tokens), gemm, stream);
}

template <typename T>
void RemovePadding(const T* padded, int64_t seq, int64_t hidden, const PackedBatch& batch, T* packed, void* stream) {
  LaunchRemovePadding(ToDevice(padded), seq, hidden, batch.cu_seqlens_device, batch.batch, batch.num_tokens,
                      ToDevice(packed), AsStream(stream));
}

template <typename T>
void RebuildPadding(const T* packed, int64_t seq, int64_t hidden, const PackedBatch& batch, T* padded,
                    void* stream) {
  LaunchRebuildPadding(ToDevice(packed), seq, hidden, batch.cu_seqlens_device, batch.batch, ToDevice(padded),
                       AsStream(stream));
}

template <typename T>
void GatherFirstToken(const T* packed, int64_t hidden, const PackedBatch& batch, T* first, void* stream) {
  LaunchGatherFirstToken(ToDevice(packed), hidden, batch.cu_seqlens_device, batch.batch, ToDevice(first),
                         AsStream(stream));
}

#define BERTSERVE_INSTANTIATE_CUDA_CORE(T)                                                                          \
  template int64_t EncoderWorkspaceBytes<T>(const EncoderDims&, int64_t, int64_t);                                  \
  template void Embedding<T>(const EmbeddingWeights<T>&, const int32_t*, const int32_t*, int64_t, const PackedBatch&, \
                             T*, void*);                                                                            \
  template void Encoder<T>(const EncoderDims&, const EncoderWeights<T>&, const PackedBatch&, T*, void*, GemmContext*, \
                           void*, T*);                                                                              \
  template void RemovePadding<T>(const T*, int64_t, int64_t, const PackedBatch&, T*, void*);                        \
  template void RebuildPadding<T>(const T*, int64_t, int64_t, const PackedBatch&, T*, void*);                       \
  template void GatherFirstToken<T>(const T*, int64_t, const PackedBatch&, T*, void*);

BERTSERVE_INSTANTIATE_CUDA_CORE(float)
BERTSERVE_INSTANTIATE_CUDA_CORE(fp16)

}  // namespace cuda
}  // namespace bertserve
