#include "custom_ops/tf/bert_op_inputs.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "tensorflow/core/framework/tensor_shape.h"

namespace bertserve {
namespace tf {

using ::tensorflow::Tensor;

namespace {

std::string ShapeString(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (const int64_t d : dims) s += (s.size() > 1 ? "," : "") + std::to_string(d);
  return s + "]";
}

absl::Status FromMessage(const std::string& message) {
  return message.empty() ? absl::OkStatus() : absl::InvalidArgumentError(message);
}

}  // namespace

absl::Status CheckShape(const char* name, const Tensor& t, std::initializer_list<int64_t> expected) {
  bool same = t.dims() == static_cast<int>(expected.size());
  int i = 0;
  for (const int64_t d : expected) same = same && t.dim_size(i++) == d;
  if (same) return absl::OkStatus();
  return InvalidArgument(name, " misshapen: got ", t.shape().DebugString(), " but expected ", ShapeString(expected));
}

absl::Status ReadGemmOperands(tensorflow::OpKernelConstruction* ctx, cpu::GemmOperands* operands) {
  std::string name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("gemm_operands", &name));
  *operands = name == "bfloat16" ? cpu::GemmOperands::kBfloat16 : cpu::GemmOperands::kFloat;
  return absl::OkStatus();
}

std::string CheckTokenInputs(const int32_t* input_ids, const int32_t* segment_ids, const int32_t* input_mask,
                             int64_t batch, int64_t seq, int64_t vocab_size, int64_t max_positions,
                             int64_t type_vocab_size, int32_t* cu_seqlens) {
  if (seq > max_positions) {
    return "sequence length " + std::to_string(seq) + " exceeds the max positions of position_embeddings (" +
           std::to_string(max_positions) + ")";
  }
  std::string error = CuSeqlensFromMask(input_mask, batch, seq, cu_seqlens);
  if (error.empty()) {
    error = CheckTokenIds(input_ids, segment_ids, cu_seqlens, batch, seq, vocab_size, type_vocab_size);
  }
  return error;
}

absl::Status PackFromMask(const Tensor& input_mask, int32_t* cu_seqlens, PackedBatch* batch) {
  if (input_mask.dims() != 2) {
    return InvalidArgument("input_mask must be [batch, seq], got ", input_mask.shape().DebugString());
  }
  const int64_t b = input_mask.dim_size(0), s = input_mask.dim_size(1);
  TF_RETURN_IF_ERROR(FromMessage(CuSeqlensFromMask(input_mask.flat<int32_t>().data(), b, s, cu_seqlens)));
  batch->batch = b;
  batch->num_tokens = cu_seqlens[b];
  batch->max_seqlen = MaxSeqlen(cu_seqlens, b);
  batch->cu_seqlens_host = cu_seqlens;
  return absl::OkStatus();
}

absl::Status PackFromCuSeqlens(const Tensor& cu_seqlens, int64_t num_tokens, PackedBatch* batch) {
  if (cu_seqlens.dims() != 1 || cu_seqlens.dim_size(0) < 1) {
    return InvalidArgument("cu_seqlens must be [batch + 1], got ", cu_seqlens.shape().DebugString());
  }
  const int64_t b = cu_seqlens.dim_size(0) - 1;
  const int32_t* data = cu_seqlens.flat<int32_t>().data();
  TF_RETURN_IF_ERROR(FromMessage(CheckCuSeqlens(data, b, num_tokens)));
  batch->batch = b;
  batch->num_tokens = num_tokens;
  batch->max_seqlen = MaxSeqlen(data, b);
  batch->cu_seqlens_host = data;
  return absl::OkStatus();
}

template <typename T>
absl::Status ReadEmbeddingInputs(tensorflow::OpKernelContext* ctx, float layer_norm_epsilon, int32_t* cu_seqlens,
                                 PackedBatch* batch, EmbeddingWeights<CoreType<T>>* weights) {
  const Tensor& ids = ctx->input(0);
  const Tensor& segments = ctx->input(1);
  const Tensor& mask = ctx->input(2);
  const Tensor& word = ctx->input(3);
  const Tensor& position = ctx->input(4);
  const Tensor& token_type = ctx->input(5);
  if (ids.dims() != 2) return InvalidArgument("input_ids must be [batch, seq], got ", ids.shape().DebugString());
  const int64_t b = ids.dim_size(0), s = ids.dim_size(1);
  TF_RETURN_IF_ERROR(CheckShape("segment_ids", segments, {b, s}));
  TF_RETURN_IF_ERROR(CheckShape("input_mask", mask, {b, s}));
  if (word.dims() != 2) {
    return InvalidArgument("word_embeddings must be [vocab, hidden], got ", word.shape().DebugString());
  }
  const int64_t hidden = word.dim_size(1);
  if (position.dims() != 2) {
    return InvalidArgument("position_embeddings must be [max_positions, hidden], got ",
                           position.shape().DebugString());
  }
  if (token_type.dims() != 2) {
    return InvalidArgument("token_type_embeddings must be [type_vocab, hidden], got ",
                           token_type.shape().DebugString());
  }
  TF_RETURN_IF_ERROR(CheckShape("position_embeddings", position, {position.dim_size(0), hidden}));
  TF_RETURN_IF_ERROR(CheckShape("token_type_embeddings", token_type, {token_type.dim_size(0), hidden}));
  TF_RETURN_IF_ERROR(CheckShape("layer_norm_gamma", ctx->input(6), {hidden}));
  TF_RETURN_IF_ERROR(CheckShape("layer_norm_beta", ctx->input(7), {hidden}));
  TF_RETURN_IF_ERROR(FromMessage(CheckTokenInputs(ids.flat<int32_t>().data(), segments.flat<int32_t>().data(),
                                                  mask.flat<int32_t>().data(), b, s, word.dim_size(0),
                                                  position.dim_size(0), token_type.dim_size(0), cu_seqlens)));
  batch->batch = b;
  batch->num_tokens = cu_seqlens[b];
  batch->max_seqlen = MaxSeqlen(cu_seqlens, b);
  batch->cu_seqlens_host = cu_seqlens;
  weights->word = CoreData<T>(word);
  weights->position = CoreData<T>(position);
  weights->token_type = CoreData<T>(token_type);
  weights->ln_gamma = CoreData<T>(ctx->input(6));
  weights->ln_beta = CoreData<T>(ctx->input(7));
  weights->vocab_size = word.dim_size(0);
  weights->max_positions = position.dim_size(0);
  weights->type_vocab_size = token_type.dim_size(0);
  weights->hidden = hidden;
  weights->layer_norm_epsilon = layer_norm_epsilon;
  return absl::OkStatus();
}

template <typename T>
absl::Status ReadEncoderInputs(tensorflow::OpKernelContext* ctx, int64_t num_heads, float layer_norm_epsilon,
                               EncoderDims* dims, EncoderWeights<CoreType<T>>* weights) {
  const Tensor& hidden = ctx->input(0);
  if (hidden.dims() != 2) return InvalidArgument("hidden must be [tokens, hidden], got ", hidden.shape().DebugString());
  const Tensor& qkv_kernel = ctx->input(2);
  const Tensor& intermediate_kernel = ctx->input(8);
  if (qkv_kernel.dims() != 3) {
    return InvalidArgument("qkv_kernel must be [layers, hidden, 3 * hidden], got ", qkv_kernel.shape().DebugString());
  }
  if (intermediate_kernel.dims() != 3) {
    return InvalidArgument("intermediate_kernel must be [layers, hidden, intermediate], got ",
                           intermediate_kernel.shape().DebugString());
  }
  const int64_t l = qkv_kernel.dim_size(0), h = hidden.dim_size(1), i = intermediate_kernel.dim_size(2);
  dims->hidden = h;
  dims->num_heads = num_heads;
  dims->intermediate = i;
  dims->num_layers = l;
  dims->layer_norm_epsilon = layer_norm_epsilon;
  TF_RETURN_IF_ERROR(FromMessage(CheckEncoderDims(*dims)));
  TF_RETURN_IF_ERROR(CheckShape("qkv_kernel", qkv_kernel, {l, h, 3 * h}));
  TF_RETURN_IF_ERROR(CheckShape("qkv_bias", ctx->input(3), {l, 3 * h}));
  TF_RETURN_IF_ERROR(CheckShape("attention_output_kernel", ctx->input(4), {l, h, h}));
  TF_RETURN_IF_ERROR(CheckShape("attention_output_bias", ctx->input(5), {l, h}));
  TF_RETURN_IF_ERROR(CheckShape("attention_ln_gamma", ctx->input(6), {l, h}));
  TF_RETURN_IF_ERROR(CheckShape("attention_ln_beta", ctx->input(7), {l, h}));
  TF_RETURN_IF_ERROR(CheckShape("intermediate_kernel", intermediate_kernel, {l, h, i}));
  TF_RETURN_IF_ERROR(CheckShape("intermediate_bias", ctx->input(9), {l, i}));
  TF_RETURN_IF_ERROR(CheckShape("output_kernel", ctx->input(10), {l, i, h}));
  TF_RETURN_IF_ERROR(CheckShape("output_bias", ctx->input(11), {l, h}));
  TF_RETURN_IF_ERROR(CheckShape("output_ln_gamma", ctx->input(12), {l, h}));
  TF_RETURN_IF_ERROR(CheckShape("output_ln_beta", ctx->input(13), {l, h}));
  weights->qkv_kernel = CoreData<T>(qkv_kernel);
  weights->qkv_bias = CoreData<T>(ctx->input(3));
  weights->attention_output_kernel = CoreData<T>(ctx->input(4));
  weights->attention_output_bias = CoreData<T>(ctx->input(5));
  weights->attention_ln_gamma = CoreData<T>(ctx->input(6));
  weights->attention_ln_beta = CoreData<T>(ctx->input(7));
  weights->intermediate_kernel = CoreData<T>(intermediate_kernel);
  weights->intermediate_bias = CoreData<T>(ctx->input(9));
  weights->output_kernel = CoreData<T>(ctx->input(10));
  weights->output_bias = CoreData<T>(ctx->input(11));
  weights->output_ln_gamma = CoreData<T>(ctx->input(12));
  weights->output_ln_beta = CoreData<T>(ctx->input(13));
  return absl::OkStatus();
}

template <typename T>
absl::Status ReadRankerHeadInputs(tensorflow::OpKernelContext* ctx, RankerHeadWeights<CoreType<T>>* weights,
                                  Tensor** scores) {
  const Tensor& first = ctx->input(0);
  const Tensor& classifier_kernel = ctx->input(3);
  if (first.dims() != 2 || first.dim_size(1) < 1) {
    return InvalidArgument("first_tokens must be [batch, hidden] with hidden >= 1, got ", first.shape().DebugString());
  }
  const int64_t h = first.dim_size(1);
  TF_RETURN_IF_ERROR(CheckShape("pooler_kernel", ctx->input(1), {h, h}));
  TF_RETURN_IF_ERROR(CheckShape("pooler_bias", ctx->input(2), {h}));
  if (classifier_kernel.dims() != 2) {
    return InvalidArgument("classifier_kernel must be [hidden, num_labels], got ",
                           classifier_kernel.shape().DebugString());
  }
  const int64_t labels = classifier_kernel.dim_size(1);
  if (labels != 1 && labels != 2) {
    return InvalidArgument("classifier_kernel has ", labels, " labels (columns), but a ranker head has 1 or 2");
  }
  TF_RETURN_IF_ERROR(CheckShape("classifier_kernel", classifier_kernel, {h, labels}));
  TF_RETURN_IF_ERROR(CheckShape("classifier_bias", ctx->input(4), {labels}));
  weights->pooler_kernel = CoreData<T>(ctx->input(1));
  weights->pooler_bias = CoreData<T>(ctx->input(2));
  weights->classifier_kernel = CoreData<T>(classifier_kernel);
  weights->classifier_bias = CoreData<T>(ctx->input(4));
  weights->hidden = h;
  weights->num_labels = labels;
  return ctx->allocate_output(0, tensorflow::TensorShape({first.dim_size(0)}), scores);
}

#define BERTSERVE_INSTANTIATE(T)                                                                          \
  template absl::Status ReadEmbeddingInputs<T>(tensorflow::OpKernelContext*, float, int32_t*, PackedBatch*, \
                                               EmbeddingWeights<CoreType<T>>*);                             \
  template absl::Status ReadEncoderInputs<T>(tensorflow::OpKernelContext*, int64_t, float, EncoderDims*,    \
                                             EncoderWeights<CoreType<T>>*);                                 \
  template absl::Status ReadRankerHeadInputs<T>(tensorflow::OpKernelContext*, RankerHeadWeights<CoreType<T>>*, \
                                                Tensor**);
BERTSERVE_INSTANTIATE(float)
BERTSERVE_INSTANTIATE(Eigen::half)
#undef BERTSERVE_INSTANTIATE

}  // namespace tf
}  // namespace bertserve

// For the server (bertserve/server/token_inputs.py, through ctypes): CheckTokenInputs on one request. Returns 0
// when the inputs pass, else 1 with the message, truncated to message_size - 1 bytes and NUL-terminated.
extern "C" __attribute__((visibility("default"))) int bertserve_check_token_inputs(
    const int32_t* input_ids, const int32_t* segment_ids, const int32_t* input_mask, int64_t batch, int64_t seq,
    int64_t vocab_size, int64_t max_positions, int64_t type_vocab_size, char* message, int64_t message_size) {
  std::string error;
  try {
    std::vector<int32_t> cu_seqlens(static_cast<size_t>(batch) + 1);
    error = bertserve::tf::CheckTokenInputs(input_ids, segment_ids, input_mask, batch, seq, vocab_size,
                                            max_positions, type_vocab_size, cu_seqlens.data());
  } catch (const std::exception& e) {  // nothing may unwind through the C ABI
    error = std::string("token input check failed: ") + e.what();
  }
  if (error.empty()) return 0;
  if (message_size > 0) {
    const size_t n = std::min<size_t>(error.size(), static_cast<size_t>(message_size - 1));
    std::memcpy(message, error.data(), n);
    message[n] = '\0';
  }
  return 1;
}
