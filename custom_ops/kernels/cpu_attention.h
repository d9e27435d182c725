// Multi-head self-attention of the CPU backend on packed tokens: each sequence attends over its real length only.
#ifndef BERTSERVE_KERNELS_CPU_ATTENTION_H_
#define BERTSERVE_KERNELS_CPU_ATTENTION_H_

#include "custom_ops/kernels/bert_core.h"

namespace bertserve {
namespace cpu {

// context [N, H] = softmax(Q K^T / sqrt(head_size)) V per sequence and head, from qkv [N, 3H] (the fused QKV
// projection: Q, K and V blocks of H columns, heads contiguous within each).
void SelfAttention(const EncoderDims& dims, const PackedBatch& batch, const float* qkv, float* context,
                   const ThreadPool& pool);

// context [B, H] (one row per sequence) = the attention of each sequence's first token over the sequence's real
// tokens, per head, from qkv [N, 3H]; zeros for a sequence without tokens. All the attention the last layer of
// a first-token output needs.
void FirstTokenAttention(const EncoderDims& dims, const PackedBatch& batch, const float* qkv, float* context,
                         const ThreadPool& pool);

}  // namespace cpu
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CPU_ATTENTION_H_
