// Timing probe of the one-launch small-batch encoder (custom_ops/kernels/cuda/small_batch_encoder.cu) on the GPU
// machine: per-forward time (eager and CUDA graph) with random chit-chat weights at 32 tokens, the SM clock cycles
// between steps of block 0 (the kernel's BERTSERVE_PHASE_CLOCK / BERTSERVE_STEP_CLOCK hooks), and the cost of one
// cooperative_groups grid.sync on every SM. Build from the repository root:
//   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I. bench/gpu/small_batch_probe.cu -o probe
#include <cstdio>
#include <cstdlib>
#include <vector>
__device__ unsigned long long g_clock[512];
__device__ long long g_cycles[512];
__device__ int g_clock_n;
#define BERTSERVE_PHASE_CLOCK()                                                         \
  do {                                                                                  \
    if (blockIdx.x == 0 && threadIdx.x == 0) {                                          \
      unsigned long long t;                                                             \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                             \
      if (g_clock_n >= 512) break;                                                       \
      g_cycles[g_clock_n] = clock64();                                                  \
      g_clock[g_clock_n++] = t;                                                         \
    }                                                                                   \
  } while (0)
#define BERTSERVE_STEP_CLOCK() do { __syncthreads(); BERTSERVE_PHASE_CLOCK(); } while (0)
#include "custom_ops/kernels/cuda/small_batch_encoder.cu"
using namespace bertserve;
using namespace bertserve::cuda;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__global__ void BarrierOnly(int n) {
  auto g = cooperative_groups::this_grid();
  for (int i = 0; i < n; ++i) g.sync();
}

static __half* DevHalf(size_t n, float scale, float offset = 0.f) {
  std::vector<__half> h(n);
  for (auto& x : h) x = __float2half(offset + scale * (rand() / (float)RAND_MAX * 2 - 1));
  __half* d;
  CK(cudaMalloc(&d, n * 2));
  CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
}

int main() {
  const int H = 768, I = 3072, L = 6, heads = 12;
  EncoderWeights<fp16> w;
  w.qkv_kernel = (fp16*)DevHalf((size_t)L * H * 3 * H, 0.03f);
  w.qkv_bias = (fp16*)DevHalf(L * 3 * H, 0.02f);
  w.attention_output_kernel = (fp16*)DevHalf((size_t)L * H * H, 0.03f);
  w.attention_output_bias = (fp16*)DevHalf(L * H, 0.02f);
  w.attention_ln_gamma = (fp16*)DevHalf(L * H, 0.1f, 1.f);
  w.attention_ln_beta = (fp16*)DevHalf(L * H, 0.02f);
  w.intermediate_kernel = (fp16*)DevHalf((size_t)L * H * I, 0.03f);
  w.intermediate_bias = (fp16*)DevHalf(L * I, 0.02f);
  w.output_kernel = (fp16*)DevHalf((size_t)L * I * H, 0.02f);
  w.output_bias = (fp16*)DevHalf(L * H, 0.02f);
  w.output_ln_gamma = (fp16*)DevHalf(L * H, 0.1f, 1.f);
  w.output_ln_beta = (fp16*)DevHalf(L * H, 0.02f);
  EncoderDims dims;
  dims.hidden = H; dims.num_heads = heads; dims.intermediate = I; dims.num_layers = L;
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int tokens : {32}) {
    int cu_host[2] = {0, tokens};
    int* cu_dev;
    CK(cudaMalloc(&cu_dev, 8));
    CK(cudaMemcpy(cu_dev, cu_host, 8, cudaMemcpyHostToDevice));
    PackedBatch b;
    b.batch = 1; b.num_tokens = tokens; b.max_seqlen = tokens; b.cu_seqlens_host = cu_host; b.cu_seqlens_device = cu_dev;
    __half* hidden = DevHalf((size_t)tokens * H, 1.f);
    SmallBatchEncoderBuffers buf;
    CK(cudaMalloc(&buf.x, tokens * H * 2)); CK(cudaMalloc(&buf.qkv, tokens * 3 * H * 2));
    CK(cudaMalloc(&buf.context, tokens * H * 2)); CK(cudaMalloc(&buf.ffn, tokens * I * 2));
    CK(cudaMalloc(&buf.sums, 2 * tokens * H * 4));
    for (int i = 0; i < 50; ++i) LaunchSmallBatchEncoder(dims, w, b, hidden, buf, stream);
    CK(cudaStreamSynchronize(stream));
    CK(cudaEventRecord(e0, stream));
    for (int i = 0; i < 200; ++i) LaunchSmallBatchEncoder(dims, w, b, hidden, buf, stream);
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("tokens %d: eager %.2f us per forward\n", tokens, ms * 1000 / 200);
    cudaGraph_t graph; cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    LaunchSmallBatchEncoder(dims, w, b, hidden, buf, stream);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(e0, stream));
    for (int i = 0; i < 200; ++i) CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("tokens %d: graph %.2f us per forward\n", tokens, ms * 1000 / 200);
    static float acc_ns[512], acc_cyc[512]; for (auto& a : acc_ns) a = 0; for (auto& a : acc_cyc) a = 0;
    int n = 0;
    for (int rep = 0; rep < 20; ++rep) {
      int zero = 0;
      CK(cudaMemcpyToSymbol(g_clock_n, &zero, sizeof(int)));
      LaunchSmallBatchEncoder(dims, w, b, hidden, buf, stream);
      CK(cudaStreamSynchronize(stream));
      static unsigned long long c[512]; static long long cy[512];
      CK(cudaMemcpyFromSymbol(c, g_clock, sizeof(c)));
      CK(cudaMemcpyFromSymbol(cy, g_cycles, sizeof(cy)));
      CK(cudaMemcpyFromSymbol(&n, g_clock_n, sizeof(int)));
      for (int i = 1; i < n; ++i) { acc_ns[i] += (c[i] - c[i - 1]) / 20.f; acc_cyc[i] += (cy[i] - cy[i - 1]) / 20.f; }
    }
    printf("steps (ns) from block 0, n=%d:", n);
    for (int i = 1; i < n; ++i) printf("%s%.0f", (i - 1) % 25 == 24 ? "\n  " : " ", acc_cyc[i]);
    printf("\n");
  }
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int threads : {256}) {
    float t[2];
    int ns[2] = {1, 31};
    for (int k = 0; k < 2; ++k) {
      int nn = ns[k];
      void* args[] = {&nn};
      for (int i = 0; i < 10; ++i) CK(cudaLaunchCooperativeKernel((void*)BarrierOnly, sms, threads, args, 0, stream));
      CK(cudaEventRecord(e0, stream));
      for (int i = 0; i < 200; ++i) CK(cudaLaunchCooperativeKernel((void*)BarrierOnly, sms, threads, args, 0, stream));
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&t[k], e0, e1));
    }
    printf("grid.sync on %d blocks x %d threads: %.3f us each; kernel with 1 sync %.2f us\n", sms, threads,
           (t[1] - t[0]) * 1000 / 200 / 30, t[0] * 1000 / 200);
  }
  return 0;
}
