// Tensor Core building blocks shared by the core's own kernels: ldmatrix loads of 8x8 fp16 tiles from shared
// memory, mma.sync m16n8k16 (fp16 in, fp32 accumulate), and the bulk tensor copies (TMA) with the mbarriers that
// count their bytes.
#ifndef BERTSERVE_KERNELS_CUDA_MMA_CUH_
#define BERTSERVE_KERNELS_CUDA_MMA_CUH_

#include <cuda_fp16.h>

#include <cstdint>

namespace bertserve {
namespace cuda {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

__device__ __forceinline__ void LoadMatrixX2(uint32_t (&r)[2], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SharedAddress(p)));
}

__device__ __forceinline__ void LoadMatrixX2Trans(uint32_t (&r)[2], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SharedAddress(p)));
}

// d += a (16x16, row-major) * b (16x8, column-major), fp16 inputs, fp32 accumulators.
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void LoadMatrixX4Trans(uint32_t (&r)[4], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

// An mbarrier counting one arrival plus the bytes of the bulk copies expected on it.
__device__ __forceinline__ void InitBulkBarrier(uint64_t* barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(SharedAddress(barrier)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The barrier's current phase completes once `bytes` have landed (one arrival, by the calling thread).
__device__ __forceinline__ void ExpectBulkBytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SharedAddress(barrier)), "r"(bytes)
               : "memory");
}

// A box of a 2-D tensor map (coordinates innermost first) into shared memory, counted on `barrier`.
__device__ __forceinline__ void BulkTensorCopy2d(void* shared, const void* tensor_map, int x, int y,
                                                 uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(SharedAddress(shared)),
      "l"(tensor_map), "r"(x), "r"(y), "r"(SharedAddress(barrier))
      : "memory");
}

// Starts bringing a box of a 2-D tensor map into L2; nothing waits for it.
__device__ __forceinline__ void PrefetchTensor2d(const void* tensor_map, int x, int y) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(tensor_map), "r"(x), "r"(y)
               : "memory");
}

// Starts bringing bytes (a multiple of 16, 16-byte aligned) of global memory into L2; nothing waits for it.
__device__ __forceinline__ void PrefetchToL2(const void* global, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(global), "r"(bytes) : "memory");
}

__device__ __forceinline__ void WaitBulkBarrier(uint64_t* barrier, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(SharedAddress(barrier)), "r"(parity)
        : "memory");
  } while (!done);
}

}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_MMA_CUH_
