// CPU embedding (lookup + LayerNorm written packed) and the padding transforms between [B, S, H] and [N, H].
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cpu_math.h"

namespace bertserve {
namespace cpu {
namespace {

// A row of T as float: float rows are used in place, half rows are widened into `scratch`.
const float* RowAsFloat(const float* row, int64_t, float*) { return row; }
const float* RowAsFloat(const fp16* row, int64_t n, float* scratch) {
  HalfToFloat(row, scratch, n);
  return scratch;
}

void StoreRow(const float* row, int64_t n, float* out) {
  if (row != out) std::memcpy(out, row, n * sizeof(float));
}
void StoreRow(const float* row, int64_t n, fp16* out) { FloatToHalf(row, out, n); }

template <typename T>
float* FloatOutput(T* out, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return out;
  } else {
    return scratch;
  }
}

}  // namespace

template <typename T>
void Embedding(const EmbeddingWeights<T>& w, const int32_t* input_ids, const int32_t* segment_ids, int64_t seq,
               const PackedBatch& batch, T* hidden_out, const ThreadPool& pool) {
  const int64_t hidden = w.hidden;
  std::vector<float> norm(2 * hidden);
  const float* gamma = RowAsFloat(w.ln_gamma, hidden, norm.data());
  const float* beta = RowAsFloat(w.ln_beta, hidden, norm.data() + hidden);
  constexpr int64_t kCyclesPerElement = 6;  // three loads, the sum and LayerNorm
  pool.parallel_for(batch.batch, kCyclesPerElement * seq * hidden, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(std::is_same_v<T, float> ? 0 : 4 * hidden);
    float* s = scratch.data();
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = batch.cu_seqlens_host[b];
      const int64_t len = batch.cu_seqlens_host[b + 1] - first;
      for (int64_t p = 0; p < len; ++p) {
        const int64_t id = input_ids[b * seq + p], segment = segment_ids[b * seq + p];
        T* out = hidden_out + (first + p) * hidden;
        float* out_f = FloatOutput(out, s + 3 * hidden);
        SumLayerNorm(RowAsFloat(w.word + id * hidden, hidden, s),
                     RowAsFloat(w.position + p * hidden, hidden, s + hidden),
                     RowAsFloat(w.token_type + segment * hidden, hidden, s + 2 * hidden), gamma, beta, hidden,
                     w.layer_norm_epsilon, out_f);
        StoreRow(out_f, hidden, out);
      }
    }
  });
}

template <typename T>
void RemovePadding(const T* padded, int64_t seq, int64_t hidden, const PackedBatch& batch, T* packed) {
  for (int64_t b = 0; b < batch.batch; ++b) {
    const int64_t first = batch.cu_seqlens_host[b];
    const int64_t len = batch.cu_seqlens_host[b + 1] - first;
    std::memcpy(packed + first * hidden, padded + b * seq * hidden, len * hidden * sizeof(T));
  }
}

template <typename T>
void RebuildPadding(const T* packed, int64_t seq, int64_t hidden, const PackedBatch& batch, T* padded) {
  for (int64_t b = 0; b < batch.batch; ++b) {
    const int64_t first = batch.cu_seqlens_host[b];
    const int64_t len = batch.cu_seqlens_host[b + 1] - first;
    T* row = padded + b * seq * hidden;
    std::memcpy(row, packed + first * hidden, len * hidden * sizeof(T));
    std::memset(static_cast<void*>(row + len * hidden), 0, (seq - len) * hidden * sizeof(T));
  }
}

template <typename T>
void GatherFirstToken(const T* packed, int64_t hidden, const PackedBatch& batch, T* first) {
  for (int64_t b = 0; b < batch.batch; ++b) {
    const int64_t begin = batch.cu_seqlens_host[b];
    T* out = first + b * hidden;
    if (batch.cu_seqlens_host[b + 1] > begin) {
      std::memcpy(out, packed + begin * hidden, hidden * sizeof(T));
    } else {
      std::memset(static_cast<void*>(out), 0, hidden * sizeof(T));  // a row with no real token: zeros
    }
  }
}

#define BERTSERVE_INSTANTIATE(T)                                                                                 \
  template void Embedding<T>(const EmbeddingWeights<T>&, const int32_t*, const int32_t*, int64_t,               \
                             const PackedBatch&, T*, const ThreadPool&);                                        \
  template void RemovePadding<T>(const T*, int64_t, int64_t, const PackedBatch&, T*);                           \
  template void RebuildPadding<T>(const T*, int64_t, int64_t, const PackedBatch&, T*);                          \
  template void GatherFirstToken<T>(const T*, int64_t, const PackedBatch&, T*);
BERTSERVE_INSTANTIATE(float)
BERTSERVE_INSTANTIATE(fp16)
#undef BERTSERVE_INSTANTIATE

}  // namespace cpu
}  // namespace bertserve
