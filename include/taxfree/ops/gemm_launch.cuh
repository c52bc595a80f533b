// Launching the GEMM engine with custom policies (fused ops, tests). Include from .cu files only.
//
//   launch_gemm<Shape, T, MajorB, Order, Ready, Epi>(args, cfg, order, ready, epi, stream)
//       one fixed tile shape / dtype / layout (compiles one kernel);
//   launch_gemm<Order, Ready, Epi>(args, cfg, order, ready, epi, stream)
//       any compiled tile shape, dtype and B layout, chosen at run time from cfg and args.
// Both validate first (validate_inputs + Epi::check), then build the tensor maps and launch on
// `stream`. args.c / args.ldc are not used: the epilogue params say where C goes.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <iterator>
#include <type_traits>

#include "taxfree/kernels/gemm/gemm_kernel.cuh"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_detail.h"
#include "taxfree/ops/gemm_tiles.h"
#include "taxfree/runtime/error.h"

namespace taxfree::gemm {

template <class Shape, class T, device::Major kMajorB, class Order, class Ready, class Epi>
void launch_gemm(const GemmArgs& args, const GemmConfig& cfg, const typename Order::Params& order,
                 const typename Ready::Params& ready, const typename Epi::Params& epi, cudaStream_t stream) {
  constexpr DType kDType = std::is_same_v<T, __nv_bfloat16> ? DType::bf16 : DType::fp16;
  constexpr BLayout kLayout = kMajorB == device::Major::K ? BLayout::NK : BLayout::KN;
  validate_inputs(args, cfg);
  TF_REQUIRE(cfg.bm == Shape::BM && cfg.bn == Shape::BN && cfg.stages == Shape::kStages, Status::InvalidArgument,
             "config " << cfg.name() << " does not match the kernel's tile " << Shape::BM << "x" << Shape::BN << " s"
                       << Shape::kStages);
  TF_REQUIRE(args.dtype == kDType && args.b_layout == kLayout, Status::InvalidArgument,
             "args (" << dtype_name(args.dtype) << ", " << layout_name(args.b_layout) << ") do not match the kernel ("
                      << dtype_name(kDType) << ", " << layout_name(kLayout) << ")");
  Epi::check(epi, args.m, args.n, 2);

  GemmParams<Order, Ready, Epi> p{};
  p.a = detail::make_tensor_map(args.a, args.dtype, args.k, args.m, args.lda, 64, Shape::BM);
  p.b = kMajorB == device::Major::K ? detail::make_tensor_map(args.b, args.dtype, args.k, args.n, args.ldb, 64, Shape::BN)
                                    : detail::make_tensor_map(args.b, args.dtype, args.n, args.k, args.ldb, 64, 64);
  p.m = int(args.m);
  p.n = int(args.n);
  p.k = int(args.k);
  p.grid = make_tile_grid(args.m, args.n, Shape::BM, Shape::BN, cfg.group_m);
  p.order = order;
  p.ready = ready;
  p.epi = epi;

  const int64_t ctas_wanted = cfg.max_ctas > 0 ? cfg.max_ctas : device_sm_count();
  const int ctas = int(p.grid.tiles() < ctas_wanted ? p.grid.tiles() : ctas_wanted);
  constexpr int kSmem = SmemLayout<Shape>::kDynamicBytes;
  auto* kernel = &gemm_kernel<Shape, T, kMajorB, Order, Ready, Epi>;
  detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem);
  kernel<<<ctas, Shape::kThreads, kSmem, stream>>>(p);
  TF_CUDA(cudaGetLastError());
}

namespace detail {
template <int I, class Order, class Ready, class Epi>
bool launch_compiled(const GemmArgs& args, const GemmConfig& cfg, const typename Order::Params& order,
                     const typename Ready::Params& ready, const typename Epi::Params& epi, cudaStream_t stream) {
  constexpr CompiledTile kTile = kCompiledTiles[I];
  using Shape = TileShape<kTile.bm, kTile.bn, kTile.stages>;
  if (cfg.bm == kTile.bm && cfg.bn == kTile.bn && cfg.stages == kTile.stages) {
    const bool bf16 = args.dtype == DType::bf16;
    if (args.b_layout == BLayout::NK) {
      if (bf16) launch_gemm<Shape, __nv_bfloat16, device::Major::K, Order, Ready, Epi>(args, cfg, order, ready, epi, stream);
      else launch_gemm<Shape, __half, device::Major::K, Order, Ready, Epi>(args, cfg, order, ready, epi, stream);
      return true;
    }
    if constexpr (kTile.kn) {
      if (bf16) launch_gemm<Shape, __nv_bfloat16, device::Major::MN, Order, Ready, Epi>(args, cfg, order, ready, epi, stream);
      else launch_gemm<Shape, __half, device::Major::MN, Order, Ready, Epi>(args, cfg, order, ready, epi, stream);
      return true;
    }
  }
  if constexpr (I + 1 < int(std::size(kCompiledTiles)))
    return launch_compiled<I + 1, Order, Ready, Epi>(args, cfg, order, ready, epi, stream);
  return false;
}
}  // namespace detail

template <class Order, class Ready, class Epi>
void launch_gemm(const GemmArgs& args, const GemmConfig& cfg, const typename Order::Params& order,
                 const typename Ready::Params& ready, const typename Epi::Params& epi, cudaStream_t stream) {
  validate_inputs(args, cfg);  // names an unsupported config before anything is instantiated at run time
  const bool launched = detail::launch_compiled<0, Order, Ready, Epi>(args, cfg, order, ready, epi, stream);
  TF_REQUIRE(launched, Status::Internal, "config " << cfg.name() << " passed validation but has no kernel");
}

}  // namespace taxfree::gemm
