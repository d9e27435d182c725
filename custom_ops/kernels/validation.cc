// Input checks shared by the CPU and CUDA backends. They run on the host before any kernel, so a bad request is
// rejected with a message naming the problem instead of reading out of bounds.
#include <algorithm>
#include <limits>
#include <string>

#include "custom_ops/kernels/bert_core.h"

namespace bertserve {

std::string CuSeqlensFromMask(const int32_t* mask, int64_t batch, int64_t seq, int32_t* cu_seqlens) {
  cu_seqlens[0] = 0;
  int64_t tokens = 0;  // counted in 64 bits: a mask may hold more ones than cu_seqlens' int32 can count
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* row = mask + b * seq;
    int64_t length = 0;
    for (int64_t s = 0; s < seq; ++s) {
      const int32_t m = row[s];
      if (m != 0 && m != 1) {
        return "input_mask[" + std::to_string(b) + "," + std::to_string(s) + "] = " + std::to_string(m) +
               " but a mask value must be 0 or 1";
      }
      if (m == 1) {
        if (length != s) {
          return "input_mask row " + std::to_string(b) + " has a gap: position " + std::to_string(length) +
                 " is 0 but position " + std::to_string(s) + " is 1 (real positions must come first)";
        }
        ++length;
      }
    }
    tokens += length;
    if (tokens > std::numeric_limits<int32_t>::max()) {
      return "input_mask has more than " + std::to_string(std::numeric_limits<int32_t>::max()) +
             " real positions (by row " + std::to_string(b) + "), more than int32 cu_seqlens can count";
    }
    cu_seqlens[b + 1] = static_cast<int32_t>(tokens);
  }
  return "";
}

std::string CheckCuSeqlens(const int32_t* cu_seqlens, int64_t batch, int64_t num_tokens) {
  if (cu_seqlens[0] != 0) {
    return "cu_seqlens[0] = " + std::to_string(cu_seqlens[0]) + " but it must be 0";
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (cu_seqlens[b + 1] < cu_seqlens[b]) {
      return "cu_seqlens decreases at index " + std::to_string(b + 1) + ": " + std::to_string(cu_seqlens[b]) +
             " then " + std::to_string(cu_seqlens[b + 1]);
    }
  }
  if (cu_seqlens[batch] != num_tokens) {
    return "cu_seqlens ends at " + std::to_string(cu_seqlens[batch]) + " but the packed input has " +
           std::to_string(num_tokens) + " tokens";
  }
  return "";
}

int64_t MaxSeqlen(const int32_t* cu_seqlens, int64_t batch) {
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) longest = std::max<int64_t>(longest, cu_seqlens[b + 1] - cu_seqlens[b]);
  return longest;
}

namespace {

std::string CheckIdRange(const char* name, const int32_t* ids, const int32_t* cu_seqlens, int64_t batch,
                         int64_t seq, int64_t limit, const char* limit_name) {
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int64_t s = 0; s < length; ++s) {
      const int32_t id = ids[b * seq + s];
      if (id < 0 || id >= limit) {
        return std::string(name) + "[" + std::to_string(b) + "," + std::to_string(s) + "] = " +
               std::to_string(id) + " is out of range [0, " + std::to_string(limit) + ") (" + limit_name + ")";
      }
    }
  }
  return "";
}

}  // namespace

std::string CheckTokenIds(const int32_t* input_ids, const int32_t* segment_ids, const int32_t* cu_seqlens,
                          int64_t batch, int64_t seq, int64_t vocab_size, int64_t type_vocab_size) {
  std::string error = CheckIdRange("input_ids", input_ids, cu_seqlens, batch, seq, vocab_size,
                                   "rows of word_embeddings");
  if (error.empty()) {
    error = CheckIdRange("segment_ids", segment_ids, cu_seqlens, batch, seq, type_vocab_size,
                         "rows of token_type_embeddings");
  }
  return error;
}

std::string CheckEncoderDims(const EncoderDims& dims) {
  if (dims.num_heads < 1) return "num_heads must be >= 1, got " + std::to_string(dims.num_heads);
  if (dims.hidden < 1) return "hidden size must be >= 1, got " + std::to_string(dims.hidden);
  if (dims.hidden % dims.num_heads != 0) {
    return "hidden size " + std::to_string(dims.hidden) + " is not divisible by num_heads " +
           std::to_string(dims.num_heads);
  }
  if (dims.intermediate < 1) return "intermediate size must be >= 1, got " + std::to_string(dims.intermediate);
  if (!(dims.layer_norm_epsilon >= 0.0f)) return "layer_norm_epsilon must be >= 0";
  return "";
}

}  // namespace bertserve
