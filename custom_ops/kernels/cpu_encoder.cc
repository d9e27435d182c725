// CPU encoder stack on packed tokens: per layer three GEMM phases (QKV, attention output, FFN) through
// ParallelGemm, attention per sequence over its real length only (cpu_attention.h), and fused row epilogues.
// half is computed in float: activations and one layer's weights are widened into the workspace. float weights
// may come pre-packed for the GEMMs (PackEncoderWeights). For a first-token output the last layer runs past its
// QKV GEMM on one row per sequence: its first token, gathered into the workspace.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cpu_attention.h"
#include "custom_ops/kernels/cpu_gemm.h"
#include "custom_ops/kernels/cpu_math.h"

namespace bertserve {
namespace cpu {
namespace {

constexpr int64_t kAlignFloats = 16;  // 64-byte alignment of every workspace region
// Rough cycle costs for TensorFlow's ParallelFor, which runs a loop inline when it is too small to share.
constexpr int64_t kLayerNormCyclesPerElement = 4;
constexpr int64_t kConvertCyclesPerElement = 1;
// Up to this many rows a sublayer's LayerNorm runs inside its projection GEMM (ProjectionResidualLayerNorm).
constexpr int64_t kFusedLayerNormRows = 64;

int64_t Aligned(int64_t floats) { return (floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Float regions of the per-layer scratch. The FFN intermediate reuses the QKV + context region (both are dead
// by then), so the workspace is N * (max(4H, I) + H) floats.
struct LayerScratch {
  float* qkv;           // [N, 3H]
  float* context;       // [N, H], right after qkv
  float* intermediate;  // [N, I], aliases qkv + context
  float* projection;    // [N, H]: output of the attention-output and FFN-output GEMMs before their epilogue
};

int64_t LayerScratchFloats(const EncoderDims& d, int64_t n) {
  return Aligned(n * std::max(4 * d.hidden, d.intermediate)) + Aligned(n * d.hidden);
}

LayerScratch CarveLayerScratch(const EncoderDims& d, int64_t n, float* base) {
  LayerScratch s;
  s.qkv = base;
  s.context = base + n * 3 * d.hidden;
  s.intermediate = base;
  s.projection = base + Aligned(n * std::max(4 * d.hidden, d.intermediate));
  return s;
}

// The float workspace both encoders share: the layer scratch for every token and, for a first-token output
// (first_rows = batch, else 0), for every row too (rows without tokens may outnumber the tokens), plus the first
// tokens' residual stream [first_rows, H] of the last layer.
struct EncoderScratch {
  LayerScratch layer;
  float* first;  // [first_rows, H]
  float* end;    // past the region: the fp16 encoder's own part follows
};

int64_t EncoderScratchFloats(const EncoderDims& d, int64_t num_tokens, int64_t first_rows) {
  return LayerScratchFloats(d, std::max(num_tokens, first_rows)) + Aligned(first_rows * d.hidden);
}

EncoderScratch CarveEncoderScratch(const EncoderDims& d, int64_t num_tokens, int64_t first_rows, float* base) {
  const int64_t rows = std::max(num_tokens, first_rows);
  EncoderScratch s;
  s.layer = CarveLayerScratch(d, rows, base);
  s.first = base + LayerScratchFloats(d, rows);
  s.end = s.first + Aligned(first_rows * d.hidden);
  return s;
}

// Sizes of one layer's slice of each stacked weight, in EncoderWeights order.
struct LayerSizes {
  int64_t qkv_kernel, qkv_bias, hh, h, intermediate_kernel, intermediate_bias;
  explicit LayerSizes(const EncoderDims& d)
      : qkv_kernel(3 * d.hidden * d.hidden),
        qkv_bias(3 * d.hidden),
        hh(d.hidden * d.hidden),
        h(d.hidden),
        intermediate_kernel(d.hidden * d.intermediate),
        intermediate_bias(d.intermediate) {}
  int64_t TotalFloats() const {
    return Aligned(qkv_kernel) + Aligned(qkv_bias) + Aligned(hh) + 6 * Aligned(h) + 2 * Aligned(intermediate_kernel) +
           Aligned(intermediate_bias);
  }
};

template <typename T>
EncoderWeights<T> LayerSlice(const EncoderWeights<T>& w, const LayerSizes& z, int64_t layer) {
  EncoderWeights<T> s;
  s.qkv_kernel = w.qkv_kernel + layer * z.qkv_kernel;
  s.qkv_bias = w.qkv_bias + layer * z.qkv_bias;
  s.attention_output_kernel = w.attention_output_kernel + layer * z.hh;
  s.attention_output_bias = w.attention_output_bias + layer * z.h;
  s.attention_ln_gamma = w.attention_ln_gamma + layer * z.h;
  s.attention_ln_beta = w.attention_ln_beta + layer * z.h;
  s.intermediate_kernel = w.intermediate_kernel + layer * z.intermediate_kernel;
  s.intermediate_bias = w.intermediate_bias + layer * z.intermediate_bias;
  s.output_kernel = w.output_kernel + layer * z.intermediate_kernel;
  s.output_bias = w.output_bias + layer * z.h;
  s.output_ln_gamma = w.output_ln_gamma + layer * z.h;
  s.output_ln_beta = w.output_ln_beta + layer * z.h;
  return s;
}

void ParallelRows(const ThreadPool& pool, int64_t rows, int64_t cost_per_row,
                  const std::function<void(int64_t)>& row_fn) {
  pool.parallel_for(rows, cost_per_row, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row_fn(r);
  });
}

// Converts n elements between half and float in parallel chunks (convert is HalfToFloat or FloatToHalf).
template <typename In, typename Out>
void ParallelConvert(const ThreadPool& pool, void (*convert)(const In*, Out*, int64_t), const In* in, int64_t n,
                     Out* out) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  ParallelRows(pool, chunks, kConvertCyclesPerElement * kChunk, [&](int64_t c) {
    const int64_t begin = c * kChunk;
    convert(in + begin, out + begin, std::min(kChunk, n - begin));
  });
}

// Widens one layer's half weights into `out` (LayerSizes::TotalFloats floats) and returns float views of them.
EncoderWeights<float> WidenLayer(const ThreadPool& pool, const EncoderWeights<fp16>& w, const LayerSizes& z,
                                 float* out) {
  EncoderWeights<float> f;
  auto widen = [&](const fp16* src, int64_t n, const float** dst) {
    ParallelConvert(pool, HalfToFloat, src, n, out);
    *dst = out;
    out += Aligned(n);
  };
  widen(w.qkv_kernel, z.qkv_kernel, &f.qkv_kernel);
  widen(w.qkv_bias, z.qkv_bias, &f.qkv_bias);
  widen(w.attention_output_kernel, z.hh, &f.attention_output_kernel);
  widen(w.attention_output_bias, z.h, &f.attention_output_bias);
  widen(w.attention_ln_gamma, z.h, &f.attention_ln_gamma);
  widen(w.attention_ln_beta, z.h, &f.attention_ln_beta);
  widen(w.intermediate_kernel, z.intermediate_kernel, &f.intermediate_kernel);
  widen(w.intermediate_bias, z.intermediate_bias, &f.intermediate_bias);
  widen(w.output_kernel, z.intermediate_kernel, &f.output_kernel);
  widen(w.output_bias, z.h, &f.output_bias);
  widen(w.output_ln_gamma, z.h, &f.output_ln_gamma);
  widen(w.output_ln_beta, z.h, &f.output_ln_beta);
  return f;
}

// One GEMM of a layer; B is `packed` when the caller packed it, else the row-major weights b [k, n], packed for
// this product alone (the fp16 encoder, whose float weights exist only for the layer being run).
void LayerGemm(const ThreadPool& pool, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
               const PackedMatrix* packed, float* c, const GemmEpilogue& epilogue,
               const GemmRowsEpilogue& rows_epilogue = {}) {
  if (packed != nullptr) {
    ParallelGemm(pool, m, a, *packed, c, epilogue, rows_epilogue);
  } else {
    ParallelGemm(pool, m, a, PackedMatrix(pool, k, n, b), c, epilogue, rows_epilogue);
  }
}

// The projection GEMM of a sublayer (attention output, FFN output) into `projection`, then bias + residual +
// LayerNorm into x. On up to kFusedLayerNormRows rows the thread that finishes the GEMM's last column block
// normalises all of them, which spares the pool a hand-off: one loop fewer per sublayer, 12 of the 42 loops
// of a 6-layer call at batch 1. On more rows the LayerNorm is a parallel loop of its own, which the serial rows
// would outlast.
void ProjectionResidualLayerNorm(const ThreadPool& pool, int64_t m, int64_t n, int64_t k, const float* a,
                                 const float* b, const PackedMatrix* packed, const float* bias, const float* gamma,
                                 const float* beta, float eps, float* projection, float* x) {
  auto norm_rows = [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      AddBiasResidualLayerNorm(projection + r * n, bias, gamma, beta, n, eps, x + r * n);
    }
  };
  if (m <= kFusedLayerNormRows) {
    LayerGemm(pool, m, n, k, a, b, packed, projection, {}, norm_rows);
    return;
  }
  LayerGemm(pool, m, n, k, a, b, packed, projection, {});
  ParallelRows(pool, m, kLayerNormCyclesPerElement * n, [&](int64_t r) { norm_rows(r, r + 1); });
}

// Epilogue of a GEMM into c (rows of ld floats): row_fn (AddBias or AddBiasGelu) on each row of a finished tile,
// with the tile's slice of bias.
GemmEpilogue BiasRowsEpilogue(void (*row_fn)(const float*, int64_t, float*), const float* bias, float* c,
                              int64_t ld) {
  return [=](const GemmTile& t) {
    for (int64_t r = t.row_begin; r < t.row_end; ++r) {
      row_fn(bias + t.col_begin, t.col_end - t.col_begin, c + r * ld + t.col_begin);
    }
  };
}

}  // namespace

// The GEMM weights of one layer in the packed layout of `backend`.
struct PackedLayer {
  PackedLayer(const EncoderDims& d, const EncoderWeights<float>& w, const ThreadPool& pool,
              const GemmBackend& backend)
      : qkv(pool, d.hidden, 3 * d.hidden, w.qkv_kernel, backend),
        attention_output(pool, d.hidden, d.hidden, w.attention_output_kernel, backend),
        intermediate(pool, d.hidden, d.intermediate, w.intermediate_kernel, backend),
        output(pool, d.intermediate, d.hidden, w.output_kernel, backend) {}
  PackedMatrix qkv, attention_output, intermediate, output;
};

class PackedEncoderWeights {
 public:
  std::vector<PackedLayer> layers;
};

namespace {

void QkvProjection(const EncoderDims& d, const EncoderWeights<float>& w, const PackedLayer* packed, int64_t n,
                   const float* x, const LayerScratch& s, const ThreadPool& pool) {
  LayerGemm(pool, n, 3 * d.hidden, d.hidden, x, w.qkv_kernel, packed ? &packed->qkv : nullptr, s.qkv,
            BiasRowsEpilogue(AddBias, w.qkv_bias, s.qkv, 3 * d.hidden));
}

// The layer past attention on m rows: attention output GEMM, bias + residual + LayerNorm, FFN, bias + residual +
// LayerNorm, in place on the residual rows x [m, H], from the attention context [m, H].
void AfterAttention(const EncoderDims& d, const EncoderWeights<float>& w, const PackedLayer* packed, int64_t m,
                    const float* context, float* x, const LayerScratch& s, const ThreadPool& pool) {
  const int64_t hidden = d.hidden, inter = d.intermediate;
  const float eps = d.layer_norm_epsilon;
  ProjectionResidualLayerNorm(pool, m, hidden, hidden, context, w.attention_output_kernel,
                              packed ? &packed->attention_output : nullptr, w.attention_output_bias,
                              w.attention_ln_gamma, w.attention_ln_beta, eps, s.projection, x);
  LayerGemm(pool, m, inter, hidden, x, w.intermediate_kernel, packed ? &packed->intermediate : nullptr,
            s.intermediate, BiasRowsEpilogue(AddBiasGelu, w.intermediate_bias, s.intermediate, inter));
  ProjectionResidualLayerNorm(pool, m, hidden, inter, s.intermediate, w.output_kernel,
                              packed ? &packed->output : nullptr, w.output_bias, w.output_ln_gamma,
                              w.output_ln_beta, eps, s.projection, x);
}

// One post-LN BERT layer on x [N, H]; packed (may be null) holds w's GEMM weights packed. With `first` null it
// runs in place on every token; otherwise it writes only each sequence's first token into first [B, H] (finite
// values, not zeros, for a sequence without tokens) and leaves x as scratch.
void EncoderLayer(const EncoderDims& d, const EncoderWeights<float>& w, const PackedLayer* packed,
                  const PackedBatch& batch, float* x, const EncoderScratch& s, float* first,
                  const ThreadPool& pool) {
  QkvProjection(d, w, packed, batch.num_tokens, x, s.layer, pool);
  if (first == nullptr) {
    SelfAttention(d, batch, s.layer.qkv, s.layer.context, pool);
    AfterAttention(d, w, packed, batch.num_tokens, s.layer.context, x, s.layer, pool);
  } else {
    FirstTokenAttention(d, batch, s.layer.qkv, s.layer.context, pool);
    GatherFirstToken(static_cast<const float*>(x), d.hidden, batch, first);
    AfterAttention(d, w, packed, batch.batch, s.layer.context, first, s.layer, pool);
  }
}

// The last layer's first tokens [B, H] into out, zeros for a sequence without tokens.
template <typename T>
void StoreFirstTokens(const float* first, int64_t hidden, const PackedBatch& batch, T* out) {
  for (int64_t b = 0; b < batch.batch; ++b) {
    T* row = out + b * hidden;
    if (batch.cu_seqlens_host[b + 1] == batch.cu_seqlens_host[b]) {
      std::memset(static_cast<void*>(row), 0, hidden * sizeof(T));
    } else if constexpr (std::is_same_v<T, float>) {
      std::copy_n(first + b * hidden, hidden, row);
    } else {
      FloatToHalf(first + b * hidden, row, hidden);
    }
  }
}

// No layer to run (no token, or an empty stack): a first-token output is the input's first tokens.
template <typename T>
bool NothingToRun(const EncoderDims& dims, const PackedBatch& batch, const T* hidden, T* first_tokens) {
  if (batch.num_tokens > 0 && dims.num_layers > 0) return false;
  if (first_tokens != nullptr) GatherFirstToken(hidden, dims.hidden, batch, first_tokens);
  return true;
}

// The rows of the first-token region for this call: the batch when first tokens are asked for, else none.
int64_t FirstRows(const PackedBatch& batch, const void* first_tokens) {
  return first_tokens != nullptr ? batch.batch : 0;
}

// Where `layer` writes first tokens (EncoderLayer's `first`): the scratch region in the last layer of a
// first-token output, else nowhere.
float* FirstOfLayer(const EncoderDims& d, int64_t layer, const EncoderScratch& s, const void* first_tokens) {
  return layer + 1 == d.num_layers && first_tokens != nullptr ? s.first : nullptr;
}

}  // namespace

template <>
int64_t EncoderWorkspaceBytes<float>(const EncoderDims& dims, int64_t num_tokens, int64_t batch) {
  return EncoderScratchFloats(dims, num_tokens, batch) * static_cast<int64_t>(sizeof(float));
}

template <>
int64_t EncoderWorkspaceBytes<fp16>(const EncoderDims& dims, int64_t num_tokens, int64_t batch) {
  const int64_t floats = EncoderScratchFloats(dims, num_tokens, batch) + Aligned(num_tokens * dims.hidden) +
                         LayerSizes(dims).TotalFloats();
  return floats * static_cast<int64_t>(sizeof(float));
}

std::shared_ptr<const PackedEncoderWeights> PackEncoderWeights(const EncoderDims& dims,
                                                               const EncoderWeights<float>& w,
                                                               const ThreadPool& pool, GemmOperands operands) {
  auto packed = std::make_shared<PackedEncoderWeights>();
  packed->layers.reserve(dims.num_layers);
  const LayerSizes sizes(dims);
  const GemmBackend& backend = SelectedGemmBackend(operands);
  for (int64_t layer = 0; layer < dims.num_layers; ++layer) {
    packed->layers.emplace_back(dims, LayerSlice(w, sizes, layer), pool, backend);
  }
  return packed;
}

void Encoder(const EncoderDims& dims, const EncoderWeights<float>& w, const PackedEncoderWeights& packed,
             const PackedBatch& batch, float* hidden, void* workspace, const ThreadPool& pool, float* first_tokens) {
  if (NothingToRun(dims, batch, static_cast<const float*>(hidden), first_tokens)) return;
  const LayerSizes sizes(dims);
  const EncoderScratch scratch =
      CarveEncoderScratch(dims, batch.num_tokens, FirstRows(batch, first_tokens), static_cast<float*>(workspace));
  for (int64_t layer = 0; layer < dims.num_layers; ++layer) {
    EncoderLayer(dims, LayerSlice(w, sizes, layer), &packed.layers[layer], batch, hidden, scratch,
                 FirstOfLayer(dims, layer, scratch, first_tokens), pool);
  }
  if (first_tokens != nullptr) StoreFirstTokens(scratch.first, dims.hidden, batch, first_tokens);
}

void Encoder(const EncoderDims& dims, const EncoderWeights<fp16>& w, const PackedBatch& batch, fp16* hidden,
             void* workspace, const ThreadPool& pool, fp16* first_tokens) {
  if (NothingToRun(dims, batch, static_cast<const fp16*>(hidden), first_tokens)) return;
  const LayerSizes sizes(dims);
  const EncoderScratch scratch =
      CarveEncoderScratch(dims, batch.num_tokens, FirstRows(batch, first_tokens), static_cast<float*>(workspace));
  float* x = scratch.end;
  float* layer_weights = x + Aligned(batch.num_tokens * dims.hidden);
  const int64_t elements = batch.num_tokens * dims.hidden;
  ParallelConvert(pool, HalfToFloat, static_cast<const fp16*>(hidden), elements, x);
  for (int64_t layer = 0; layer < dims.num_layers; ++layer) {
    const EncoderWeights<float> wf = WidenLayer(pool, LayerSlice(w, sizes, layer), sizes, layer_weights);
    EncoderLayer(dims, wf, nullptr, batch, x, scratch, FirstOfLayer(dims, layer, scratch, first_tokens), pool);
  }
  if (first_tokens != nullptr) {
    StoreFirstTokens(scratch.first, dims.hidden, batch, first_tokens);
  } else {
    ParallelConvert(pool, FloatToHalf, static_cast<const float*>(x), elements, hidden);
  }
}

}  // namespace cpu
}  // namespace bertserve
