// The CUDA backend of bert_core.h: per layer one QKV GEMM (bias in the cuBLASLt epilogue), fused attention,
// output GEMM + (residual + LayerNorm), FFN GEMM + GELU, FFN output GEMM + (residual + LayerNorm). Tokens stay
// packed throughout; the launch shapes come from the host-side PackedBatch, so nothing waits on the device.
#include <cuda_fp16.h>

#include <string>

#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/kernels.h"

namespace bertserve {
namespace cuda {
namespace {

constexpr int64_t kAlignment = 256;

int64_t Aligned(int64_t bytes) { return CeilDiv(bytes, kAlignment) * kAlignment; }

// Carves the caller's workspace into the encoder's buffers, in the order EncoderWorkspaceBytes counts them.
template <typename T>
struct EncoderBuffers {
  void* gemm_workspace;
  T* qkv;      // [N, 3H]
  T* context;  // [N, H]
  T* dense;    // [N, H]: a GEMM output before residual + LayerNorm
  T* ffn;      // [N, I]

  EncoderBuffers(const EncoderDims& dims, int64_t tokens, void* workspace) {
    auto* p = static_cast<unsigned char*>(workspace);
    auto take = [&p](int64_t bytes) {
      void* out = p;
      p += Aligned(bytes);
      return out;
    };
    gemm_workspace = take(kGemmWorkspaceBytes);
    qkv = static_cast<T*>(take(tokens * 3 * dims.hidden * sizeof(T)));
    context = static_cast<T*>(take(tokens * dims.hidden * sizeof(T)));
    dense = static_cast<T*>(take(tokens * dims.hidden * sizeof(T)));
    ffn = static_cast<T*>(take(tokens * dims.intermediate * sizeof(T)));
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

}  // namespace

template <typename T>
int64_t EncoderWorkspaceBytes(const EncoderDims& dims, int64_t max_tokens) {
  const int64_t element = sizeof(T);
  return Aligned(kGemmWorkspaceBytes) + Aligned(max_tokens * 3 * dims.hidden * element) +
         2 * Aligned(max_tokens * dims.hidden * element) + Aligned(max_tokens * dims.intermediate * element);
}

template <typename T>
void Embedding(const EmbeddingWeights<T>& w, const int32_t* input_ids, const int32_t* segment_ids, int64_t seq,
               const PackedBatch& batch, T* hidden_out, void* stream) {
  LaunchEmbeddingLayerNorm(ToDevice(w.word), ToDevice(w.position), ToDevice(w.token_type), ToDevice(w.ln_gamma),
                           ToDevice(w.ln_beta), w.vocab_size, w.type_vocab_size, input_ids, segment_ids, seq,
                           batch.cu_seqlens_device, batch.batch, batch.num_tokens, w.hidden, w.layer_norm_epsilon,
                           ToDevice(hidden_out), AsStream(stream));
}

template <typename T>
void Encoder(const EncoderDims& dims, const EncoderWeights<T>& w, const PackedBatch& batch, T* hidden,
             void* workspace, GemmContext* gemm, void* stream) {
  CheckDims(dims);
  using D = DeviceT<T>;
  const int64_t n = batch.num_tokens, h = dims.hidden, inter = dims.intermediate;
  if (n == 0) return;
  const EncoderBuffers<D> buf(dims, n, workspace);
  D* x = ToDevice(hidden);
  const cudaStream_t s = AsStream(stream);
  const bool gelu_in_epilogue = OptionsOf(gemm).gelu_tanh_epilogue;
  const Epilogue ffn_epilogue = gelu_in_epilogue ? Epilogue::kBiasGeluTanh : Epilogue::kBias;
  auto gemm_bias = [&](const D* in, const T* weight, const T* bias, D* out, int64_t n_out, int64_t k_in,
                       Epilogue epilogue) {
    Gemm<D, D>(gemm, in, ToDevice(weight), ToDevice(bias), out, n, n_out, k_in, epilogue, buf.gemm_workspace, stream);
  };
  for (int64_t l = 0; l < dims.num_layers; ++l) {
    gemm_bias(x, w.qkv_kernel + l * h * 3 * h, w.qkv_bias + l * 3 * h, buf.qkv, 3 * h, h, Epilogue::kBias);
    LaunchAttention<D>(buf.qkv, batch.cu_seqlens_device, batch.batch, batch.max_seqlen, dims.num_heads,
                       dims.head_size(), buf.context, s);
    gemm_bias(buf.context, w.attention_output_kernel + l * h * h, w.attention_output_bias + l * h, buf.dense, h, h,
              Epilogue::kBias);
    LaunchResidualLayerNorm<D>(buf.dense, ToDevice(w.attention_ln_gamma) + l * h,
                               ToDevice(w.attention_ln_beta) + l * h, n, h, dims.layer_norm_epsilon, x, s);
    gemm_bias(x, w.intermediate_kernel + l * h * inter, w.intermediate_bias + l * inter, buf.ffn, inter, h,
              ffn_epilogue);
    if (!gelu_in_epilogue) LaunchGelu<D>(buf.ffn, n * inter, s);
    gemm_bias(buf.ffn, w.output_kernel + l * inter * h, w.output_bias + l * h, buf.dense, h, inter, Epilogue::kBias);
    LaunchResidualLayerNorm<D>(buf.dense, ToDevice(w.output_ln_gamma) + l * h, ToDevice(w.output_ln_beta) + l * h, n,
                               h, dims.layer_norm_epsilon, x, s);
  }
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
  template int64_t EncoderWorkspaceBytes<T>(const EncoderDims&, int64_t);                                           \
  template void Embedding<T>(const EmbeddingWeights<T>&, const int32_t*, const int32_t*, int64_t, const PackedBatch&, \
                             T*, void*);                                                                            \
  template void Encoder<T>(const EncoderDims&, const EncoderWeights<T>&, const PackedBatch&, T*, void*, GemmContext*, \
                           void*);                                                                                  \
  template void RemovePadding<T>(const T*, int64_t, int64_t, const PackedBatch&, T*, void*);                        \
  template void RebuildPadding<T>(const T*, int64_t, int64_t, const PackedBatch&, T*, void*);                       \
  template void GatherFirstToken<T>(const T*, int64_t, const PackedBatch&, T*, void*);

BERTSERVE_INSTANTIATE_CUDA_CORE(float)
BERTSERVE_INSTANTIATE_CUDA_CORE(fp16)

}  // namespace cuda
}  // namespace bertserve
