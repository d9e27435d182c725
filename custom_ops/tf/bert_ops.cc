// Registrations of the fused BERT ops: names, inputs, attrs and shape functions. These are a file format
// (exported SavedModels refer to them); custom_ops/README.md documents them.
#include "custom_ops/tf/bert_op_inputs.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace bertserve {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Input `index` must have `rank`; the error names the input.
absl::Status Rank(InferenceContext* c, int index, int rank, const char* name, ShapeHandle* out) {
  absl::Status s = c->WithRank(c->input(index), rank, out);
  if (!s.ok()) return tf::InvalidArgument(name, " must have rank ", rank, ": ", s.message());
  return absl::OkStatus();
}

// dim (of the input called `name`) must agree with *known; *known becomes the more specific of the two.
absl::Status Agree(InferenceContext* c, DimensionHandle dim, const char* name, DimensionHandle* known) {
  absl::Status s = c->Merge(*known, dim, known);
  if (!s.ok()) return tf::InvalidArgument(name, " misshapen: ", s.message());
  return absl::OkStatus();
}

// The batch size B of a cu_seqlens [B + 1].
absl::Status BatchOf(InferenceContext* c, ShapeHandle cu_seqlens, DimensionHandle* batch) {
  return c->Subtract(c->Dim(cu_seqlens, 0), 1, batch);
}

absl::Status EmbeddingShape(InferenceContext* c) {
  ShapeHandle ids, segments, mask, word, position, token_type, gamma, beta;
  TF_RETURN_IF_ERROR(Rank(c, 0, 2, "input_ids", &ids));
  TF_RETURN_IF_ERROR(Rank(c, 1, 2, "segment_ids", &segments));
  TF_RETURN_IF_ERROR(Rank(c, 2, 2, "input_mask", &mask));
  TF_RETURN_IF_ERROR(Rank(c, 3, 2, "word_embeddings", &word));
  TF_RETURN_IF_ERROR(Rank(c, 4, 2, "position_embeddings", &position));
  TF_RETURN_IF_ERROR(Rank(c, 5, 2, "token_type_embeddings", &token_type));
  TF_RETURN_IF_ERROR(Rank(c, 6, 1, "layer_norm_gamma", &gamma));
  TF_RETURN_IF_ERROR(Rank(c, 7, 1, "layer_norm_beta", &beta));
  DimensionHandle batch = c->Dim(ids, 0), seq = c->Dim(ids, 1);
  for (auto [shape, name] : {std::pair{segments, "segment_ids"}, std::pair{mask, "input_mask"}}) {
    TF_RETURN_IF_ERROR(Agree(c, c->Dim(shape, 0), name, &batch));
    TF_RETURN_IF_ERROR(Agree(c, c->Dim(shape, 1), name, &seq));
  }
  DimensionHandle hidden = c->Dim(word, 1);
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(position, 1), "position_embeddings", &hidden));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(token_type, 1), "token_type_embeddings", &hidden));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(gamma, 0), "layer_norm_gamma", &hidden));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(beta, 0), "layer_norm_beta", &hidden));
  const DimensionHandle max_positions = c->Dim(position, 0);
  if (c->ValueKnown(seq) && c->ValueKnown(max_positions) && c->Value(seq) > c->Value(max_positions)) {
    return tf::InvalidArgument("sequence length ", c->Value(seq),
                                               " exceeds the max positions of position_embeddings (",
                                               c->Value(max_positions), ")");
  }
  DimensionHandle batch_plus_one;
  TF_RETURN_IF_ERROR(c->Add(batch, 1, &batch_plus_one));
  c->set_output(0, c->Matrix(c->UnknownDim(), hidden));
  c->set_output(1, c->Vector(batch_plus_one));
  return absl::OkStatus();
}

absl::Status EncoderShape(InferenceContext* c) {
  ShapeHandle hidden_in, cu_seqlens;
  TF_RETURN_IF_ERROR(Rank(c, 0, 2, "hidden", &hidden_in));
  TF_RETURN_IF_ERROR(Rank(c, 1, 1, "cu_seqlens", &cu_seqlens));
  DimensionHandle tokens = c->Dim(hidden_in, 0), hidden = c->Dim(hidden_in, 1);
  DimensionHandle layers = c->UnknownDim(), intermediate = c->UnknownDim();
  DimensionHandle hidden3;
  ShapeHandle w;
  TF_RETURN_IF_ERROR(Rank(c, 2, 3, "qkv_kernel", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "qkv_kernel", &layers));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 1), "qkv_kernel", &hidden));
  TF_RETURN_IF_ERROR(c->Multiply(hidden, 3, &hidden3));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 2), "qkv_kernel", &hidden3));
  TF_RETURN_IF_ERROR(Rank(c, 3, 2, "qkv_bias", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "qkv_bias", &layers));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 1), "qkv_bias", &hidden3));
  TF_RETURN_IF_ERROR(Rank(c, 4, 3, "attention_output_kernel", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "attention_output_kernel", &layers));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 1), "attention_output_kernel", &hidden));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 2), "attention_output_kernel", &hidden));
  TF_RETURN_IF_ERROR(Rank(c, 8, 3, "intermediate_kernel", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "intermediate_kernel", &layers));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 1), "intermediate_kernel", &hidden));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 2), "intermediate_kernel", &intermediate));
  TF_RETURN_IF_ERROR(Rank(c, 9, 2, "intermediate_bias", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "intermediate_bias", &layers));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 1), "intermediate_bias", &intermediate));
  TF_RETURN_IF_ERROR(Rank(c, 10, 3, "output_kernel", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "output_kernel", &layers));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 1), "output_kernel", &intermediate));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 2), "output_kernel", &hidden));
  const std::pair<int, const char*> layer_vectors[] = {
      {5, "attention_output_bias"}, {6, "attention_ln_gamma"}, {7, "attention_ln_beta"},
      {11, "output_bias"},          {12, "output_ln_gamma"},   {13, "output_ln_beta"}};
  for (const auto& [index, name] : layer_vectors) {
    TF_RETURN_IF_ERROR(Rank(c, index, 2, name, &w));
    TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), name, &layers));
    TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 1), name, &hidden));
  }
  int64_t num_heads = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_heads", &num_heads));
  if (c->ValueKnown(hidden) && c->Value(hidden) % num_heads != 0) {
    return tf::InvalidArgument("hidden size ", c->Value(hidden), " is not divisible by num_heads ",
                                               num_heads);
  }
  bool first_token_only = false;
  TF_RETURN_IF_ERROR(c->GetAttr("first_token_only", &first_token_only));
  if (first_token_only) {
    DimensionHandle batch;
    TF_RETURN_IF_ERROR(BatchOf(c, cu_seqlens, &batch));
    c->set_output(0, c->Matrix(batch, hidden));
  } else {
    c->set_output(0, c->Matrix(tokens, hidden));
  }
  return absl::OkStatus();
}

absl::Status RemovePaddingShape(InferenceContext* c) {
  ShapeHandle input, mask;
  TF_RETURN_IF_ERROR(Rank(c, 0, 3, "input", &input));
  TF_RETURN_IF_ERROR(Rank(c, 1, 2, "input_mask", &mask));
  DimensionHandle batch = c->Dim(input, 0), seq = c->Dim(input, 1);
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(mask, 0), "input_mask", &batch));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(mask, 1), "input_mask", &seq));
  DimensionHandle batch_plus_one;
  TF_RETURN_IF_ERROR(c->Add(batch, 1, &batch_plus_one));
  c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(input, 2)));
  c->set_output(1, c->Vector(batch_plus_one));
  return absl::OkStatus();
}

absl::Status RebuildPaddingShape(InferenceContext* c) {
  ShapeHandle input, mask;
  TF_RETURN_IF_ERROR(Rank(c, 0, 2, "input", &input));
  TF_RETURN_IF_ERROR(Rank(c, 1, 2, "input_mask", &mask));
  c->set_output(0, c->MakeShape({c->Dim(mask, 0), c->Dim(mask, 1), c->Dim(input, 1)}));
  return absl::OkStatus();
}

absl::Status GatherFirstTokenShape(InferenceContext* c) {
  ShapeHandle input, cu_seqlens;
  TF_RETURN_IF_ERROR(Rank(c, 0, 2, "input", &input));
  TF_RETURN_IF_ERROR(Rank(c, 1, 1, "cu_seqlens", &cu_seqlens));
  DimensionHandle batch;
  TF_RETURN_IF_ERROR(BatchOf(c, cu_seqlens, &batch));
  c->set_output(0, c->Matrix(batch, c->Dim(input, 1)));
  return absl::OkStatus();
}

absl::Status RankerHeadShape(InferenceContext* c) {
  ShapeHandle first, w;
  TF_RETURN_IF_ERROR(Rank(c, 0, 2, "first_tokens", &first));
  DimensionHandle hidden = c->Dim(first, 1), labels = c->UnknownDim();
  TF_RETURN_IF_ERROR(Rank(c, 1, 2, "pooler_kernel", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "pooler_kernel", &hidden));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 1), "pooler_kernel", &hidden));
  TF_RETURN_IF_ERROR(Rank(c, 2, 1, "pooler_bias", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "pooler_bias", &hidden));
  TF_RETURN_IF_ERROR(Rank(c, 3, 2, "classifier_kernel", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "classifier_kernel", &hidden));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 1), "classifier_kernel", &labels));
  TF_RETURN_IF_ERROR(Rank(c, 4, 1, "classifier_bias", &w));
  TF_RETURN_IF_ERROR(Agree(c, c->Dim(w, 0), "classifier_bias", &labels));
  if (c->ValueKnown(labels) && c->Value(labels) != 1 && c->Value(labels) != 2) {
    return tf::InvalidArgument("classifier_kernel has ", c->Value(labels),
                               " labels (columns), but a ranker head has 1 or 2");
  }
  c->set_output(0, c->Vector(c->Dim(first, 0)));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("BertEmbedding")
    .Input("input_ids: int32")
    .Input("segment_ids: int32")
    .Input("input_mask: int32")
    .Input("word_embeddings: T")
    .Input("position_embeddings: T")
    .Input("token_type_embeddings: T")
    .Input("layer_norm_gamma: T")
    .Input("layer_norm_beta: T")
    .Output("hidden: T")
    .Output("cu_seqlens: int32")
    .Attr("T: {float, half}")
    .Attr("layer_norm_epsilon: float = 1e-12")
    .SetShapeFn(EmbeddingShape)
    .Doc("Word + position + token-type lookup and LayerNorm of the real tokens, written packed [N, H].");

REGISTER_OP("BertEncoder")
    .Input("hidden: T")
    .Input("cu_seqlens: int32")
    .Input("qkv_kernel: T")
    .Input("qkv_bias: T")
    .Input("attention_output_kernel: T")
    .Input("attention_output_bias: T")
    .Input("attention_ln_gamma: T")
    .Input("attention_ln_beta: T")
    .Input("intermediate_kernel: T")
    .Input("intermediate_bias: T")
    .Input("output_kernel: T")
    .Input("output_bias: T")
    .Input("output_ln_gamma: T")
    .Input("output_ln_beta: T")
    .Output("output: T")
    .Attr("T: {float, half}")
    .Attr("num_heads: int >= 1")
    .Attr("layer_norm_epsilon: float = 1e-12")
    .Attr("first_token_only: bool = false")
    .Attr("gemm_operands: {'float', 'bfloat16'} = 'float'")
    .SetShapeFn(EncoderShape)
    .Doc(R"doc(A stack of L post-LayerNorm BERT layers on packed tokens; weights stacked on a leading layer axis.

output: every token [N, H]; with first_token_only, each row's first token [B, H] (B = size of cu_seqlens - 1),
  zeros for a row without tokens: BertGatherFirstToken of the full output, computed without the last layer's
  work past its QKV GEMM on the other tokens.
gemm_operands: bfloat16 (T float, CPU only): the four weight GEMMs of each layer take their operands rounded to
  bfloat16 and sum in float; everything else stays in float.
)doc");

REGISTER_OP("BertRemovePadding")
    .Input("input: T")
    .Input("input_mask: int32")
    .Output("output: T")
    .Output("cu_seqlens: int32")
    .Attr("T: {float, half}")
    .SetShapeFn(RemovePaddingShape)
    .Doc("[B, S, H] -> packed [N, H] real positions plus cu_seqlens [B + 1].");

REGISTER_OP("BertRebuildPadding")
    .Input("input: T")
    .Input("input_mask: int32")
    .Output("output: T")
    .Attr("T: {float, half}")
    .SetShapeFn(RebuildPaddingShape)
    .Doc("Packed [N, H] -> [B, S, H] with zeros on padded positions.");

REGISTER_OP("BertGatherFirstToken")
    .Input("input: T")
    .Input("cu_seqlens: int32")
    .Output("output: T")
    .Attr("T: {float, half}")
    .SetShapeFn(GatherFirstTokenShape)
    .Doc("The first real token of each row [B, H]; zeros for a row with no real token.");

REGISTER_OP("BertRankerHead")
    .Input("first_tokens: T")
    .Input("pooler_kernel: T")
    .Input("pooler_bias: T")
    .Input("classifier_kernel: T")
    .Input("classifier_bias: T")
    .Output("scores: float")
    .Attr("T: {float, half}")
    .SetShapeFn(RankerHeadShape)
    .Doc(R"doc(A ranker's pooler and classifier on first tokens [B, H], computed in float.

scores: [B], sigmoid of the logit of tanh(first_tokens @ pooler_kernel + pooler_bias) @ classifier_kernel +
  classifier_bias for one label (classifier_kernel [H, 1]), the softmax probability of label 1 for two.
)doc");

}  // namespace bertserve
