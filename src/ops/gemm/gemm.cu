// The plain GEMM: default policies (grouped tile order, A always ready, store into C).
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_launch.cuh"

namespace taxfree::gemm {
namespace {
void plain_gemm(const GemmArgs& args, const GemmConfig& cfg, cudaStream_t stream, GemmStep step) {
  validate(args, cfg);
  launch_gemm<GroupedOrder, AlwaysReady, StoreTo>(args, cfg, {}, {}, {args.c, args.ldc}, stream, step);
}

GemmConfig device_config(const GemmArgs& args) {
  validate(args, GemmConfig{});  // shapes and pointers, before the SM-count query below
  return choose_gemm_config(args.m, args.n, args.k, args.dtype, args.b_layout, device_sm_count());
}
}  // namespace

void launch(const GemmArgs& args, const GemmConfig& cfg, cudaStream_t stream) {
  plain_gemm(args, cfg, stream, GemmStep::launch);
}

void prepare(const GemmArgs& args, const GemmConfig& cfg, cudaStream_t stream) {
  plain_gemm(args, cfg, stream, GemmStep::prepare);
}

void launch(const GemmArgs& args, cudaStream_t stream) { launch(args, device_config(args), stream); }

void prepare(const GemmArgs& args, cudaStream_t stream) { prepare(args, device_config(args), stream); }

}  // namespace taxfree::gemm
