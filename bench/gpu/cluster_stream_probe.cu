// Probe: can a 16-SM thread-block cluster stream one encoder layer's weights fast enough for a batch-1 encoder
// that keeps activations in shared memory? Measures (1) weight streaming with the bulk copy engine by n blocks,
// (2) cluster barrier cost, (3) a DSMEM all-gather of a 32 x 768 fp16 activation across 16 blocks.
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a bench/gpu/cluster_stream_probe.cu -o probe
#include <cooperative_groups.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
namespace cg = cooperative_groups;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ uint32_t Smem(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void MbarInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(Smem(bar)), "r"(count));
}
__device__ __forceinline__ void MbarExpect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(Smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(Smem(dst)), "l"(src), "r"(bytes), "r"(Smem(bar)) : "memory");
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t phase) {
  asm volatile("{\n .reg .pred p;\n W%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W%=;\n}\n"
               ::"r"(Smem(bar)), "r"(phase) : "memory");
}

// Each block streams bytes_per_block from its own offset through `stages` buffers of `chunk` bytes.
__global__ void StreamKernel(const char* src, size_t bytes_per_block, int chunk, int stages, int copies_per_chunk) {
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t bars[16];
  const char* base = src + blockIdx.x * bytes_per_block;
  const int n = (int)(bytes_per_block / chunk);
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) MbarInit(&bars[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const int piece = chunk / copies_per_chunk;
    for (int i = 0; i < n + stages; ++i) {
      if (i >= stages) MbarWait(&bars[(i - stages) % stages], ((i - stages) / stages) & 1);
      if (i < n) {
        const int s = i % stages;
        MbarExpect(&bars[s], chunk);
        for (int c = 0; c < copies_per_chunk; ++c)
          BulkCopy(smem + s * chunk + c * piece, base + (size_t)i * chunk + c * piece, piece, &bars[s]);
      }
    }
  }
}

__device__ unsigned long long g_cycles[4];

__global__ void ClusterBarrierKernel(int iters) {
  cg::cluster_group cluster = cg::this_cluster();
  long long t0 = clock64();
  for (int i = 0; i < iters; ++i) cluster.sync();
  long long t1 = clock64();
  if (blockIdx.x == 0 && threadIdx.x == 0) g_cycles[0] = (t1 - t0) / iters;
}

// All-gather: each of 16 blocks owns a 32 x 48 fp16 slice (3 KB) and writes it into every block's 32 x 768 copy.
__global__ void AllGatherKernel(int iters) {
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ __align__(16) __half act[32 * 768];
  const int rank = cluster.block_rank();
  for (int i = threadIdx.x; i < 32 * 768; i += blockDim.x) act[i] = __float2half(0.f);
  cluster.sync();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    // 32 rows x 48 cols = 32 x 6 uint4; 192 uint4 per peer, 16 peers
    for (int idx = threadIdx.x; idx < 16 * 192; idx += blockDim.x) {
      const int peer = idx / 192, e = idx % 192, row = e / 6, col = rank * 48 + (e % 6) * 8;
      uint4 v = *reinterpret_cast<const uint4*>(&act[row * 768 + col]);
      v.x += 1;
      __half* dst = cluster.map_shared_rank(act, peer);
      *reinterpret_cast<uint4*>(&dst[row * 768 + col]) = v;
    }
    cluster.sync();
  }
  long long t1 = clock64();
  if (rank == 0 && threadIdx.x == 0) g_cycles[1] = (t1 - t0) / iters;
}

int main() {
  const size_t layer_bytes = (size_t)(4 * 768 * 768 + 2 * 768 * 3072) * 2;  // 14.16 MB
  const size_t total = 6 * layer_bytes;
  char* w;
  CK(cudaMalloc(&w, total + (1 << 20)));
  CK(cudaMemset(w, 1, total));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaFuncSetAttribute(StreamKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  int clk;
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
  struct Cfg { int blocks, chunk, stages, copies; };
  Cfg cfgs[] = {{16, 16384, 8, 1}, {16, 32768, 6, 1}, {16, 32768, 6, 4}, {16, 49152, 4, 4},
                {32, 32768, 6, 1}, {64, 32768, 6, 1}, {132, 32768, 6, 1}, {132, 16384, 8, 1}};
  for (const Cfg& c : cfgs) {
    for (int scope = 0; scope < 2; ++scope) {  // 0: all 6 layers (DRAM), 1: one layer repeatedly (L2)
      const size_t bytes = scope == 0 ? total : layer_bytes;
      size_t per_block = bytes / c.blocks / c.chunk * c.chunk;
      const int reps = 20;
      for (int r = 0; r < 3; ++r)
        StreamKernel<<<c.blocks, 32, c.chunk * c.stages>>>(w, per_block, c.chunk, c.stages, c.copies);
      CK(cudaEventRecord(a));
      for (int r = 0; r < reps; ++r)
        StreamKernel<<<c.blocks, 32, c.chunk * c.stages>>>(w, per_block, c.chunk, c.stages, c.copies);
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      const double us = ms * 1000 / reps, moved = (double)per_block * c.blocks;
      printf("stream blocks=%3d chunk=%6d stages=%d copies=%d %s: %8.1f us  %7.1f GB/s total  %6.1f GB/s per SM"
             "  -> per layer %.1f us\n", c.blocks, c.chunk, c.stages, c.copies, scope ? "L2  " : "DRAM", us,
             moved / us / 1e3, moved / us / 1e3 / c.blocks, us * layer_bytes / moved);
    }
  }
  for (int cs : {8, 16}) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cs;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(cs);
    cfg.blockDim = dim3(256);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CK(cudaFuncSetAttribute(ClusterBarrierKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(AllGatherKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaLaunchKernelEx(&cfg, ClusterBarrierKernel, 1000));
    CK(cudaDeviceSynchronize());
    if (cs == 16) {
      CK(cudaLaunchKernelEx(&cfg, AllGatherKernel, 200));
      CK(cudaDeviceSynchronize());
    }
    unsigned long long cyc[4];
    CK(cudaMemcpyFromSymbol(cyc, g_cycles, sizeof(cyc)));
    printf("cluster %d: barrier %llu cycles (%.2f us at %d MHz)", cs, cyc[0], cyc[0] / (clk / 1e3), clk / 1000);
    if (cs == 16) printf("; all-gather 48 KB + barrier %llu cycles (%.2f us)", cyc[1], cyc[1] / (clk / 1e3));
    printf("\n");
  }
  return 0;
}
