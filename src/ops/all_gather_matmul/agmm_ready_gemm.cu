// Our GEMM with the piece-wait A-ready policy (piece_ready.cuh), shared by push and fused-ce: the
// one translation unit that instantiates it (every compiled tile, both dtypes and B layouts).
#include <algorithm>

#include "agmm_internal.h"
#include "piece_ready.cuh"
#include "taxfree/ops/gemm_launch.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

void validate_policy_gemm(const gemm::GemmArgs& g, const gemm::GemmConfig& cfg, bool split_k_ok) {
  gemm::validate_inputs(g, cfg);
  gemm::StoreTo::check({g.c, g.ldc}, g.m, g.n, 2);
  TF_REQUIRE(split_k_ok || !cfg.splits_k(), Status::Internal,
             "a GEMM waiting for A pieces runs whole tiles, got " << cfg.name());
}

void enqueue_ready_gemm(const ReadyGemmLaunch& l, cudaStream_t s, gemm::GemmStep step) {
  PieceReady::Params ready;
  ready.flags = l.flags;
  ready.pieces = l.grid;
  ready.bm = l.config.bm;
  ready.k_blocks = int((l.gemm.k + 63) / 64);
  // Every CTA of an M cluster counts its own tile, the last cluster's second CTA too when M ends in
  // its first: the cluster grid's tiles times the cluster (not ceil(M / bm) m-blocks, which counts
  // one short there, so the launch's epoch would be published while tiles still wait for it).
  const int cluster = std::max(1, l.config.cluster_m);
  ready.tiles = uint32_t(
      gemm::make_tile_grid(l.gemm.m, l.gemm.n, l.config.bm * cluster, l.config.bn, l.config.group_m).tiles() * cluster);
  ready.present_source = l.present_source;
  ready.start_mask = piece_start_mask(l.grid);
  ready.k_first = l.first_k;
  ready.seq = l.seq;
  ready.fault = l.fault;
  ready.movers = l.movers;
  ready.mover_ctas = l.mover_ctas;
  gemm::launch_gemm<gemm::RotatedOrder, PieceReady, gemm::StoreTo>(l.gemm, l.config, gemm::RotatedOrder::Params{l.first_m},
                                                                  ready, {l.gemm.c, l.gemm.ldc}, s, step);
}

}  // namespace taxfree::agmm
