// The ranker's pooler and classifier on the CPU (cpu::RankerHead in bert_core.h): the pooler as products of the
// first tokens with column slices of its kernel, read in place, with bias and tanh applied to each slice while it
// is in cache, then the classifier's one or two dot products and the score per row. Everything runs in float; fp16
// inputs are widened first.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cpu_math.h"

namespace bertserve {
namespace cpu {
namespace {

// Rough cycles of one row's classifier and score, for the pool's sharding.
constexpr int64_t kHeadCyclesPerHidden = 4;
// Columns of the pooler kernel per parallel task: 768-byte runs of each kernel row at hidden 768.
constexpr int64_t kPoolerColumns = 192;

// The float values of n elements: the input itself for float, a widened copy (kept in `storage`) for fp16.
template <typename T>
const float* AsFloat(const T* in, int64_t n, std::vector<float>* storage) {
  if constexpr (std::is_same_v<T, float>) {
    return in;
  } else {
    storage->resize(n);
    HalfToFloat(in, storage->data(), n);
    return storage->data();
  }
}

// sigmoid of the one logit, or with two labels the softmax probability of label 1: sigmoid(logit1 - logit0).
float RankerScore(const float* logits, int64_t num_labels) {
  const float z = num_labels == 2 ? logits[1] - logits[0] : logits[0];
  return 1.f / (1.f + std::exp(-z));
}

}  // namespace

template <typename T>
void RankerHead(const RankerHeadWeights<T>& w, const T* first_tokens, int64_t batch, float* scores,
                const ThreadPool& pool) {
  if (batch == 0) return;
  const int64_t h = w.hidden, labels = w.num_labels;
  std::vector<float> first_f, pooler_kernel_f, pooler_bias_f, classifier_kernel_f, classifier_bias_f;
  const float* first = AsFloat(first_tokens, batch * h, &first_f);
  const float* pooler_bias = AsFloat(w.pooler_bias, h, &pooler_bias_f);
  const float* classifier_kernel = AsFloat(w.classifier_kernel, h * labels, &classifier_kernel_f);
  const float* classifier_bias = AsFloat(w.classifier_bias, labels, &classifier_bias_f);
  // The pooler kernel is read in place, not packed for the GEMM kernels: one H x H product per row, so packing
  // (a copy of the kernel into fresh memory on every call) cost more than the product at serving batch sizes.
  const float* pooler_kernel = AsFloat(w.pooler_kernel, h * h, &pooler_kernel_f);
  std::vector<float> pooled(batch * h);
  const int64_t slices = (h + kPoolerColumns - 1) / kPoolerColumns;
  pool.parallel_for(slices, 2 * batch * h * kPoolerColumns, [&](int64_t begin, int64_t end) {
    for (int64_t slice = begin; slice < end; ++slice) {
      const int64_t col_begin = slice * kPoolerColumns, cols = std::min(kPoolerColumns, h - col_begin);
      RowsTimesMatrix(first, h, batch, pooler_kernel + col_begin, h, h, cols, pooled.data() + col_begin, h);
      for (int64_t r = 0; r < batch; ++r) {
        float* row = pooled.data() + r * h;
        for (int64_t c = col_begin; c < col_begin + cols; ++c) row[c] = std::tanh(row[c] + pooler_bias[c]);
      }
    }
  });
  pool.parallel_for(batch, kHeadCyclesPerHidden * h * labels, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float logits[2] = {classifier_bias[0], classifier_bias[labels - 1]};
      const float* row = pooled.data() + b * h;
      for (int64_t k = 0; k < h; ++k) {
        for (int64_t l = 0; l < labels; ++l) logits[l] += row[k] * classifier_kernel[k * labels + l];
      }
      scores[b] = RankerScore(logits, labels);
    }
  });
}

template void RankerHead<float>(const RankerHeadWeights<float>&, const float*, int64_t, float*, const ThreadPool&);
template void RankerHead<fp16>(const RankerHeadWeights<fp16>&, const fp16*, int64_t, float*, const ThreadPool&);

}  // namespace cpu
}  // namespace bertserve
