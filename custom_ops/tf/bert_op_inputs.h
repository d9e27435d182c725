// Input reading and validation shared by the CPU and GPU OpKernels of the fused BERT ops. Every check returns a
// Status naming the input, what came and what was expected; kernels raise it once with OP_REQUIRES_OK.
#ifndef BERTSERVE_TF_BERT_OP_INPUTS_H_
#define BERTSERVE_TF_BERT_OP_INPUTS_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/kernels/bert_core.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace bertserve {
namespace tf {

// InvalidArgument status whose message concatenates args (strings, numbers), tf.text style: name the input,
// what came, what was expected.
template <typename... Args>
absl::Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// TF element type -> core element type (Eigen::half and fp16 share a layout).
template <typename T>
struct CoreTypeOf {
  using type = T;
};
template <>
struct CoreTypeOf<Eigen::half> {
  using type = fp16;
};
template <typename T>
using CoreType = typename CoreTypeOf<T>::type;

template <typename T>
const CoreType<T>* CoreData(const tensorflow::Tensor& t) {
  return reinterpret_cast<const CoreType<T>*>(t.flat<T>().data());
}
template <typename T>
CoreType<T>* CoreData(tensorflow::Tensor* t) {
  return reinterpret_cast<CoreType<T>*>(t->flat<T>().data());
}

// BertEncoder's gemm_operands attr ('float' or 'bfloat16', as bert_ops.cc registers it). The CPU kernel adds its
// own check (bfloat16 needs T=float); the GPU kernel refuses bfloat16.
absl::Status ReadGemmOperands(tensorflow::OpKernelConstruction* ctx, cpu::GemmOperands* operands);

// `t` (the input called `name`) must have exactly the dims `expected`.
absl::Status CheckShape(const char* name, const tensorflow::Tensor& t, std::initializer_list<int64_t> expected);

// From a host int32 [B, S] mask: fills cu_seqlens (host, [B + 1]) and describes the packed batch.
absl::Status PackFromMask(const tensorflow::Tensor& input_mask, int32_t* cu_seqlens, PackedBatch* batch);

// From a host int32 [B + 1] cu_seqlens for `num_tokens` packed rows.
absl::Status PackFromCuSeqlens(const tensorflow::Tensor& cu_seqlens, int64_t num_tokens, PackedBatch* batch);

// BertEmbedding's rules for its token inputs, host int32 [batch, seq] arrays: seq <= max_positions, mask values
// 0 or 1 with the real positions of a row first, ids and segment ids of real positions in range. The one
// implementation of these rules: the op calls it, and so does the server (through
// bertserve_check_token_inputs) before a request may join a batch, so that no request the op would refuse
// can fail a batch. Empty string = OK; cu_seqlens ([batch + 1]) receives the packing.
std::string CheckTokenInputs(const int32_t* input_ids, const int32_t* segment_ids, const int32_t* input_mask,
                             int64_t batch, int64_t seq, int64_t vocab_size, int64_t max_positions,
                             int64_t type_vocab_size, int32_t* cu_seqlens);

// Checks BertEmbedding's inputs (shapes, then CheckTokenInputs) and fills the weights view. cu_seqlens (host,
// [B + 1]) receives the packing.
template <typename T>
absl::Status ReadEmbeddingInputs(tensorflow::OpKernelContext* ctx, float layer_norm_epsilon, int32_t* cu_seqlens,
                                 PackedBatch* batch, EmbeddingWeights<CoreType<T>>* weights);

// Checks BertEncoder's `hidden` and stacked weights (inputs 0 and 2..13) and fills dims and the weights view.
template <typename T>
absl::Status ReadEncoderInputs(tensorflow::OpKernelContext* ctx, int64_t num_heads, float layer_norm_epsilon,
                               EncoderDims* dims, EncoderWeights<CoreType<T>>* weights);

// Checks BertRankerHead's inputs: first_tokens [B, H] with H >= 1, pooler_kernel [H, H], pooler_bias [H],
// classifier_kernel [H, num_labels] with 1 or 2 labels, classifier_bias [num_labels]; fills the weights view and
// allocates the output, scores [B].
template <typename T>
absl::Status ReadRankerHeadInputs(tensorflow::OpKernelContext* ctx, RankerHeadWeights<CoreType<T>>* weights,
                                  tensorflow::Tensor** scores);

}  // namespace tf
}  // namespace bertserve

#endif  // BERTSERVE_TF_BERT_OP_INPUTS_H_
