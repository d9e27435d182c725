// CPU OpKernels of the fused BERT ops: validate (bert_op_inputs), allocate through TensorFlow, call the CPU core
// on TensorFlow's intra-op thread pool.
#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/tf/bert_op_inputs.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/threadpool.h"

namespace bertserve {
namespace tf {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// A loop of the core shared out in blocks that the calling thread and the pool threads claim one at a time, so the
// caller waits only for blocks already running, never for a pool thread the OS has not scheduled yet: it takes
// the unclaimed blocks itself. (TensorFlow's ParallelFor hands each pool thread a fixed share and waits for it; on
// a shared 2-core machine a late pool thread held up each of the encoder's 42 loops a call at batch 1.) An
// exception thrown by a block (an allocation that failed) would end the process on a pool thread; it is carried
// back and rethrown on the calling thread once every claimed block has finished, for RunCore to turn into a status.
// The caller is one of the pool's `threads` participants (it plus threads - 1 pool threads): with one thread more
// than cores, a 2-core machine time-sliced a thread holding a block in most calls (batch 1 all 32 tokens: median
// 16.6 ms against a best of 13.6; 13.6 and 13.3 with the caller counted).
class SharedLoop {
 public:
  SharedLoop(int64_t n, int64_t block_units, const std::function<void(int64_t, int64_t)>& fn)
      : n_(n), block_units_(block_units), blocks_((n + block_units - 1) / block_units), fn_(&fn) {}

  int64_t blocks() const { return blocks_; }

  // Claims and runs blocks until none is left. fn_ is only touched through a claim, and every claim finishes
  // before the caller's Wait returns, so a pool thread that starts late finds nothing left and never calls it.
  void Work() {
    for (int64_t block = next_.fetch_add(1); block < blocks_; block = next_.fetch_add(1)) {
      try {
        (*fn_)(block * block_units_, std::min(n_, (block + 1) * block_units_));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!first_error_) first_error_ = std::current_exception();
      }
      if (finished_.fetch_add(1) + 1 == blocks_) {
        std::lock_guard<std::mutex> lock(mu_);
        all_finished_.notify_all();
      }
    }
  }

  // Waits for the blocks other threads still run, then rethrows the first exception any block threw.
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    all_finished_.wait(lock, [this] { return finished_.load() == blocks_; });
    if (first_error_) std::rethrow_exception(first_error_);
  }

 private:
  const int64_t n_, block_units_, blocks_;
  const std::function<void(int64_t, int64_t)>* fn_;
  std::atomic<int64_t> next_{0}, finished_{0};
  std::mutex mu_;
  std::condition_variable all_finished_;
  std::exception_ptr first_error_;
};

// Below this many cycles a loop runs on the calling thread alone: waking a pool thread costs more.
constexpr int64_t kInlineCycles = 40000;
// Each block is at least this much work, and there are at most kBlocksPerThread per participating thread.
constexpr int64_t kMinBlockCycles = 20000;
constexpr int64_t kBlocksPerThread = 4;

// TensorFlow's intra-op pool for the core, with loops run as SharedLoops.
cpu::ThreadPool IntraOpPool(OpKernelContext* ctx) {
  tensorflow::thread::ThreadPool* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  cpu::ThreadPool pool;
  pool.num_threads = workers->NumThreads();
  pool.parallel_for = [workers, threads = pool.num_threads](int64_t n, int64_t cost_per_unit,
                                                            const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    const int64_t cost = std::max<int64_t>(1, cost_per_unit);
    if (n == 1 || threads <= 1 || n * cost < kInlineCycles) {
      fn(0, n);
      return;
    }
    const int64_t by_cost = (kMinBlockCycles + cost - 1) / cost;
    const int64_t by_count = (n + kBlocksPerThread * threads - 1) / (kBlocksPerThread * threads);
    auto loop = std::make_shared<SharedLoop>(n, std::max(by_cost, by_count), fn);
    const int64_t helpers = std::min<int64_t>(threads - 1, loop->blocks() - 1);
    for (int64_t i = 0; i < helpers; ++i) workers->Schedule([loop] { loop->Work(); });
    loop->Work();
    loop->Wait();
  };
  return pool;
}

// Runs a call into the CPU core and turns what it throws into a status: a failed allocation into
// ResourceExhausted, a size beyond what the core (or MKL's int sizes) can take into InvalidArgument, a GEMM backend
// that BERTSERVE_CPU_GEMM names wrongly into FailedPrecondition.
absl::Status RunCore(const char* op, const std::function<void()>& call) {
  try {
    call();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(op, ": out of memory in the CPU kernel"));
  } catch (const std::length_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", e.what()));
  } catch (const std::invalid_argument& e) {
    return absl::FailedPreconditionError(absl::StrCat(op, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(op, ": ", e.what()));
  }
  return absl::OkStatus();
}

// BertEncoder's gemm_operands attr (ReadGemmOperands). bfloat16 is for float models: it rounds float operands, and
// a half model (which the export never writes with it) would only lose more precision.
absl::Status ReadCpuGemmOperands(OpKernelConstruction* ctx, cpu::GemmOperands* operands) {
  TF_RETURN_IF_ERROR(ReadGemmOperands(ctx, operands));
  if (*operands == cpu::GemmOperands::kBfloat16 && ctx->input_type(0) != tensorflow::DT_FLOAT) {
    return InvalidArgument(ctx->def().op(), ": gemm_operands='bfloat16' needs T=float, got ",
                           tensorflow::DataTypeString(ctx->input_type(0)));
  }
  return absl::OkStatus();
}

// BertEncoder's output, and the [N, H] tensor the encoder runs in place on (the caller copies `hidden` into it
// unless they share a buffer): the output itself, or with first_token_only a scratch tensor (hidden's buffer when TF
// can forward it) beside an output of the rows' first tokens [batch, H].
struct EncoderOutputs {
  Tensor* output = nullptr;
  Tensor* tokens = nullptr;
  Tensor scratch;
};
absl::Status AllocateEncoderOutputs(OpKernelContext* ctx, bool first_token_only, int64_t batch, EncoderOutputs* out) {
  const Tensor& hidden = ctx->input(0);
  if (!first_token_only) {
    TF_RETURN_IF_ERROR(ctx->forward_input_or_allocate_output({0}, 0, hidden.shape(), &out->output));
    out->tokens = out->output;
    return absl::OkStatus();
  }
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({batch, hidden.dim_size(1)}), &out->output));
  TF_RETURN_IF_ERROR(ctx->forward_input_or_allocate_temp({0}, hidden.dtype(), hidden.shape(), &out->scratch));
  out->tokens = &out->scratch;
  return absl::OkStatus();
}

template <typename T>
class BertEmbeddingOp : public OpKernel {
 public:
  explicit BertEmbeddingOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("layer_norm_epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 2,
                InvalidArgument("input_ids must be [batch, seq], got ", ids.shape().DebugString()));
    Tensor* cu_seqlens = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({ids.dim_size(0) + 1}), &cu_seqlens));
    PackedBatch batch;
    EmbeddingWeights<CoreType<T>> weights;
    OP_REQUIRES_OK(ctx, ReadEmbeddingInputs<T>(ctx, epsilon_, cu_seqlens->flat<int32_t>().data(), &batch, &weights));
    Tensor* hidden = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch.num_tokens, weights.hidden}), &hidden));
    OP_REQUIRES_OK(ctx, RunCore("BertEmbedding", [&] {
      cpu::Embedding(weights, ids.flat<int32_t>().data(), ctx->input(1).flat<int32_t>().data(), ids.dim_size(1),
                     batch, CoreData<T>(hidden), IntraOpPool(ctx));
    }));
  }

 private:
  float epsilon_;
};

// BertEncoder's float GEMM weights packed once per set of weight buffers (cpu::PackEncoderWeights), keyed by the
// buffers' addresses and shapes. It holds a reference to each weight tensor it packed, so a buffer cannot be
// freed and its address reused for other weights; and a resource variable assigned afterwards gets a new buffer
// (TensorFlow writes a variable's buffer in place only while nothing else holds it), hence a new key and a
// repack. TF1 reference variables (tf.compat.v1 Assign) write in place and are not supported.
class PackedWeightCache {
 public:
  // The packed form of the GEMM weights among ctx's inputs (w points into them), packing them if they are new.
  std::shared_ptr<const cpu::PackedEncoderWeights> Get(OpKernelContext* ctx, const EncoderDims& dims,
                                                       const EncoderWeights<float>& w, const cpu::ThreadPool& pool,
                                                       cpu::GemmOperands operands) {
    std::lock_guard<std::mutex> lock(mu_);
    if (packed_ == nullptr || !HoldsInputs(ctx)) {
      packed_ = cpu::PackEncoderWeights(dims, w, pool, operands);
      for (size_t i = 0; i < kGemmWeightInputs.size(); ++i) held_[i] = ctx->input(kGemmWeightInputs[i]);
    }
    return packed_;
  }

 private:
  // qkv_kernel, attention_output_kernel, intermediate_kernel, output_kernel.
  static constexpr std::array<int, 4> kGemmWeightInputs = {2, 4, 8, 10};

  // Called with mu_ held.
  bool HoldsInputs(OpKernelContext* ctx) const {
    for (size_t i = 0; i < kGemmWeightInputs.size(); ++i) {
      const Tensor& input = ctx->input(kGemmWeightInputs[i]);
      if (input.data() != held_[i].data() || input.shape() != held_[i].shape()) return false;
    }
    return true;
  }

  std::mutex mu_;  // guards held_ and packed_: Compute runs concurrently
  std::array<Tensor, 4> held_;
  std::shared_ptr<const cpu::PackedEncoderWeights> packed_;
};

template <typename T>
class BertEncoderOp : public OpKernel {
 public:
  explicit BertEncoderOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_heads", &num_heads_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("layer_norm_epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_token_only", &first_token_only_));
    OP_REQUIRES_OK(ctx, ReadCpuGemmOperands(ctx, &gemm_operands_));
  }

  void Compute(OpKernelContext* ctx) override {
    EncoderDims dims;
    EncoderWeights<CoreType<T>> weights;
    OP_REQUIRES_OK(ctx, ReadEncoderInputs<T>(ctx, num_heads_, epsilon_, &dims, &weights));
    const Tensor& hidden = ctx->input(0);
    PackedBatch batch;
    OP_REQUIRES_OK(ctx, PackFromCuSeqlens(ctx->input(1), hidden.dim_size(0), &batch));
    EncoderOutputs outs;
    OP_REQUIRES_OK(ctx, AllocateEncoderOutputs(ctx, first_token_only_, batch.batch, &outs));
    if (outs.tokens->data() != hidden.data()) {
      std::copy_n(hidden.flat<T>().data(), hidden.NumElements(), outs.tokens->flat<T>().data());
    }
    CoreType<T>* first_tokens = first_token_only_ ? CoreData<T>(outs.output) : nullptr;
    const int64_t bytes = cpu::EncoderWorkspaceBytes<CoreType<T>>(dims, batch.num_tokens,
                                                                   first_token_only_ ? batch.batch : 0);
    Tensor workspace;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({bytes / 4}), &workspace));
    OP_REQUIRES_OK(ctx, RunCore("BertEncoder", [&] {
      RunEncoder(ctx, dims, weights, batch, CoreData<T>(outs.tokens), workspace.flat<float>().data(),
                 IntraOpPool(ctx), first_tokens);
    }));
  }

 private:
  // half: the core widens the weights per layer and call (float GEMM operands: ReadCpuGemmOperands refuses others).
  void RunEncoder(OpKernelContext*, const EncoderDims& dims, const EncoderWeights<fp16>& w, const PackedBatch& batch,
                  fp16* hidden, float* workspace, const cpu::ThreadPool& pool, fp16* first_tokens) {
    cpu::Encoder(dims, w, batch, hidden, workspace, pool, first_tokens);
  }

  // float: the GEMM weights packed once, reused while the same weight buffers come in.
  void RunEncoder(OpKernelContext* ctx, const EncoderDims& dims, const EncoderWeights<float>& w,
                  const PackedBatch& batch, float* hidden, float* workspace, const cpu::ThreadPool& pool,
                  float* first_tokens) {
    const std::shared_ptr<const cpu::PackedEncoderWeights> packed =
        packed_weights_.Get(ctx, dims, w, pool, gemm_operands_);
    cpu::Encoder(dims, w, *packed, batch, hidden, workspace, pool, first_tokens);
  }

  int64_t num_heads_;
  float epsilon_;
  bool first_token_only_;
  cpu::GemmOperands gemm_operands_;
  PackedWeightCache packed_weights_;
};

template <typename T>
class BertRemovePaddingOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& mask = ctx->input(1);
    OP_REQUIRES(ctx, input.dims() == 3,
                InvalidArgument("input must be [batch, seq, hidden], got ", input.shape().DebugString()));
    const int64_t b = input.dim_size(0), s = input.dim_size(1), h = input.dim_size(2);
    OP_REQUIRES_OK(ctx, CheckShape("input_mask", mask, {b, s}));
    Tensor* cu_seqlens = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({b + 1}), &cu_seqlens));
    PackedBatch batch;
    OP_REQUIRES_OK(ctx, PackFromMask(mask, cu_seqlens->flat<int32_t>().data(), &batch));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch.num_tokens, h}), &output));
    cpu::RemovePadding(CoreData<T>(input), s, h, batch, CoreData<T>(output));
  }
};

template <typename T>
class BertRebuildPaddingOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& mask = ctx->input(1);
    OP_REQUIRES(ctx, input.dims() == 2,
                InvalidArgument("input must be [tokens, hidden], got ", input.shape().DebugString()));
    OP_REQUIRES(ctx, mask.dims() == 2,
                InvalidArgument("input_mask must be [batch, seq], got ", mask.shape().DebugString()));
    const int64_t b = mask.dim_size(0), s = mask.dim_size(1), h = input.dim_size(1);
    Tensor cu_seqlens;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({b + 1}), &cu_seqlens));
    PackedBatch batch;
    OP_REQUIRES_OK(ctx, PackFromMask(mask, cu_seqlens.flat<int32_t>().data(), &batch));
    OP_REQUIRES(ctx, batch.num_tokens == input.dim_size(0),
                InvalidArgument("input has ", input.dim_size(0), " packed tokens but input_mask has ",
                                batch.num_tokens, " real positions"));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({b, s, h}), &output));
    cpu::RebuildPadding(CoreData<T>(input), s, h, batch, CoreData<T>(output));
  }
};

template <typename T>
class BertGatherFirstTokenOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() == 2,
                InvalidArgument("input must be [tokens, hidden], got ", input.shape().DebugString()));
    PackedBatch batch;
    OP_REQUIRES_OK(ctx, PackFromCuSeqlens(ctx->input(1), input.dim_size(0), &batch));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch.batch, input.dim_size(1)}), &output));
    cpu::GatherFirstToken(CoreData<T>(input), input.dim_size(1), batch, CoreData<T>(output));
  }
};

template <typename T>
class BertRankerHeadOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    RankerHeadWeights<CoreType<T>> weights;
    Tensor* scores = nullptr;
    OP_REQUIRES_OK(ctx, ReadRankerHeadInputs<T>(ctx, &weights, &scores));
    OP_REQUIRES_OK(ctx, RunCore("BertRankerHead", [&] {
      cpu::RankerHead(weights, CoreData<T>(ctx->input(0)), scores->dim_size(0), scores->flat<float>().data(),
                      IntraOpPool(ctx));
    }));
  }
};

#define BERTSERVE_REGISTER_CPU(T)                                                                                   \
  REGISTER_KERNEL_BUILDER(Name("BertEmbedding").Device(DEVICE_CPU).TypeConstraint<T>("T"), BertEmbeddingOp<T>);     \
  REGISTER_KERNEL_BUILDER(Name("BertEncoder").Device(DEVICE_CPU).TypeConstraint<T>("T"), BertEncoderOp<T>);         \
  REGISTER_KERNEL_BUILDER(Name("BertRemovePadding").Device(DEVICE_CPU).TypeConstraint<T>("T"),                      \
                          BertRemovePaddingOp<T>);                                                                  \
  REGISTER_KERNEL_BUILDER(Name("BertRebuildPadding").Device(DEVICE_CPU).TypeConstraint<T>("T"),                     \
                          BertRebuildPaddingOp<T>);                                                                 \
  REGISTER_KERNEL_BUILDER(Name("BertGatherFirstToken").Device(DEVICE_CPU).TypeConstraint<T>("T"),                   \
                          BertGatherFirstTokenOp<T>);                                                               \
  REGISTER_KERNEL_BUILDER(Name("BertRankerHead").Device(DEVICE_CPU).TypeConstraint<T>("T"), BertRankerHeadOp<T>);
BERTSERVE_REGISTER_CPU(float)
BERTSERVE_REGISTER_CPU(Eigen::half)
#undef BERTSERVE_REGISTER_CPU

}  // namespace
}  // namespace tf
}  // namespace bertserve
