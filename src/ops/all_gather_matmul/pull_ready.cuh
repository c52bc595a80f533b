// The GEMM's A policy of all_gather_matmul `pull` (kernels/gemm/policies.cuh, "A in several
// tensors"): the producer loads each A tile from the rank that holds it, through a tensor map of
// that rank's gathered A (its own shard's slot, read over NVLink), so no A byte is staged before
// the GEMM. Every shard is in place before the GEMM starts (a barrier on the stream, agmm_op.cc),
// so nothing waits here.
//
// A tile reads one source only: gather_dim 0 shards are whole m-blocks (source = m-block /
// source_unit), gather_dim 1 shards whole k-blocks (source = k-block / source_unit); make_pull_plan
// refuses other shapes. Whole tiles start their k-loop at this rank's own columns (gather_dim 1), so
// the ranks read different peers at the same time; split-K configs (small M: many CTAs per tile,
// few remote loads each, so their latency overlaps) start at 0.
#pragma once

#include <cuda.h>

#include "taxfree/kernels/gemm/tile_scheduler.cuh"  // TileCoord
#include "taxfree/ops/all_gather_matmul_plan.h"

namespace taxfree::agmm {

struct PullReady {
  static constexpr int kATensors = kPullMaxWorld;
  static constexpr bool kSplitKSafe = true;     // a_map depends on (tile, k-block) only, wait is empty
  static constexpr bool kLightProducer = true;  // one division per k-block
  struct Params {
    const void* a_bases[kATensors] = {};  // rank q's gathered A in this process (a peer address), q < world
    CUtensorMap a_maps[kATensors];        // built by launch_gemm from a_bases
    int sources = 1;                      // world: a_maps[0, sources) are built
    int gather_dim = 0;
    int source_unit = 1;  // m-blocks (gather_dim 0) or k-blocks (gather_dim 1) per shard
    int k_first = 0;      // first k-block of every tile's k-loop (0 with split-K)
  };

  // The rank whose gathered A holds the tile's A at k-block kb. A pair tile's second CTA past M (an
  // odd count of m-blocks, at an odd world) has m-block world * source_unit: no rank's. Any built
  // map serves it: it loads the last BM rows of A (gemm_kernel.cuh: a_row0) and the epilogue
  // writes none of its rows. r283: a_maps[world], never built, ended the kernel with an illegal
  // instruction (W = 5, M = 640).
  TF_HOST_DEVICE static int source(const Params& p, gemm::TileCoord tile, int kb) {
    const unsigned s = unsigned(p.gather_dim == 0 ? tile.m : kb) / unsigned(p.source_unit);
    const unsigned last = unsigned(p.sources - 1);
    return int(s < last ? s : last);
  }

#ifdef __CUDACC__
  __device__ static void wait(const Params&, gemm::TileCoord, int) {}
  __device__ static int first_k_block(const Params& p, gemm::TileCoord) { return p.k_first; }
  __device__ static const CUtensorMap* a_map(const Params& p, gemm::TileCoord tile, int kb) {
    return &p.a_maps[source(p, tile, kb)];
  }
#endif
};

}  // namespace taxfree::agmm
