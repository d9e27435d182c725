// The GPU probes' error check: a failed CUDA call prints where and why, and ends the probe.
#ifndef BERTSERVE_BENCH_GPU_PROBE_CHECK_H_
#define BERTSERVE_BENCH_GPU_PROBE_CHECK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

#endif  // BERTSERVE_BENCH_GPU_PROBE_CHECK_H_
