// The plain GEMM: default policies (grouped tile order, A always ready, store into C).
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_launch.cuh"

namespace taxfree::gemm {

void launch(const GemmArgs& args, const GemmConfig& cfg, cudaStream_t stream) {
  validate(args, cfg);
  launch_gemm<GroupedOrder, AlwaysReady, StoreTo>(args, cfg, {}, {}, {args.c, args.ldc}, stream);
}

void launch(const GemmArgs& args, cudaStream_t stream) {
  validate(args, GemmConfig{});  // shapes and pointers, before the SM-count query below
  launch(args, choose_gemm_config(args.m, args.n, args.k, args.dtype, args.b_layout, device_sm_count()), stream);
}

}  // namespace taxfree::gemm
