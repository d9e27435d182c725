// Probe: what each of the chit-chat layer's four GEMMs costs at a few hundred tokens, cuBLASLt (every heuristic
// candidate) against CUTLASS sm90 kernels (TMA, wgmma) with and without programmatic dependent launch (PDL), timed
// as CUDA graphs of back-to-back launches with the weights rotating through 96 MB of copies (as in a forward, where
// 85 MB of weights do not stay in L2): tiles of the core's kernel template, some in clusters of up to 8 blocks, and
// tiles with the tokens in CUTLASS's M. Prints one JSON line per (tokens, GEMM, variant).
//   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -DNDEBUG -DCUTLASS_ENABLE_GDC_FOR_SM90 \
//     -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED --expt-relaxed-constexpr -I. -I$CUTLASS/include \
//     -I$CUTLASS/tools/util/include -I$CUBLAS/include bench/gpu/probes/gemm_probe.cu -L$CUBLAS/lib -lcublasLt \
//     -o gemm_probe
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/gpu/probes/probe_check.h"
#include "bench/gpu/probes/probe_cublas.h"
#include "custom_ops/kernels/cuda/gemm/cutlass_gemm_kernels.cuh"

namespace gemm_probe {

using namespace cute;
using namespace bertserve::cuda::cutlass_gemm;
constexpr int kLaunchesPerGraph = 24;
constexpr size_t kWeightPoolBytes = size_t(96) << 20;
constexpr size_t kWorkspaceBytes = size_t(64) << 20;

// The core's kernel (cutlass_gemm_kernels.cuh), launched with or without programmatic stream serialization.
template <Fused F, class TileShape, class ClusterShape, class MainloopSchedule, class EpilogueSchedule>
bool RunCutlass(const Problem& p, void* workspace, cudaStream_t stream, bool pdl) {
  using K = Kernel<F, TileShape, ClusterShape, MainloopSchedule, EpilogueSchedule>;
  const typename K::Gemm::Arguments args = K::Arguments(p);
  typename K::Gemm gemm;
  return K::Gemm::can_implement(args) == cutlass::Status::kSuccess &&
         K::Gemm::get_workspace_size(args) <= kWorkspaceBytes &&
         gemm.initialize(args, workspace, stream) == cutlass::Status::kSuccess &&
         gemm.run(stream, nullptr, pdl) == cutlass::Status::kSuccess;
}

struct Variant {
  const char* name;
  bool (*run)(const Problem&, void*, cudaStream_t, bool);
};

template <Fused F>
const std::vector<Variant>& Variants() {
  static const std::vector<Variant> variants = {
      {"ping 64x64 1x1", &RunCutlass<F, Shape<_64, _64, _64>, Shape<_1, _1, _1>, Pingpong, PingpongEpilogue>},
      {"ping 64x128 1x1", &RunCutlass<F, Shape<_64, _128, _64>, Shape<_1, _1, _1>, Pingpong, PingpongEpilogue>},
      {"ping 64x128 2x1", &RunCutlass<F, Shape<_64, _128, _64>, Shape<_2, _1, _1>, Pingpong, PingpongEpilogue>},
      {"ping 64x64 1x2", &RunCutlass<F, Shape<_64, _64, _64>, Shape<_1, _2, _1>, Pingpong, PingpongEpilogue>},
      {"coop 128x64 1x1", &RunCutlass<F, Shape<_128, _64, _64>, Shape<_1, _1, _1>, Cooperative, CooperativeEpilogue>},
      {"coop 128x128 1x1",
       &RunCutlass<F, Shape<_128, _128, _64>, Shape<_1, _1, _1>, Cooperative, CooperativeEpilogue>},
      {"coop 128x64 1x2", &RunCutlass<F, Shape<_128, _64, _64>, Shape<_1, _2, _1>, Cooperative, CooperativeEpilogue>},
      // Clusters of 4 and 8 blocks, whose TMA loads multicast each operand tile to the blocks that share it: at a
      // few hundred tokens small tiles read the operands from L2 many times over (cuBLASLt's kernels there run in
      // clusters of 8, nvjet ..._4x2 and ..._2x4).
      {"ping 64x64 2x2", &RunCutlass<F, Shape<_64, _64, _64>, Shape<_2, _2, _1>, Pingpong, PingpongEpilogue>},
      {"ping 64x64 2x4", &RunCutlass<F, Shape<_64, _64, _64>, Shape<_2, _4, _1>, Pingpong, PingpongEpilogue>},
      {"ping 64x64 4x2", &RunCutlass<F, Shape<_64, _64, _64>, Shape<_4, _2, _1>, Pingpong, PingpongEpilogue>},
      {"ping 64x128 2x2", &RunCutlass<F, Shape<_64, _128, _64>, Shape<_2, _2, _1>, Pingpong, PingpongEpilogue>},
      {"coop 128x64 2x2", &RunCutlass<F, Shape<_128, _64, _64>, Shape<_2, _2, _1>, Cooperative, CooperativeEpilogue>},
      {"coop 128x64 2x4", &RunCutlass<F, Shape<_128, _64, _64>, Shape<_2, _4, _1>, Cooperative, CooperativeEpilogue>},
      {"coop 128x128 2x2",
       &RunCutlass<F, Shape<_128, _128, _64>, Shape<_2, _2, _1>, Cooperative, CooperativeEpilogue>},
  };
  return variants;
}

// The GEMM the other way round: CUTLASS's M the tokens, N the features (A = X, K-major; B = W, N-major; Y row-major),
// so that at a few tokens a tile can be narrow in features (wgmma's N from 8) where the core's orientation puts the
// features in wgmma's M (64 at least): twice or four times the blocks, each streaming half or a quarter of the
// weights. The epilogue here is the plain one whatever the GEMM's (bias and GELU cost little at 32 rows).
template <class TileShape, class MainloopSchedule, class EpilogueSchedule>
bool RunTokensMajor(const Problem& p, void*, cudaStream_t stream, bool pdl) {
  using Row = cutlass::layout::RowMajor;
  using ClusterShape = Shape<_1, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Row, 8, Half, Row, 8, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<Half, float, void, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Half, Row, 8, Half, Row, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using GK = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue,
                                                  cutlass::gemm::PersistentScheduler>;
  using G = cutlass::gemm::device::GemmUniversalAdapter<GK>;
  const int M = static_cast<int>(p.m), N = static_cast<int>(p.n), K = static_cast<int>(p.k);
  typename G::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {M, N, K, 1};
  args.mainloop.ptr_A = reinterpret_cast<const Half*>(p.x);
  args.mainloop.dA = cutlass::make_cute_packed_stride(typename GK::StrideA{}, cute::make_shape(M, K, 1));
  args.mainloop.ptr_B = reinterpret_cast<const Half*>(p.w);
  args.mainloop.dB = cutlass::make_cute_packed_stride(typename GK::StrideB{}, cute::make_shape(N, K, 1));
  args.epilogue.ptr_D = reinterpret_cast<Half*>(p.y);
  args.epilogue.dD = cutlass::make_cute_packed_stride(typename GK::StrideD{}, cute::make_shape(M, N, 1));
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.hw_info.sm_count = p.sm_count;
  G gemm;
  return G::can_implement(args) == cutlass::Status::kSuccess && G::get_workspace_size(args) == 0 &&
         gemm.initialize(args, nullptr, stream) == cutlass::Status::kSuccess &&
         gemm.run(stream, nullptr, pdl) == cutlass::Status::kSuccess;
}

const std::vector<Variant>& TokensMajorVariants() {
  using Basic = cutlass::gemm::KernelTmaWarpSpecialized;
  using BasicEpilogue = cutlass::epilogue::NoSmemWarpSpecialized;
  static const std::vector<Variant> variants = {
      {"tokens-major ping 64x32x128", &RunTokensMajor<Shape<_64, _32, _128>, Pingpong, PingpongEpilogue>},
      {"tokens-major ping 64x16x128", &RunTokensMajor<Shape<_64, _16, _128>, Pingpong, PingpongEpilogue>},
      {"tokens-major ping 64x32x64", &RunTokensMajor<Shape<_64, _32, _64>, Pingpong, PingpongEpilogue>},
      {"tokens-major basic 64x32x128", &RunTokensMajor<Shape<_64, _32, _128>, Basic, BasicEpilogue>},
      {"tokens-major basic 64x16x128", &RunTokensMajor<Shape<_64, _16, _128>, Basic, BasicEpilogue>},
      {"tokens-major basic 64x64x64", &RunTokensMajor<Shape<_64, _64, _64>, Basic, BasicEpilogue>},
  };
  return variants;
}

const std::vector<Variant>& VariantsFor(Fused f) {
  switch (f) {
    case Fused::kNone:
      return Variants<Fused::kNone>();
    case Fused::kBias:
      return Variants<Fused::kBias>();
    default:
      return Variants<Fused::kBiasGelu>();
  }
}

}  // namespace gemm_probe

int main() {
  using namespace gemm_probe;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasLtHandle_t handle;
  cublasLtCreate(&handle);
  __half *pool, *x, *y, *bias;
  void* workspace;
  const int max_t = 2048, max_n = 3072, max_k = 3072;
  CK(cudaMalloc(&pool, kWeightPoolBytes));
  CK(cudaMalloc(&x, size_t(max_t) * max_k * 2));
  CK(cudaMalloc(&y, size_t(max_t) * max_n * 2));
  CK(cudaMalloc(&bias, max_n * 2));
  CK(cudaMalloc(&workspace, kWorkspaceBytes));
  FillKernel<<<1024, 256>>>(pool, kWeightPoolBytes / 2, 1);
  FillKernel<<<1024, 256>>>(x, size_t(max_t) * max_k, 2);
  FillKernel<<<16, 256>>>(bias, max_n, 3);
  CK(cudaDeviceSynchronize());

  struct Gemm {
    const char* name;
    int n, k;
    Fused fuse;
  };
  const Gemm gemms[] = {{"qkv", 2304, 768, Fused::kBias},
                        {"attn_out", 768, 768, Fused::kNone},
                        {"ffn", 3072, 768, Fused::kBiasGelu},
                        {"ffn_out", 768, 3072, Fused::kNone}};
  for (const int t : {32, 192, 256, 512, 704, 736, 1024}) {
    for (const Gemm& g : gemms) {
      const size_t w_elems = size_t(g.n) * g.k;
      const int copies = static_cast<int>(kWeightPoolBytes / 2 / w_elems);
      auto problem = [&](int copy) { return Problem{x, pool + copy * w_elems, bias, y, t, g.n, g.k, 132}; };
      // cuBLASLt: bias in its epilogue where the GEMM has one; GELU as a pass of its own is not timed here.
      CublasGemm c = MakeCublasGemm(handle, t, g.n, g.k, g.fuse != Fused::kNone ? bias : nullptr, kWorkspaceBytes,
                                    32);
      float first = -1, best = 1e30f;
      int best_i = -1;
      for (int i = 0; i < c.found; ++i) {
        const float us = GraphMicros(stream, copies, kLaunchesPerGraph, [&](int copy) {
          return RunCublasGemm(c, i, pool + copy * w_elems, x, y, workspace, stream);
        });
        if (i == 0) first = us;
        if (us > 0 && us < best) best = us, best_i = i;
      }
      printf("{\"t\": %d, \"gemm\": \"%s\", \"variant\": \"cublaslt first\", \"us\": %.2f}\n", t, g.name, first);
      printf("{\"t\": %d, \"gemm\": \"%s\", \"variant\": \"cublaslt best of %d (#%d)\", \"us\": %.2f}\n", t, g.name,
             c.found, best_i, best);
      DestroyCublasGemm(c);
      std::vector<Variant> variants = VariantsFor(g.fuse);
      if (t <= 256) variants.insert(variants.end(), TokensMajorVariants().begin(), TokensMajorVariants().end());
      for (const Variant& v : variants) {
        for (const bool pdl : {false, true}) {
          const float us = GraphMicros(stream, copies, kLaunchesPerGraph, [&](int copy) {
            return v.run(problem(copy), workspace, stream, pdl);
          });
          printf("{\"t\": %d, \"gemm\": \"%s\", \"variant\": \"cutlass %s%s\", \"us\": %.2f}\n", t, g.name,
                 v.name, pdl ? " pdl" : "", us);
        }
      }
      fflush(stdout);
    }
  }
  return 0;
}
