// Timing probe of the one-cluster encoder (custom_ops/kernels/cuda/cluster_encoder.cu) on the GPU machine: time
// per launch at 32 tokens with random chit-chat weights, and the global timer at each step of blocks 0 (a head
// block) and 12 (not one), from the kernel's BERTSERVE_CLUSTER_CLOCK hooks. Build from the repository root:
//   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I. -I<cublas include> \
//     bench/gpu/cluster_encoder_probe.cu -o probe
#include <cstdint>
__device__ unsigned long long g_clock[2][256];
__device__ int g_clock_n[2];
#define BERTSERVE_CLUSTER_CLOCK()                                                           \
  do {                                                                                      \
    int which_ = blockIdx.x == 0 ? 0 : (blockIdx.x == 12 ? 1 : -1);                         \
    if (which_ >= 0 && threadIdx.x == 0 && g_clock_n[which_] < 256) {                       \
      unsigned long long t_;                                                                \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                \
      g_clock[which_][g_clock_n[which_]++] = t_;                                            \
    }                                                                                       \
  } while (0)
#include "custom_ops/kernels/cuda/cluster_encoder.cu"

#include <cstdio>
#include <cstdlib>
#include <vector>
using namespace bertserve;
using namespace bertserve::cuda;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

static fp16* DevHalf(size_t n, float scale, float offset = 0.f) {
  std::vector<__half> h(n);
  for (auto& x : h) x = __float2half(offset + scale * (rand() / (float)RAND_MAX * 2 - 1));
  void* d;
  CK(cudaMalloc(&d, n * 2));
  CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return static_cast<fp16*>(d);
}

int main(int argc, char** argv) {
  const int H = 768, I = 3072, L = 6, tokens = argc > 1 ? atoi(argv[1]) : 32;
  EncoderDims dims{H, 12, I, L, 1e-12f};
  EncoderWeights<fp16> w;
  w.qkv_kernel = DevHalf((size_t)L * H * 3 * H, 0.03f);
  w.qkv_bias = DevHalf(L * 3 * H, 0.02f);
  w.attention_output_kernel = DevHalf((size_t)L * H * H, 0.03f);
  w.attention_output_bias = DevHalf(L * H, 0.02f);
  w.attention_ln_gamma = DevHalf(L * H, 0.1f, 1.f);
  w.attention_ln_beta = DevHalf(L * H, 0.02f);
  w.intermediate_kernel = DevHalf((size_t)L * H * I, 0.03f);
  w.intermediate_bias = DevHalf(L * I, 0.02f);
  w.output_kernel = DevHalf((size_t)L * I * H, 0.03f);
  w.output_bias = DevHalf(L * H, 0.02f);
  w.output_ln_gamma = DevHalf(L * H, 0.1f, 1.f);
  w.output_ln_beta = DevHalf(L * H, 0.02f);
  fp16* hidden = DevHalf((size_t)tokens * H, 1.f);
  fp16* first = DevHalf(H, 0.f);
  int32_t cu[2] = {0, tokens}, *cu_d;
  CK(cudaMalloc(&cu_d, 8));
  CK(cudaMemcpy(cu_d, cu, 8, cudaMemcpyHostToDevice));
  PackedBatch batch;
  batch.batch = 1;
  batch.num_tokens = tokens;
  batch.max_seqlen = tokens;
  batch.cu_seqlens_host = cu;
  batch.cu_seqlens_device = cu_d;
  void* scratch;
  CK(cudaMalloc(&scratch, kClusterEncoderScratchBytes));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  auto launch = [&] {
    LaunchClusterEncoder(dims, w, batch, reinterpret_cast<const __half*>(hidden), nullptr,
                         reinterpret_cast<__half*>(first), scratch, stream);
  };
  for (int i = 0; i < 20; ++i) launch();
  CK(cudaStreamSynchronize(stream));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int reps = 200;
  CK(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) launch();
  CK(cudaEventRecord(b, stream));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  printf("tokens %d: %.1f us per launch (back to back, eager)\n", tokens, ms * 1000 / reps);
  // one launch with clocks
  int zero[2] = {0, 0};
  CK(cudaMemcpyToSymbol(g_clock_n, zero, sizeof(zero)));
  launch();
  CK(cudaStreamSynchronize(stream));
  unsigned long long clk[2][256];
  int n[2];
  CK(cudaMemcpyFromSymbol(clk, g_clock, sizeof(clk)));
  CK(cudaMemcpyFromSymbol(n, g_clock_n, sizeof(n)));
  const char* head_steps[] = {"qkv", "attn", "sync1", "oproj", "sync2", "ln1", "ffn1", "ffn2", "sync3", "reduce",
                              "sync4", "ln2"};
  for (int which = 0; which < 2; ++which) {
    printf("block %d (%d stamps): start->loop %.2f us\n", which ? 12 : 0, n[which],
           (clk[which][0] - clk[0][0]) / 1e3);
    int k = 1;
    for (int l = 0; l < L && k < n[which]; ++l) {
      printf("  layer %d:", l);
      for (int s = which ? 1 : 0; s < 12 && k < n[which]; ++s, ++k) {
        printf(" %s %.2f", head_steps[s], (clk[which][k] - clk[which][k - 1]) / 1e3);
      }
      printf("\n");
    }
    printf("  total %.2f us\n", (clk[which][n[which] - 1] - clk[which][0]) / 1e3);
  }
  return 0;
}
