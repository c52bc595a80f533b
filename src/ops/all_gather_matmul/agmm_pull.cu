// all_gather_matmul `pull`: our GEMM with the PullReady policy (pull_ready.cuh), the one
// translation unit that instantiates it (every compiled tile, both dtypes and B layouts).
#include "agmm_internal.h"
#include "pull_ready.cuh"
#include "taxfree/ops/gemm_launch.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

void enqueue_pull_gemm(const PullGemmLaunch& l, cudaStream_t s, gemm::GemmStep step) {
  TF_REQUIRE(l.source_unit >= 1 && (l.first_k == 0 || !l.config.splits_k()), Status::Internal,
             "pull's GEMM: source unit " << l.source_unit << ", k-loop start " << l.first_k << " with config "
                                         << l.config.name());
  PullReady::Params ready;
  int sources = 0;  // the world: rank q's gathered A for every q below it
  while (sources < kPullMaxWorld && l.sources[sources]) ++sources;
  TF_REQUIRE(sources >= 1, Status::Internal, "pull's GEMM without rank 0's gathered A");
  for (int q = 0; q < kPullMaxWorld; ++q) ready.a_bases[q] = l.sources[q];
  ready.sources = sources;
  ready.gather_dim = l.gather_dim;
  ready.source_unit = l.source_unit;
  ready.k_first = l.first_k;
  gemm::launch_gemm<gemm::RotatedOrder, PullReady, gemm::StoreTo>(l.gemm, l.config, gemm::RotatedOrder::Params{l.first_m},
                                                                 ready, {l.gemm.c, l.gemm.ldc}, s, step);
}

}  // namespace taxfree::agmm
