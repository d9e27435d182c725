// GPU OpKernels of the fused BERT ops (Device(DEVICE_GPU), float and half): validate on the host with the same
// checks as the CPU kernels (bert_op_inputs), allocate through TensorFlow, copy the host-side index data the
// contract keeps in host memory (ids, mask, cu_seqlens) to the device on TensorFlow's own stream in one transfer
// (cuda::CopyIndicesToDevice), and call the CUDA core. Nothing here waits for the device: token counts and launch shapes come from host memory.
//
// Built by `custom_ops/kernels/cuda/build.sh OUT --tf` into _bert_ops_gpu.so, loaded after _bert_ops.so (which
// registers the ops). The core is built with CUDA 13 and links its runtime statically; it runs on the stream
// TensorFlow passes, and captures the encoder's graphs on a stream of its own (see custom_ops/kernels/cuda/README.md
// on mixing it with TensorFlow's CUDA 12).

#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cuda/gemm.h"
#include "custom_ops/kernels/cuda/graph_cache.h"
#include "custom_ops/kernels/cuda/host_staging.h"
#include "custom_ops/tf/bert_op_inputs.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "xla/stream_executor/stream.h"

namespace bertserve {
namespace tf {
namespace {

using ::tensorflow::DEVICE_GPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

void* StreamOf(OpKernelContext* ctx) {
  return ctx->op_device_context()->stream()->platform_specific_handle().stream;
}

// Runs a core call: device memory that could not be had becomes RESOURCE_EXHAUSTED (as when TensorFlow's own
// allocate_output fails, so a server can tell a batch too large for the GPU from a fault); a CUDA or cuBLASLt
// failure (std::runtime_error naming it) becomes an Internal status.
template <typename Fn>
absl::Status CallCore(const Fn& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const cuda::DeviceOutOfMemory& e) {
    return absl::ResourceExhaustedError(absl::StrCat("bertserve CUDA core: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("bertserve CUDA core: ", e.what()));
  }
}

// One device copy of host int32 arrays, one after another (cuda::CopyIndicesToDevice: one transfer on the op's
// stream whatever their size).
absl::Status ToDevice(OpKernelContext* ctx, std::initializer_list<cuda::IndexSpan> spans, cuda::PinnedStaging& staging,
                      Tensor* device) {
  int64_t count = 0;
  for (const cuda::IndexSpan& span : spans) count += span.count;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({count}), device));
  return CallCore([&] {
    cuda::CopyIndicesToDevice(spans, device->flat<int32_t>().data(), staging, static_cast<cudaStream_t>(StreamOf(ctx)));
  });
}

template <typename T>
class BertEmbeddingGpuOp : public OpKernel {
 public:
  explicit BertEmbeddingGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("layer_norm_epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 2,
                InvalidArgument("input_ids must be [batch, seq], got ", ids.shape().DebugString()));
    Tensor* cu_seqlens = nullptr;  // host memory output
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({ids.dim_size(0) + 1}), &cu_seqlens));
    PackedBatch batch;
    EmbeddingWeights<CoreType<T>> weights;
    OP_REQUIRES_OK(ctx, ReadEmbeddingInputs<T>(ctx, epsilon_, cu_seqlens->flat<int32_t>().data(), &batch, &weights));
    Tensor* hidden = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch.num_tokens, weights.hidden}), &hidden));
    if (batch.num_tokens == 0) return;
    const int64_t n = ids.NumElements();
    Tensor indices;  // ids, segment ids, cu_seqlens
    OP_REQUIRES_OK(ctx, ToDevice(ctx,
                                 {{ids.flat<int32_t>().data(), n},
                                  {ctx->input(1).flat<int32_t>().data(), n},
                                  {batch.cu_seqlens_host, batch.batch + 1}},
                                 staging_, &indices));
    const int32_t* ids_device = indices.flat<int32_t>().data();
    batch.cu_seqlens_device = ids_device + 2 * n;
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::Embedding(weights, ids_device, ids_device + n, ids.dim_size(1), batch,
                                     CoreData<T>(hidden), StreamOf(ctx));
                   }));
  }

 private:
  float epsilon_;
  cuda::PinnedStaging staging_;
};

// TensorFlow's allocator for the device the op runs on, as the core's arenas take it. An arena stays allocated while
// it is the stream's current one or a graph of the op instance's cache runs on it.
cuda::DeviceAllocator ArenaAllocator(OpKernelContext* ctx) {
  tensorflow::Allocator* allocator = ctx->get_allocator(tensorflow::AllocatorAttributes());
  return [allocator](int64_t bytes) {
    void* p = allocator->AllocateRaw(256, bytes);  // cudaMalloc's alignment, which the arena's layout assumes
    if (p == nullptr) {
      throw cuda::DeviceOutOfMemory("out of device memory: the allocator could not give an arena of " +
                                    std::to_string(bytes) + " bytes");
    }
    return std::shared_ptr<void>(p, [allocator](void* q) { allocator->DeallocateRaw(q); });
  };
}

// One cuBLASLt context per kernel instance (TF makes one per device), created on first use on that device.
class LazyGemmContext {
 public:
  LazyGemmContext() = default;
  LazyGemmContext(const LazyGemmContext&) = delete;
  LazyGemmContext& operator=(const LazyGemmContext&) = delete;
  ~LazyGemmContext() { cuda::DestroyGemmContext(gemm_); }

  absl::Status Get(cuda::GemmContext** gemm) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (gemm_ == nullptr) TF_RETURN_IF_ERROR(CallCore([&] { gemm_ = cuda::CreateGemmContext(); }));
    *gemm = gemm_;
    return absl::OkStatus();
  }

 private:
  std::mutex mutex_;
  cuda::GemmContext* gemm_ = nullptr;
};

// BertEncoder's gemm_operands='bfloat16' (bf16 GEMM operands, implemented on CPU only) fails the op's
// construction. Refused here,
// not at export: one SavedModel serves on CPU or GPU and the export cannot know which, and running the GPU's own
// GEMMs instead would serve other numbers than the model asks for (and was validated with). The first call fails,
// which TF Serving's warm-up at load time makes the model's load failing, with this message.
absl::Status RefuseBf16Operands(OpKernelConstruction* ctx) {
  cpu::GemmOperands operands;
  TF_RETURN_IF_ERROR(ReadGemmOperands(ctx, &operands));
  if (operands == cpu::GemmOperands::kFloat) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(ctx->def().op(),
                                               ": gemm_operands='bfloat16' (bf16 GEMM operands) runs on CPU only; "
                                               "place the model on the CPU, or export it with --precision fp32 or "
                                               "fp16 for the GPU"));
}

// The encoder runs on an arena of its token bucket (cuda::TokenBucket) that the kernel keeps, as a CUDA graph per
// (batch, bucket) replayed on TensorFlow's stream (cuda::BucketedEncoder): launched one by one, a forward of a few
// rows costs the host more than the GPU.
template <typename T>
class BertEncoderGpuOp : public OpKernel {
 public:
  explicit BertEncoderGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_heads", &num_heads_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("layer_norm_epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_token_only", &first_token_only_));
    OP_REQUIRES_OK(ctx, RefuseBf16Operands(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    EncoderDims dims;
    EncoderWeights<CoreType<T>> weights;
    OP_REQUIRES_OK(ctx, ReadEncoderInputs<T>(ctx, num_heads_, epsilon_, &dims, &weights));
    const Tensor& hidden = ctx->input(0);
    PackedBatch batch;
    OP_REQUIRES_OK(ctx, PackFromCuSeqlens(ctx->input(1), hidden.dim_size(0), &batch));  // host memory input
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, first_token_only_ ? TensorShape({batch.batch, dims.hidden})
                                                                  : hidden.shape(),
                                             &output));
    cuda::GemmContext* gemm = nullptr;
    OP_REQUIRES_OK(ctx, gemm_.Get(&gemm));
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::BucketedEncoder(graphs_, /*use_graphs=*/true, dims, weights, batch, CoreData<T>(hidden),
                                           first_token_only_, CoreData<T>(output), gemm, ArenaAllocator(ctx),
                                           StreamOf(ctx));
                   }));
  }

 private:
  int64_t num_heads_;
  float epsilon_;
  bool first_token_only_;
  LazyGemmContext gemm_;
  cuda::GraphCache graphs_;
};

// The pooler and classifier as the C ABI's ranker runs them (cuda::RankerHead): one kernel for an fp16 row, else
// the pooler GEMM into fp32 scratch from TensorFlow's allocator and the head kernel.
template <typename T>
class BertRankerHeadGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    RankerHeadWeights<CoreType<T>> weights;
    Tensor* scores = nullptr;
    OP_REQUIRES_OK(ctx, ReadRankerHeadInputs<T>(ctx, &weights, &scores));
    const int64_t batch = scores->dim_size(0);
    if (batch == 0) return;
    const int64_t bytes = cuda::RankerHeadWorkspaceBytes<CoreType<T>>(batch, weights.hidden, weights.num_labels);
    Tensor workspace;
    if (bytes > 0) OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8, TensorShape({bytes}), &workspace));
    cuda::GemmContext* gemm = nullptr;
    OP_REQUIRES_OK(ctx, gemm_.Get(&gemm));
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::RankerHead(weights, CoreData<T>(ctx->input(0)), batch,
                                      bytes > 0 ? workspace.flat<int8_t>().data() : nullptr,
                                      scores->flat<float>().data(), gemm, StreamOf(ctx));
                   }));
  }

 private:
  LazyGemmContext gemm_;
};

template <typename T>
class BertRemovePaddingGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& mask = ctx->input(1);  // host memory
    OP_REQUIRES(ctx, input.dims() == 3,
                InvalidArgument("input must be [batch, seq, hidden], got ", input.shape().DebugString()));
    const int64_t b = input.dim_size(0), s = input.dim_size(1), h = input.dim_size(2);
    OP_REQUIRES_OK(ctx, CheckShape("input_mask", mask, {b, s}));
    Tensor* cu_seqlens = nullptr;  // host memory output
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({b + 1}), &cu_seqlens));
    PackedBatch batch;
    OP_REQUIRES_OK(ctx, PackFromMask(mask, cu_seqlens->flat<int32_t>().data(), &batch));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch.num_tokens, h}), &output));
    if (batch.num_tokens == 0) return;
    Tensor cu_device;
    OP_REQUIRES_OK(ctx, ToDevice(ctx, {{batch.cu_seqlens_host, b + 1}}, staging_, &cu_device));
    batch.cu_seqlens_device = cu_device.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::RemovePadding(CoreData<T>(input), s, h, batch, CoreData<T>(output), StreamOf(ctx));
                   }));
  }

 private:
  cuda::PinnedStaging staging_;
};

template <typename T>
class BertRebuildPaddingGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& mask = ctx->input(1);  // host memory
    OP_REQUIRES(ctx, input.dims() == 2,
                InvalidArgument("input must be [tokens, hidden], got ", input.shape().DebugString()));
    OP_REQUIRES(ctx, mask.dims() == 2,
                InvalidArgument("input_mask must be [batch, seq], got ", mask.shape().DebugString()));
    const int64_t b = mask.dim_size(0), s = mask.dim_size(1), h = input.dim_size(1);
    tensorflow::AllocatorAttributes on_host;
    on_host.set_on_host(true);
    Tensor cu_host;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({b + 1}), &cu_host, on_host));
    PackedBatch batch;
    OP_REQUIRES_OK(ctx, PackFromMask(mask, cu_host.flat<int32_t>().data(), &batch));
    OP_REQUIRES(ctx, batch.num_tokens == input.dim_size(0),
                InvalidArgument("input has ", input.dim_size(0), " packed tokens but input_mask has ",
                                batch.num_tokens, " real positions"));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({b, s, h}), &output));
    if (output->NumElements() == 0) return;
    Tensor cu_device;
    OP_REQUIRES_OK(ctx, ToDevice(ctx, {{batch.cu_seqlens_host, b + 1}}, staging_, &cu_device));
    batch.cu_seqlens_device = cu_device.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::RebuildPadding(CoreData<T>(input), s, h, batch, CoreData<T>(output), StreamOf(ctx));
                   }));
  }

 private:
  cuda::PinnedStaging staging_;
};

template <typename T>
class BertGatherFirstTokenGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() == 2,
                InvalidArgument("input must be [tokens, hidden], got ", input.shape().DebugString()));
    PackedBatch batch;
    OP_REQUIRES_OK(ctx, PackFromCuSeqlens(ctx->input(1), input.dim_size(0), &batch));  // host memory input
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch.batch, input.dim_size(1)}), &output));
    if (output->NumElements() == 0) return;
    Tensor cu_device;
    OP_REQUIRES_OK(ctx, ToDevice(ctx, {{batch.cu_seqlens_host, batch.batch + 1}}, staging_, &cu_device));
    batch.cu_seqlens_device = cu_device.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::GatherFirstToken(CoreData<T>(input), input.dim_size(1), batch, CoreData<T>(output),
                                            StreamOf(ctx));
                   }));
  }

 private:
  cuda::PinnedStaging staging_;
};

// Index inputs and outputs live in host memory (the contract's HostMemory allowance): the host decides token
// counts and launch shapes, and validates ids, without a device round trip.
#define BERTSERVE_REGISTER_GPU(T)                                                                                  \
  REGISTER_KERNEL_BUILDER(Name("BertEmbedding")                                                                    \
                              .Device(DEVICE_GPU)                                                                  \
                              .TypeConstraint<T>("T")                                                              \
                              .HostMemory("input_ids")                                                             \
                              .HostMemory("segment_ids")                                                           \
                              .HostMemory("input_mask")                                                            \
                              .HostMemory("cu_seqlens"),                                                           \
                          BertEmbeddingGpuOp<T>);                                                                  \
  REGISTER_KERNEL_BUILDER(Name("BertEncoder").Device(DEVICE_GPU).TypeConstraint<T>("T").HostMemory("cu_seqlens"),  \
                          BertEncoderGpuOp<T>);                                                                    \
  REGISTER_KERNEL_BUILDER(Name("BertRemovePadding")                                                                \
                              .Device(DEVICE_GPU)                                                                  \
                              .TypeConstraint<T>("T")                                                              \
                              .HostMemory("input_mask")                                                            \
                              .HostMemory("cu_seqlens"),                                                           \
                          BertRemovePaddingGpuOp<T>);                                                              \
  REGISTER_KERNEL_BUILDER(                                                                                         \
      Name("BertRebuildPadding").Device(DEVICE_GPU).TypeConstraint<T>("T").HostMemory("input_mask"),              \
      BertRebuildPaddingGpuOp<T>);                                                                                 \
  REGISTER_KERNEL_BUILDER(                                                                                         \
      Name("BertGatherFirstToken").Device(DEVICE_GPU).TypeConstraint<T>("T").HostMemory("cu_seqlens"),            \
      BertGatherFirstTokenGpuOp<T>);                                                                              \
  REGISTER_KERNEL_BUILDER(Name("BertRankerHead").Device(DEVICE_GPU).TypeConstraint<T>("T"), BertRankerHeadGpuOp<T>);
BERTSERVE_REGISTER_GPU(float)
BERTSERVE_REGISTER_GPU(Eigen::half)
#undef BERTSERVE_REGISTER_GPU

}  // namespace
}  // namespace tf
}  // namespace bertserve

// Process-wide counts of the encoder's CUDA graphs (cuda::GraphsCaptured and the others, graph_cache.h), the pinned
// host memory of the index staging pools (host_staging.h) and the device's memory in use, for tests and benchmarks
// to read through ctypes from this library: whether a warmed-up model captures no new graph, whether the caches stay
// within their bound, whether memory outside TensorFlow's allocator (graphs, capture streams, pinned staging) goes
// back when a model is unloaded.
extern "C" {
__attribute__((visibility("default"))) int64_t bertserve_graphs_captured() {
  return bertserve::cuda::GraphsCaptured();
}
__attribute__((visibility("default"))) int64_t bertserve_graphs_held() { return bertserve::cuda::GraphsHeld(); }
__attribute__((visibility("default"))) int64_t bertserve_most_graphs_held_per_stream() {
  return bertserve::cuda::MostGraphsHeldPerStream();
}
__attribute__((visibility("default"))) int64_t bertserve_max_graphs_per_stream() {
  return static_cast<int64_t>(bertserve::cuda::kMaxGraphsPerStream);
}
__attribute__((visibility("default"))) int64_t bertserve_pinned_staging_bytes() {
  return bertserve::cuda::PinnedStagingBytes();
}
// Bytes in use on the calling thread's current device (cudaMemGetInfo: total - free, every allocator's), or -1.
__attribute__((visibility("default"))) int64_t bertserve_device_bytes_in_use() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
  return static_cast<int64_t>(total - free);
}
}
