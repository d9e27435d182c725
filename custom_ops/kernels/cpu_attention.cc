// Attention as a few MKL calls per sequence and group of heads: the per-head products (scores = Q K^T and
// context = P V, len x len x head_size each) as one strided batch of GEMMs each, Q, K and V read straight from
// the fused QKV rows, and the softmax's exponentials from MKL's vector math, all heads of the group at once.
// A first token's attention alone (one query per sequence) is two matrix-vector products per head.
#include "custom_ops/kernels/cpu_attention.h"

#include <mkl.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "custom_ops/kernels/cpu_math.h"

namespace bertserve {
namespace cpu {
namespace {

// Scores of one pass stay within L2 (256 KiB): a long sequence's heads are split into smaller groups, and a
// sequence too long for one pass is taken a block of queries at a time (at least kMinQueryRows, so that each pass
// over a long sequence's keys serves several queries). Scratch is then linear in the sequence length, never
// len * len, whose count overflows int from 46,341 tokens and whose bytes no machine has for long rows.
constexpr int64_t kMaxScoreFloats = 1 << 16;
constexpr int64_t kMinQueryRows = 16;

// Tasks per thread, so that sequences of unequal length even out across the threads.
constexpr int64_t kTasksPerThread = 8;

// Heads per task: all of a sequence's heads when there are enough sequences to share out, fewer otherwise.
int64_t HeadsPerTask(const EncoderDims& d, const PackedBatch& batch, int num_threads) {
  const int64_t by_scratch = std::max<int64_t>(1, kMaxScoreFloats / (batch.max_seqlen * batch.max_seqlen));
  const int64_t by_tasks = std::max<int64_t>(1, d.num_heads * batch.batch / (kTasksPerThread * num_threads));
  return std::min({d.num_heads, by_scratch, by_tasks});
}

// Queries per pass for `heads` heads of a sequence of `len` tokens.
int64_t QueryRows(int64_t len, int64_t heads) {
  return std::min(len, std::max(kMinQueryRows, kMaxScoreFloats / (heads * len)));
}

// Scratch of one task (AttentionHeads): the scores of a pass, then each head's context before it is interleaved
// into the output (MKL's strided batch does not write interleaved matrices).
int64_t ScratchFloats(int64_t len, int64_t head_size, int64_t heads) {
  return heads * QueryRows(len, heads) * (len + head_size);
}

float ScoreScale(int64_t head_size) { return 1.0f / std::sqrt(static_cast<float>(head_size)); }

// MKL's CBLAS takes int sizes; token counts are int32 (cu_seqlens), so only products of them can exceed it.
int BlasInt(int64_t value) {
  if (value > INT_MAX) throw std::length_error("an attention size exceeds MKL's int range: " + std::to_string(value));
  return static_cast<int>(value);
}

// Softmax over each of `rows` rows of len scores, in place.
void Softmax(float* scores, int64_t rows, int64_t len) {
  SubtractRowMaxima(scores, rows, len);
  vmsExp(BlasInt(rows * len), scores, scores, VML_HA);
  ScaleRowsToUnitSum(scores, rows, len);
}

// Attention of `heads` consecutive heads of one sequence of `len` tokens; q, k, v point at the first head's
// columns of the first token's Q, K and V blocks (row stride ld); out likewise into the context (ld_out).
// scratch holds ScratchFloats(len, head_size, heads) floats.
void AttentionHeads(const float* q, const float* k, const float* v, int64_t ld, int64_t len, int64_t head_size,
                    int64_t heads, float* scratch, float* out, int64_t ld_out) {
  const int64_t query_rows = QueryRows(len, heads);
  const int n = BlasInt(len), hs = BlasInt(head_size), count = BlasInt(heads), ldq = BlasInt(ld);
  for (int64_t first = 0; first < len; first += query_rows) {
    const int64_t rows = std::min(query_rows, len - first);
    const int r = BlasInt(rows), block = BlasInt(rows * len), context_block = BlasInt(rows * head_size);
    float* scores = scratch;
    float* head_context = scratch + heads * rows * len;
    cblas_sgemm_batch_strided(CblasRowMajor, CblasNoTrans, CblasTrans, r, n, hs, ScoreScale(head_size),
                              q + first * ld, ldq, hs, k, ldq, hs, 0.0f, scores, n, block, count);
    Softmax(scores, heads * rows, len);
    cblas_sgemm_batch_strided(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, hs, n, 1.0f, scores, n, block, v, ldq,
                              hs, 0.0f, head_context, hs, context_block, count);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < rows; ++i) {
        std::copy_n(head_context + (h * rows + i) * head_size, head_size,
                    out + (first + i) * ld_out + h * head_size);
      }
    }
  }
}

}  // namespace

void SelfAttention(const EncoderDims& d, const PackedBatch& batch, const float* qkv, float* context,
                   const ThreadPool& pool) {
  if (batch.max_seqlen == 0) return;
  const int64_t hidden = d.hidden, head_size = d.head_size(), max_len = batch.max_seqlen;
  const int64_t group = HeadsPerTask(d, batch, pool.num_threads);
  const int64_t groups = (d.num_heads + group - 1) / group;
  const int64_t cost = 4 * max_len * max_len * head_size * group;
  pool.parallel_for(batch.batch * groups, cost, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / groups, first_head = task % groups * group;
      const int64_t first = batch.cu_seqlens_host[b];
      const int64_t len = batch.cu_seqlens_host[b + 1] - first;
      if (len == 0) continue;
      const int64_t heads = std::min(group, d.num_heads - first_head);
      scratch.resize(std::max<size_t>(scratch.size(), ScratchFloats(len, head_size, heads)));
      const float* q = qkv + first * 3 * hidden + first_head * head_size;
      AttentionHeads(q, q + hidden, q + 2 * hidden, 3 * hidden, len, head_size, heads, scratch.data(),
                     context + first * hidden + first_head * head_size, hidden);
    }
  });
}

void FirstTokenAttention(const EncoderDims& d, const PackedBatch& batch, const float* qkv, float* context,
                         const ThreadPool& pool) {
  const int64_t hidden = d.hidden, head_size = d.head_size(), heads = d.num_heads, max_len = batch.max_seqlen;
  const int ld = BlasInt(3 * hidden), hs = BlasInt(head_size);
  const float scale = ScoreScale(head_size);
  pool.parallel_for(batch.batch, 4 * max_len * hidden, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    scores.resize(std::max<size_t>(scores.size(), heads * max_len));
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = batch.cu_seqlens_host[b];
      const int64_t len = batch.cu_seqlens_host[b + 1] - first;
      float* out = context + b * hidden;
      if (len == 0) {
        std::fill_n(out, hidden, 0.0f);
        continue;
      }
      const float* q = qkv + first * 3 * hidden;  // the first token's row: its Q, then every token's K and V
      const int n = BlasInt(len);
      for (int64_t h = 0; h < heads; ++h) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n, hs, scale, q + hidden + h * head_size, ld, q + h * head_size, 1,
                    0.0f, scores.data() + h * len, 1);
      }
      Softmax(scores.data(), heads, len);
      for (int64_t h = 0; h < heads; ++h) {
        cblas_sgemv(CblasRowMajor, CblasTrans, n, hs, 1.0f, q + 2 * hidden + h * head_size, ld,
                    scores.data() + h * len, 1, 0.0f, out + h * head_size, 1);
      }
    }
  });
}

}  // namespace cpu
}  // namespace bertserve
