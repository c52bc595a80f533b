// Launching the GEMM engine with custom policies (fused ops, tests). Include from .cu files only.
//
//   launch_gemm<Shape, T, MajorB, Order, Ready, Epi>(args, cfg, order, ready, epi, stream)
//       one fixed tile shape / dtype / layout (compiles one kernel);
//   launch_gemm<Order, Ready, Epi>(args, cfg, order, ready, epi, stream)
//       any compiled tile shape, dtype and B layout, chosen at run time from cfg and args.
// Both validate first (validate_inputs + Epi::check), then build the tensor maps and the work plan
// and launch on `stream`. args.c / args.ldc are not used: the epilogue params say where C goes.
// GemmStep::prepare does everything but the launch (validation, tensor maps, the stream's workspace
// grown to the plan's need), so a caller that enqueues other work before the GEMM can fail before
// any of it: the launch of the same arguments on the same stream then needs no memory.
// Split-K (cfg.splits_k()) needs a Ready policy that allows it (split_k_safe) and uses the stream's
// workspace (ops/gemm.h).
// fp32 epilogues (policies.cuh: kFloatOut) need configs without swap-AB or K clusters, on tiles of a
// multiple of 32 columns (choose_gemm_config's EpilogueOutput::fp32 picks only those); K clusters
// (cfg.cluster_k) are compiled for the plain A policy (AlwaysReady) only: the fused ops' GEMM calls
// take split-K or whole tiles (ops/gemm.h: KCuts), so their kernels are not built.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <iterator>
#include <type_traits>

#include "taxfree/kernels/gemm/gemm_kernel.cuh"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_detail.h"
#include "taxfree/ops/gemm_tiles.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/launch_config.h"

namespace taxfree::gemm {

// Whether K-cluster kernels exist for these policies (above).
template <class Ready, class Epi>
constexpr bool k_clusters_compiled() {
  return std::is_same_v<Ready, AlwaysReady> && !float_out<Epi>();
}

template <class Shape, class T, device::Major kMajorB, class Order, class Ready, class Epi>
void launch_gemm(const GemmArgs& args, const GemmConfig& cfg, const typename Order::Params& order,
                 const typename Ready::Params& ready, const typename Epi::Params& epi, cudaStream_t stream,
                 GemmStep step = GemmStep::launch) {
  constexpr DType kDType = std::is_same_v<T, __nv_bfloat16> ? DType::bf16 : DType::fp16;
  constexpr BLayout kLayout = kMajorB == device::Major::K ? BLayout::nk : BLayout::kn;
  validate_inputs(args, cfg);
  TF_REQUIRE(cfg.bm == Shape::BM && cfg.bn == Shape::BN && cfg.stages == Shape::kStages &&
                 cfg.cluster_m == Shape::kCluster && cfg.swap_ab == Shape::kSwapAB && cfg.cluster_k == Shape::kClusterK,
             Status::InvalidArgument,
             "config " << cfg.name() << " does not match the kernel's tile " << Shape::BM << "x" << Shape::BN << " s"
                       << Shape::kStages << " c" << Shape::kCluster << (Shape::kSwapAB ? " swap" : "") << " ck"
                       << Shape::kClusterK);
  TF_REQUIRE(args.dtype == kDType && args.b_layout == kLayout, Status::InvalidArgument,
             "args (" << dtype_name(args.dtype) << ", " << layout_name(args.b_layout) << ") do not match the kernel ("
                      << dtype_name(kDType) << ", " << layout_name(kLayout) << ")");
  // A split tile's K ranges run on different CTAs in any order; a Ready policy sees only the
  // k-blocks of its own range and may not assume it sees k-block 0 first.
  TF_REQUIRE(!cfg.splits_k() || split_k_safe<Ready>(), Status::NotSupported,
             "GEMM config " << cfg.name() << ": split-K needs an A policy that allows it (policies.cuh)");
  static_assert(Shape::kClusterK == 1 || k_clusters_compiled<Ready, Epi>(),
                "K clusters run with the plain A policy and a 16-bit epilogue only");
  Epi::check(epi, args.m, args.n, 2);

  using Params = GemmParams<Order, Ready, Epi>;
  auto* kernel = &gemm_kernel<Shape, T, kMajorB, Order, Ready, Epi>;
  constexpr int kSmem = SmemLayout<Shape>::kDynamicBytes;
  detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem);
  constexpr int kClusterSize = Shape::kClusterSize;
  int64_t clusters = detail::resident_clusters(reinterpret_cast<const void*>(kernel), Shape::kThreads, kSmem,
                                               kClusterSize);
  // Movers (policies.cuh) take whole clusters of the resident ones; the GEMM keeps at least one.
  const int movers = mover_ctas<Ready>(ready);
  TF_REQUIRE(movers >= 0 && movers % kClusterSize == 0 && movers / kClusterSize < clusters, Status::InvalidArgument,
             "GEMM config " << cfg.name() << ": " << movers << " mover CTAs must be a multiple of the cluster size "
                            << kClusterSize << " and leave a cluster of the " << clusters
                            << " resident ones to the GEMM");
  clusters -= movers / kClusterSize;
  if (cfg.max_ctas > 0) clusters = std::max<int64_t>(1, std::min<int64_t>(clusters, cfg.max_ctas / kClusterSize));

  Params p{};
  p.a = detail::make_tensor_map(args.a, args.dtype, args.k, args.m, args.lda, 64, Shape::BM);
  p.b = kMajorB == device::Major::K
            ? detail::make_tensor_map(args.b, args.dtype, args.k, args.n, args.ldb, 64, Shape::BN / Shape::kCluster)
            : detail::make_tensor_map(args.b, args.dtype, args.n, args.k, args.ldb, 64, 64);
  p.m = int(args.m);
  p.n = int(args.n);
  p.k = int(args.k);
  p.plan = detail::make_work_plan(args, cfg, clusters);
  if (p.plan.split_tiles() > 0) {
    const detail::Workspace ws = detail::stream_workspace(stream, detail::workspace_need(p.plan, cfg));
    p.ws = {static_cast<float2*>(ws.partials), ws.counters};
  }
  p.order = order;
  p.ready = ready;
  if constexpr (requires { Ready::kATensors; })  // A in several tensors of A's shape (policies.cuh)
    for (int i = 0; i < Ready::kATensors; ++i)
      if (p.ready.a_bases[i] != nullptr)
        p.ready.a_maps[i] = detail::make_tensor_map(p.ready.a_bases[i], args.dtype, args.k, args.m, args.lda, 64, Shape::BM);
  p.epi = epi;
  p.stall_ns = dev::kMbarTimeoutNs + ready_max_wait_ns<Ready>(ready);
  if (step == GemmStep::prepare) return;

  // A programmatic dependent launch (the kernel waits for the grid ahead before touching memory).
  const LaunchConfig launch(unsigned(movers + std::min<int64_t>(p.plan.units(), clusters) * kClusterSize),
                            Shape::kThreads, kSmem, stream, true, kClusterSize);
  TF_CUDA(cudaLaunchKernelEx(launch.get(), kernel, p));
}

namespace detail {
template <int I, class Order, class Ready, class Epi>
bool launch_compiled(const GemmArgs& args, const GemmConfig& cfg, const typename Order::Params& order,
                     const typename Ready::Params& ready, const typename Epi::Params& epi, cudaStream_t stream,
                     GemmStep step) {
  constexpr CompiledTile kTile = kCompiledTiles[I];
  using Shape = TileShape<kTile.bm, kTile.bn, kTile.stages, kTile.cluster, kTile.swap, kTile.cluster_k>;
  static_assert(Shape::kFloatEpilogue == fp32_epilogue_compiled(kTile), "the host's and the kernel's rule differ");
  // Not compiled (launch_gemm rejects these configs): fp32 epilogues with swap-AB or a BN that is
  // not a multiple of 32, K clusters outside the plain GEMM.
  if constexpr (!fp32_epilogue_compiled(kTile) && float_out<Epi>()) {
  } else if constexpr (kTile.cluster_k > 1 && !k_clusters_compiled<Ready, Epi>()) {
  } else if (cfg.bm == kTile.bm && cfg.bn == kTile.bn && cfg.stages == kTile.stages && cfg.cluster_m == kTile.cluster &&
             cfg.swap_ab == kTile.swap && cfg.cluster_k == kTile.cluster_k) {
    const bool bf16 = args.dtype == DType::bf16;
    if (args.b_layout == BLayout::nk) {
      if (bf16) launch_gemm<Shape, __nv_bfloat16, device::Major::K, Order, Ready, Epi>(args, cfg, order, ready, epi, stream, step);
      else launch_gemm<Shape, __half, device::Major::K, Order, Ready, Epi>(args, cfg, order, ready, epi, stream, step);
      return true;
    }
    if constexpr (kTile.kn) {
      if (bf16) launch_gemm<Shape, __nv_bfloat16, device::Major::MN, Order, Ready, Epi>(args, cfg, order, ready, epi, stream, step);
      else launch_gemm<Shape, __half, device::Major::MN, Order, Ready, Epi>(args, cfg, order, ready, epi, stream, step);
      return true;
    }
  }
  if constexpr (I + 1 < int(std::size(kCompiledTiles)))
    return launch_compiled<I + 1, Order, Ready, Epi>(args, cfg, order, ready, epi, stream, step);
  return false;
}
}  // namespace detail

template <class Order, class Ready, class Epi>
void launch_gemm(const GemmArgs& args, const GemmConfig& cfg, const typename Order::Params& order,
                 const typename Ready::Params& ready, const typename Epi::Params& epi, cudaStream_t stream,
                 GemmStep step = GemmStep::launch) {
  validate_inputs(args, cfg);  // names an unsupported config before anything is instantiated at run time
  TF_REQUIRE(!float_out<Epi>() || fp32_epilogue_compiled(cfg.swap_ab, cfg.bn), Status::NotSupported,
             "GEMM config " << cfg.name() << ": an fp32 epilogue runs without swap-AB, on tiles of a multiple of 32 columns");
  TF_REQUIRE(cfg.cluster_k == 1 || (k_clusters_compiled<Ready, Epi>()), Status::NotSupported,
             "GEMM config " << cfg.name()
                            << ": K clusters are compiled for the plain GEMM only (its A policy, a 16-bit epilogue)");
  const bool launched = detail::launch_compiled<0, Order, Ready, Epi>(args, cfg, order, ready, epi, stream, step);
  TF_REQUIRE(launched, Status::Internal, "config " << cfg.name() << " passed validation but has no kernel");
}

}  // namespace taxfree::gemm
