// CUTLASS 3 GEMMs for sm90 (TMA loads, wgmma, warp-specialised, persistent) with the encoder's epilogues on the
// fp32 accumulators, rounded to fp16 once: none, + bias, or + bias then GELU in BERT's erf form (the FFN GEMM).
// Included by the translation units that instantiate the tile tables (cutlass_gemm_plain.cu, cutlass_gemm_gelu.cu),
// which build in parallel.
//
// Row-major Y[m, n] = X[m, k] @ W[k, n] is computed as the column-major Z = Y^T = W^T X^T, as on the cuBLASLt
// path: CUTLASS's M is our n (features), its N our m (tokens); the bias runs along CUTLASS's rows
// (LinCombPerRowBias), W^T is an M-major A operand, X^T a K-major B operand, Y a column-major D.
#ifndef BERTSERVE_KERNELS_CUDA_GEMM_CUTLASS_GEMM_KERNELS_CUH_
#define BERTSERVE_KERNELS_CUDA_GEMM_CUTLASS_GEMM_KERNELS_CUH_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "custom_ops/kernels/cuda/common.cuh"
#include "custom_ops/kernels/cuda/gemm/cutlass_gemm_runners.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

#ifndef CUTLASS_ENABLE_GDC_FOR_SM90
#error "build with -DCUTLASS_ENABLE_GDC_FOR_SM90: the kernels are launched as programmatic dependents"
#endif

namespace bertserve {
namespace cuda {
namespace cutlass_gemm {

// BERT's GELU as a CUTLASS epilogue activation on the fp32 accumulators: GeluErf (Abramowitz & Stegun erf,
// branch-free), not cutlass::epilogue::thread::GELU, whose erff costs several times more per element; in a
// cooperative kernel the epilogue does not overlap the main loop, so its arithmetic adds to the GEMM's time.
template <class T>
struct BertGelu {
  CUTLASS_DEVICE T operator()(const T& x) const { return GeluErf(x); }
};
template <class T, int N>
struct BertGelu<cutlass::Array<T, N>> {
  CUTLASS_DEVICE cutlass::Array<T, N> operator()(const cutlass::Array<T, N>& x) const {
    cutlass::Array<T, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = GeluErf(x[i]);
    return y;
  }
};

using Half = cutlass::half_t;

template <Fused F>
struct FusionOf;
template <>
struct FusionOf<Fused::kNone> {
  using type = cutlass::epilogue::fusion::LinearCombination<Half, float, Half, float>;
};
template <>
struct FusionOf<Fused::kBias> {
  using type = cutlass::epilogue::fusion::LinCombPerRowBias<Half, float, Half, Half, float>;
};
template <>
struct FusionOf<Fused::kBiasGelu> {
  using type = cutlass::epilogue::fusion::LinCombPerRowBiasEltAct<BertGelu, Half, float, Half, Half, float>;
};
template <>
struct FusionOf<Fused::kFp32Partials> {
  using type = cutlass::epilogue::fusion::LinearCombination<float, float, float, float>;
};

// The kernel schedules the tables use: cooperative (two consumer warp groups share a tile) or ping-pong (each
// consumer warp group owns a tile, its epilogue overlapping the other's main loop).
using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CooperativeEpilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingpongEpilogue = cutlass::epilogue::TmaWarpSpecialized;

// The FFN GEMM + GELU's and the k-split partial products' tables (cutlass_gemm_gelu.cu,
// cutlass_gemm_partials.cu), which Runners (cutlass_gemm_plain.cu) hands out.
const std::vector<Runner>& GeluRunners();
const std::vector<Runner>& PartialsRunners();

// A CUTLASS sm90 GEMM kernel whose blocks first ask L2 for the weights (the A operand, W^T), each block an even
// share of them whatever tiles it then owns, and block 0 for the epilogue's bias, before the kernel's
// programmatic-launch wait: neither depends on the kernel before, so their DRAM reads overlap it instead of
// following it (a bias is read once a forward: unasked, the epilogue waits on DRAM; commit 299059a). Only for
// launches in the chain (up to kChainMaxTokens rows); the bulk prefetches are issued by one thread and not waited
// for.
template <class Base>
struct WeightPrefetching : Base {
  struct Params : Base::Params {
    const char* weights = nullptr;
    uint64_t weight_bytes = 0;  // 0: no prefetch
    const void* bias = nullptr;
    uint64_t bias_bytes = 0;
  };

  static Params to_underlying_arguments(const typename Base::Arguments& args, void* workspace) {
    Params params{Base::to_underlying_arguments(args, workspace)};
    const auto [m, n, k, l] = args.problem_shape;  // CUTLASS's M x N x K x batch: features x tokens x k x slices
    if (n <= kChainMaxTokens) {
      params.weights = reinterpret_cast<const char*>(args.mainloop.ptr_A);
      params.weight_bytes = static_cast<uint64_t>(m) * k * l * sizeof(Half);
      if constexpr (requires { args.epilogue.thread.bias_ptr; }) {
        params.bias = args.epilogue.thread.bias_ptr;
        params.bias_bytes = params.bias == nullptr ? 0 : m * sizeof(*args.epilogue.thread.bias_ptr);
      }
    }
    return params;
  }

  CUTLASS_DEVICE void operator()(const Params& params, char* smem) {
    if (params.weight_bytes != 0 && threadIdx.x == 0) {
      const uint64_t blocks = uint64_t{gridDim.x} * gridDim.y * gridDim.z;
      const uint64_t block = blockIdx.x + uint64_t{gridDim.x} * (blockIdx.y + uint64_t{gridDim.y} * blockIdx.z);
      const uint64_t share = (params.weight_bytes / blocks + 255) & ~uint64_t{255};
      const uint64_t begin = block * share;
      const uint64_t end = begin + share < params.weight_bytes ? begin + share : params.weight_bytes;
      if (begin < end) PrefetchRangeToL2(params.weights + begin, end - begin);
      if (block == 0 && params.bias_bytes != 0) PrefetchRangeToL2(params.bias, params.bias_bytes);
    }
    Base::operator()(params, smem);
  }
};

// CUTLASS's non-persistent warp-specialised kernel (KernelTmaWarpSpecialized, one block a cluster) with its
// producer reordered: it reserves the first pipeline stages and copies the weights' k tiles (the A operand) into
// them before the programmatic-launch wait, and the activations' (B) after it. The weights do not depend on the
// kernel before, so at a few rows, where all of a block's k tiles fit in its stages, the loads that follow the wait
// are the activations' alone (a 64x32x128 tile of a 768-deep GEMM: 48 of 144 KB). The rest is CUTLASS's kernel as
// it is: the pipelines, the consumer's main loop and epilogue, the trigger after the main loop.
template <class Base>
struct WeightsBeforeWait : Base {
  using Mainloop = typename Base::CollectiveMainloop;
  using Epilogue = typename Base::CollectiveEpilogue;
  static_assert(cute::is_same_v<typename Mainloop::DispatchPolicy::Schedule, cutlass::gemm::KernelTmaWarpSpecialized>);
  static_assert(cute::size(typename Base::ClusterShape{}) == 1);

  // The producer warp's loads: weights, the wait (every lane), activations, then any k tiles past the stages.
  template <class Pipeline, class State, class Inputs, class Coord, class KIterator>
  CUTLASS_DEVICE static void Load(const typename Mainloop::Params& params, Pipeline& pipeline, State state,
                                  const Inputs& inputs, const Coord& block, KIterator k_tile, int k_tiles,
                                  typename Mainloop::TensorStorage& storage) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), typename Mainloop::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), typename Mainloop::SmemLayoutB{});
    const auto [m, n, k, l] = block;
    Tensor tAgA = params.tma_load_a.get_slice(0).partition_S(get<0>(inputs)(_, _, m, _, l));
    Tensor tAsA = params.tma_load_a.get_slice(0).partition_D(sA);
    Tensor tBgB = params.tma_load_b.get_slice(0).partition_S(get<1>(inputs)(_, _, n, _, l));
    Tensor tBsB = params.tma_load_b.get_slice(0).partition_D(sB);
    constexpr uint16_t kNoMulticast = 0;
    const int early = k_tiles < Mainloop::DispatchPolicy::Stages ? k_tiles : Mainloop::DispatchPolicy::Stages;
    const bool leader = elect_one_sync();
    if (leader) {
      State weights_state = state;
      KIterator weights_tile = k_tile;
      for (int i = 0; i < early; ++i, ++weights_state, ++weights_tile) {
        pipeline.producer_acquire(weights_state);
        copy(params.tma_load_a.with(*pipeline.producer_get_barrier(weights_state), kNoMulticast),
             tAgA(_, _, _, *weights_tile), tAsA(_, _, _, weights_state.index()));
      }
    }
    __syncwarp();
    cutlass::arch::wait_on_dependent_grids();
    if (!leader) return;
    for (int i = 0; i < k_tiles; ++i, ++state, ++k_tile) {
      if (i >= early) {
        pipeline.producer_acquire(state);
        copy(params.tma_load_a.with(*pipeline.producer_get_barrier(state), kNoMulticast), tAgA(_, _, _, *k_tile),
             tAsA(_, _, _, state.index()));
      }
      copy(params.tma_load_b.with(*pipeline.producer_get_barrier(state), kNoMulticast), tBgB(_, _, _, *k_tile),
           tBsB(_, _, _, state.index()));
    }
  }

  CUTLASS_DEVICE void operator()(const typename Base::Params& params, char* smem) {
    using namespace cute;
    auto& shared = *reinterpret_cast<typename Base::SharedStorage*>(smem);
    const int warp = cutlass::canonical_warp_idx_sync();
    const bool producer_group = cutlass::canonical_warp_group_idx() == 0;
    const bool loader = producer_group && warp % cutlass::NumWarpsPerWarpGroup == 0;
    const int group_thread = int(threadIdx.x) % cutlass::NumThreadsPerWarpGroup;
    if (warp == 0 && elect_one_sync()) {
      Mainloop::prefetch_tma_descriptors(params.mainloop);
      Epilogue::prefetch_tma_descriptors(params.epilogue);
    }

    using MainloopPipeline = typename Mainloop::MainloopPipeline;
    typename MainloopPipeline::Params mainloop_params;
    if (loader) mainloop_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (!producer_group) mainloop_params.role = MainloopPipeline::ThreadCategory::Consumer;
    mainloop_params.is_leader = group_thread == 0;
    mainloop_params.num_consumers = cutlass::NumThreadsPerWarpGroup;
    mainloop_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared.pipelines.mainloop, mainloop_params, typename Base::ClusterShape{});

    using EpiLoadPipeline = typename Epilogue::LoadPipeline;
    typename EpiLoadPipeline::Params epi_load_params;
    if (loader) epi_load_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (!producer_group) epi_load_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    epi_load_params.dst_blockid = block_rank_in_cluster();
    epi_load_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_params.consumer_arv_count = cutlass::NumThreadsPerWarpGroup;
    if constexpr (Epilogue::RequiresTransactionBytes) {
      epi_load_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load_pipeline(shared.pipelines.epi_load, epi_load_params);
    typename Epilogue::StorePipeline::Params epi_store_params;
    epi_store_params.always_wait = true;
    typename Epilogue::StorePipeline epi_store_pipeline(epi_store_params);

    typename Mainloop::PipelineState mainloop_consumer_state;
    typename Epilogue::LoadPipelineState epi_load_consumer_state;
    auto mainloop_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    auto epi_load_producer_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
    auto epi_store_producer_state = cutlass::make_producer_start_state<typename Epilogue::StorePipeline>();
    __syncthreads();  // the pipelines' barriers initialised, for every warp

    const auto tile = typename Base::TileShape{};
    typename Base::TiledMma tiled_mma;
    const auto problem = append<4>(params.problem_shape, Int<1>{});
    Mainloop mainloop;
    Epilogue epilogue(params.epilogue, shared.tensors.epilogue);
    const auto inputs = mainloop.load_init(problem, params.mainloop);
    const auto m = idx2crd(int(blockIdx.x), shape<2>(get<0>(inputs)));
    const auto n = idx2crd(int(blockIdx.y), shape<2>(get<1>(inputs)));
    const auto l = idx2crd(int(blockIdx.z), shape<4>(get<1>(inputs)));
    const auto block = make_coord(m, n, _, l);
    const auto k_tile = make_coord_iterator(shape<3>(get<0>(inputs)));
    const int k_tiles = size<3>(get<0>(inputs));

    if (producer_group) {
      if (!loader) return;
      Load(params.mainloop, mainloop_pipeline, mainloop_producer_state, inputs, block, k_tile, k_tiles,
           shared.tensors.mainloop);
      mainloop_producer_state.advance(k_tiles);
      mainloop.load_tail(mainloop_pipeline, mainloop_producer_state);
      if (epilogue.is_producer_load_needed()) {
        __syncwarp();
        epi_load_producer_state = epilogue.load(epi_load_pipeline, epi_load_producer_state, problem, tile, block,
                                                tiled_mma, cutlass::canonical_lane_idx(), shared.tensors.epilogue);
        epilogue.load_tail(epi_load_pipeline, epi_load_producer_state);
      }
      return;
    }
    Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(tile));
    mainloop.mma(mainloop_pipeline, mainloop_consumer_state, accumulators, k_tiles, group_thread,
                 shared.tensors.mainloop, params.mainloop);
    mainloop.mma_tail(mainloop_pipeline, mainloop_consumer_state, k_tiles);
    cutlass::arch::launch_dependent_grids();
    auto [epi_load_next, epi_store_next] =
        epilogue.store(epi_load_pipeline, epi_load_consumer_state, epi_store_pipeline, epi_store_producer_state,
                       problem, tile, block, accumulators, tiled_mma, group_thread, shared.tensors.epilogue);
    epilogue.store_tail(epi_load_pipeline, epi_load_next, epi_store_pipeline, epi_store_next);
  }
};

// What identifies a launch's parameters (Kernel::Run): every field of the Problem. A serving process sees a bounded
// set of them (weights, its workspaces, token counts), but nothing guarantees it, hence the bound.
using ProblemKey = std::tuple<const __half*, const __half*, const __half*, void*, int64_t, int64_t, int64_t, int, int>;
inline ProblemKey KeyOf(const Problem& p) { return {p.x, p.w, p.bias, p.y, p.m, p.n, p.k, p.sm_count, p.k_splits}; }
constexpr size_t kMaxRememberedProblems = 1024;

template <Fused F, class TileShape, class ClusterShape, class MainloopSchedule, class EpilogueSchedule>
struct Kernel {
  using Layout = cutlass::layout::ColumnMajor;
  static constexpr int kAlign = 8;  // 16 bytes of fp16: TMA's requirement on every leading dimension
  using Out = std::conditional_t<F == Fused::kFp32Partials, float, Half>;
  static constexpr int kAlignOut = 16 / sizeof(Out);
  // An epilogue storing from registers takes its fusion with no source operand.
  using Fusion = std::conditional_t<std::is_same_v<EpilogueSchedule, cutlass::epilogue::NoSmemWarpSpecialized>,
                                    cutlass::epilogue::fusion::LinearCombination<Out, float, void, float>,
                                    typename FusionOf<F>::type>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Layout, kAlignOut, Out, Layout,
      kAlignOut, EpilogueSchedule, Fusion>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Half, Layout, kAlign, Half, Layout, kAlign, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Universal = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                         CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using GemmKernel = WeightPrefetching<
      std::conditional_t<std::is_same_v<MainloopSchedule, cutlass::gemm::KernelTmaWarpSpecialized>,
                         WeightsBeforeWait<Universal>, Universal>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // A k split is a batch of L = k_splits GEMMs over k / L: W's slices are consecutive blocks of rows (A's packed
  // batch stride), X's are column blocks of its rows (B keeps X's full row pitch k, batch stride k / L), and the
  // partial products are consecutive [m, n] blocks of Y.
  static typename Gemm::Arguments Arguments(const Problem& p) {
    using GK = typename Gemm::GemmKernel;
    const int M = static_cast<int>(p.n), N = static_cast<int>(p.m), L = p.k_splits;
    const int K = static_cast<int>(p.k) / L;
    typename Gemm::Arguments args{};
    args.mode = L == 1 ? cutlass::gemm::GemmUniversalMode::kGemm : cutlass::gemm::GemmUniversalMode::kBatched;
    args.problem_shape = {M, N, K, L};
    args.mainloop.ptr_A = reinterpret_cast<const Half*>(p.w);
    args.mainloop.dA = cutlass::make_cute_packed_stride(typename GK::StrideA{}, cute::make_shape(M, K, L));
    args.mainloop.ptr_B = reinterpret_cast<const Half*>(p.x);
    args.mainloop.dB = cutlass::make_cute_packed_stride(typename GK::StrideB{}, cute::make_shape(N, K, L));
    cute::get<0>(args.mainloop.dB) = p.k;
    cute::get<2>(args.mainloop.dB) = K;
    args.epilogue.ptr_D = reinterpret_cast<Out*>(p.y);
    args.epilogue.dD = cutlass::make_cute_packed_stride(typename GK::StrideD{}, cute::make_shape(M, N, L));
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    if constexpr (F == Fused::kBias || F == Fused::kBiasGelu) {
      args.epilogue.thread.bias_ptr = reinterpret_cast<const Half*>(p.bias);
    }
    args.hw_info.sm_count = p.sm_count;
    return args;
  }

  // CUTLASS's initialize builds the kernel's parameters on the host: a TMA descriptor per operand, each through a
  // driver entry point looked up by name, and the kernel's shared-memory attribute. Eager callers (the TF op)
  // launch the same problems again and again, so the parameters are kept per problem and a launch of one seen
  // before only launches (commit 71510da).
  static cutlass::Status Run(const Problem& p, cudaStream_t stream) {
    static std::mutex mutex;
    static std::map<ProblemKey, typename Gemm::Params> launched;
    const ProblemKey key = KeyOf(p);
    std::lock_guard<std::mutex> lock(mutex);
    auto it = launched.find(key);
    if (it == launched.end()) {
      const typename Gemm::Arguments args = Arguments(p);
      cutlass::Status status = Gemm::can_implement(args);
      if (status != cutlass::Status::kSuccess) return status;
      // Every configuration here runs without a workspace (no stream-K or split-k scheduler): one would need
      // initialising before every launch, which reusing the parameters skips.
      if (Gemm::get_workspace_size(args) != 0) return cutlass::Status::kErrorNotSupported;
      Gemm gemm;
      status = gemm.initialize(args, nullptr, stream);
      if (status != cutlass::Status::kSuccess) return status;
      if (launched.size() >= kMaxRememberedProblems) launched.clear();
      it = launched.emplace(key, gemm.params()).first;
    }
    return Gemm::run(it->second, stream, /*cuda_adapter=*/nullptr, /*launch_with_pdl=*/p.m <= kChainMaxTokens);
  }
};

// The small tiles every table starts with (cutlass_gemm_runners.h: kSmallTile .. kBasicSmallTile): 64x64x64, and
// 64 features x 32 tokens x 128 of k, which at 32 rows or fewer loads no padding tokens and makes half as many
// pipeline steps (commit d366b8e); each as a persistent ping-pong kernel and as a non-persistent one (one consumer
// warp group, no tile scheduler; its epilogue stores from registers where the fusion has no bias), whose chain
// from launch to end is shorter at a few rows (commit 1570471).
template <Fused F, class TileShape>
using PingpongTileKernel = Kernel<F, TileShape, cute::Shape<cute::_1, cute::_1, cute::_1>, Pingpong, PingpongEpilogue>;
template <Fused F, class TileShape>
using BasicTileKernel =
    Kernel<F, TileShape, cute::Shape<cute::_1, cute::_1, cute::_1>, cutlass::gemm::KernelTmaWarpSpecialized,
           std::conditional_t<F == Fused::kNone || F == Fused::kFp32Partials,
                              cutlass::epilogue::NoSmemWarpSpecialized, cutlass::epilogue::TmaWarpSpecialized>>;
using SmallTile = cute::Shape<cute::_64, cute::_64, cute::_64>;
using NarrowTile = cute::Shape<cute::_64, cute::_32, cute::_128>;

// A table: the small tiles, then `others`.
template <Fused F>
std::vector<Runner> WithSmallTiles(std::initializer_list<Runner> others) {
  std::vector<Runner> runners = {
      {"ping-pong 64x64x64", &PingpongTileKernel<F, SmallTile>::Run},
      {"ping-pong 64x32x128", &PingpongTileKernel<F, NarrowTile>::Run},
      {"basic 64x32x128", &BasicTileKernel<F, NarrowTile>::Run},
      {"basic 64x64x64", &BasicTileKernel<F, SmallTile>::Run},
  };
  runners.insert(runners.end(), others);
  return runners;
}

// The tile configurations of the GEMMs without GELU, CUTLASS M x N x K = features x tokens x k: the small tiles,
// then the two others that beat or matched cuBLASLt somewhere from 32 to 736 tokens on the H200 once launched as
// programmatic dependents (bench/gpu/probes/gemm_probe.cu, commit 36bc021), then the basic kernel with 80 and 96
// tokens a block, timed at any row count (at 704 tokens 12 x 9 blocks of 64x80 for a 768-wide output, near one
// wave; commit af81f49). Instantiated for the plain epilogues (cutlass_gemm_plain.cu) and for the k-split partial
// products (cutlass_gemm_partials.cu).
template <Fused F>
const std::vector<Runner>& PlainRunners() {
  using namespace cute;
  using Wide = Kernel<F, Shape<_64, _128, _64>, Shape<_1, _1, _1>, Pingpong, PingpongEpilogue>;
  using Square = Kernel<F, Shape<_128, _128, _64>, Shape<_1, _1, _1>, Cooperative, CooperativeEpilogue>;
  static const std::vector<Runner> runners = WithSmallTiles<F>({
      {"ping-pong 64x128x64", &Wide::Run},
      {"cooperative 128x128x64", &Square::Run},
      {"basic 64x80x64", &BasicTileKernel<F, Shape<_64, _80, _64>>::Run, /*timed_at_any_rows=*/true},
      {"basic 64x96x64", &BasicTileKernel<F, Shape<_64, _96, _64>>::Run, /*timed_at_any_rows=*/true},
  });
  return runners;
}

}  // namespace cutlass_gemm
}  // namespace cuda
}  // namespace bertserve

#endif  // BERTSERVE_KERNELS_CUDA_GEMM_CUTLASS_GEMM_KERNELS_CUH_
