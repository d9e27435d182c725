// GPU OpKernels of the fused BERT ops (Device(DEVICE_GPU), float and half): validate on the host with the same
// checks as the CPU kernels (bert_op_inputs), allocate through TensorFlow, copy the host-side index data the
// contract keeps in host memory (ids, mask, cu_seqlens) to the device on TensorFlow's own stream, and call the
// CUDA core. Nothing here waits for the device: token counts and launch shapes come from host memory.
//
// Built by `custom_ops/kernels/cuda/build.sh OUT --tf` into _bert_ops_gpu.so, loaded after _bert_ops.so (which
// registers the ops). The core is built with CUDA 13 and links its runtime statically; it only ever uses the
// stream TensorFlow passes (see custom_ops/kernels/cuda/README.md on mixing it with TensorFlow's CUDA 12).
#include <cuda_runtime.h>

#include <exception>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/kernels/bert_core.h"
#include "custom_ops/kernels/cuda/gemm.h"
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

// Runs a core call; a CUDA or cuBLASLt failure (std::runtime_error naming it) becomes an Internal status.
template <typename Fn>
absl::Status CallCore(const Fn& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("bertserve CUDA core: ", e.what()));
  }
}

absl::Status CheckCuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("bertserve CUDA core: ", what, ": ", cudaGetErrorString(status)));
}

// A device copy of host int32 data, enqueued on the op's stream. The data goes through a pageable buffer of our
// own: cudaMemcpyAsync from pageable memory returns once it is staged, so neither buffer must outlive the call
// (a pinned source, which TF may hand a HostMemory input in, would be read later, after TF reused it).
absl::Status ToDevice(OpKernelContext* ctx, const int32_t* host, int64_t count, Tensor* device) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({count}), device));
  if (count == 0) return absl::OkStatus();
  const std::vector<int32_t> pageable(host, host + count);
  return CheckCuda(cudaMemcpyAsync(device->flat<int32_t>().data(), pageable.data(), count * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, static_cast<cudaStream_t>(StreamOf(ctx))),
                   "copy of host indices to the device");
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
    Tensor ids_device, segments_device, cu_device;
    OP_REQUIRES_OK(ctx, ToDevice(ctx, ids.flat<int32_t>().data(), ids.NumElements(), &ids_device));
    OP_REQUIRES_OK(ctx, ToDevice(ctx, ctx->input(1).flat<int32_t>().data(), ids.NumElements(), &segments_device));
    OP_REQUIRES_OK(ctx, ToDevice(ctx, batch.cu_seqlens_host, batch.batch + 1, &cu_device));
    batch.cu_seqlens_device = cu_device.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::Embedding(weights, ids_device.flat<int32_t>().data(),
                                     segments_device.flat<int32_t>().data(), ids.dim_size(1), batch,
                                     CoreData<T>(hidden), StreamOf(ctx));
                   }));
  }

 private:
  float epsilon_;
};

template <typename T>
class BertEncoderGpuOp : public OpKernel {
 public:
  explicit BertEncoderGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_heads", &num_heads_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("layer_norm_epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_token_only", &first_token_only_));
  }

  ~BertEncoderGpuOp() override { cuda::DestroyGemmContext(gemm_); }

  void Compute(OpKernelContext* ctx) override {
    EncoderDims dims;
    EncoderWeights<CoreType<T>> weights;
    OP_REQUIRES_OK(ctx, ReadEncoderInputs<T>(ctx, num_heads_, epsilon_, &dims, &weights));
    const Tensor& hidden = ctx->input(0);
    PackedBatch batch;
    OP_REQUIRES_OK(ctx, PackFromCuSeqlens(ctx->input(1), hidden.dim_size(0), &batch));  // host memory input
    // The encoder runs over the token count rounded up to its bucket (cuda::TokenBucket), so that its GEMMs are
    // planned for a few counts, not for every count a batch happens to have (a new count cost 0.2-7 ms of planning
    // on the H200). The extra rows are zeroed scratch that belongs to no sequence (cu_seqlens still ends at the
    // real count); only the real rows reach an all-token output.
    const int64_t tokens = batch.num_tokens, rows = tokens == 0 ? 0 : cuda::TokenBucket(tokens);
    EncoderOutputs outs;
    OP_REQUIRES_OK(ctx, AllocateEncoderOutputs(ctx, first_token_only_, batch.batch, rows, &outs));
    const cudaStream_t stream = static_cast<cudaStream_t>(StreamOf(ctx));
    CoreType<T>* first_tokens = first_token_only_ ? CoreData<T>(outs.output) : nullptr;
    if (batch.num_tokens == 0) {  // nothing to copy or plan: the core only zeroes any first tokens
      OP_REQUIRES_OK(ctx, CallCore([&] {
                       cuda::Encoder(dims, weights, batch, CoreData<T>(outs.tokens), nullptr, nullptr, stream,
                                     first_tokens);
                     }));
      return;
    }
    const int64_t row_bytes = hidden.TotalBytes() / tokens;
    if (outs.tokens->data() != hidden.data()) {
      OP_REQUIRES_OK(ctx, CheckCuda(cudaMemcpyAsync(outs.tokens->data(), hidden.data(), hidden.TotalBytes(),
                                                    cudaMemcpyDeviceToDevice, stream),
                                    "copy of hidden"));
    }
    if (rows > tokens) {
      OP_REQUIRES_OK(ctx, CheckCuda(cudaMemsetAsync(static_cast<char*>(outs.tokens->data()) + tokens * row_bytes, 0,
                                                    (rows - tokens) * row_bytes, stream),
                                    "zeroing of the bucket's scratch rows"));
    }
    Tensor cu_device, workspace;
    OP_REQUIRES_OK(ctx, ToDevice(ctx, batch.cu_seqlens_host, batch.batch + 1, &cu_device));
    batch.cu_seqlens_device = cu_device.flat<int32_t>().data();
    batch.num_tokens = rows;
    const int64_t bytes = cuda::EncoderWorkspaceBytes<CoreType<T>>(dims, rows, first_token_only_ ? batch.batch : 0);
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8, TensorShape({bytes}), &workspace));
    cuda::GemmContext* gemm = nullptr;
    OP_REQUIRES_OK(ctx, Gemm(&gemm));
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::Encoder(dims, weights, batch, CoreData<T>(outs.tokens), workspace.data(), gemm, stream,
                                   first_tokens);
                   }));
    if (outs.tokens != outs.output && !first_token_only_) {
      OP_REQUIRES_OK(ctx, CheckCuda(cudaMemcpyAsync(outs.output->data(), outs.tokens->data(), hidden.TotalBytes(),
                                                    cudaMemcpyDeviceToDevice, stream),
                                    "copy of the encoder's output"));
    }
  }

 private:
  // One cuBLASLt context per kernel instance (TF makes one per device), created on first use on that device.
  absl::Status Gemm(cuda::GemmContext** gemm) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (gemm_ == nullptr) TF_RETURN_IF_ERROR(CallCore([&] { gemm_ = cuda::CreateGemmContext(); }));
    *gemm = gemm_;
    return absl::OkStatus();
  }

  int64_t num_heads_;
  float epsilon_;
  bool first_token_only_;
  std::mutex mutex_;
  cuda::GemmContext* gemm_ = nullptr;
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
    OP_REQUIRES_OK(ctx, ToDevice(ctx, batch.cu_seqlens_host, b + 1, &cu_device));
    batch.cu_seqlens_device = cu_device.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::RemovePadding(CoreData<T>(input), s, h, batch, CoreData<T>(output), StreamOf(ctx));
                   }));
  }
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
    OP_REQUIRES_OK(ctx, ToDevice(ctx, batch.cu_seqlens_host, b + 1, &cu_device));
    batch.cu_seqlens_device = cu_device.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::RebuildPadding(CoreData<T>(input), s, h, batch, CoreData<T>(output), StreamOf(ctx));
                   }));
  }
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
    OP_REQUIRES_OK(ctx, ToDevice(ctx, batch.cu_seqlens_host, batch.batch + 1, &cu_device));
    batch.cu_seqlens_device = cu_device.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CallCore([&] {
                     cuda::GatherFirstToken(CoreData<T>(input), input.dim_size(1), batch, CoreData<T>(output),
                                            StreamOf(ctx));
                   }));
  }
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
      BertGatherFirstTokenGpuOp<T>);
BERTSERVE_REGISTER_GPU(float)
BERTSERVE_REGISTER_GPU(Eigen::half)
#undef BERTSERVE_REGISTER_GPU

}  // namespace
}  // namespace tf
}  // namespace bertserve
