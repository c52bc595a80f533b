// Tile scheduling of the persistent GEMM: which output tile the t-th work item is (host + device).
//
// The persistent kernel runs min(#tiles, #SMs) CTAs; CTA b takes work items b, b + gridDim.x, ...
// in order, and producer and consumers of a CTA walk the same sequence. A tile-order policy maps a
// work item t in [0, tiles) to a tile; it must be a bijection (every tile exactly once). Policies:
//   GroupedOrder  L2-friendly rasterisation: groups of `group_m` consecutive m-blocks are swept
//                 column by column, so the CTAs running at once share a few A row panels and a
//                 few B column panels.
//   RotatedOrder  GroupedOrder with the m-blocks renumbered to start at `first_m` and wrap, so a
//                 rank can start on its own shard of A and then go to rank+1, rank+2, ...
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define TF_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TF_HOST_DEVICE inline
#endif

namespace taxfree::gemm {

// Block indices of one output tile: rows [m * BM, m * BM + BM), columns [n * BN, n * BN + BN).
struct TileCoord {
  int m;
  int n;
};

struct TileGrid {
  int m_blocks;
  int n_blocks;
  int group_m;  // >= 1; m-blocks per rasterisation group
  TF_HOST_DEVICE int64_t tiles() const { return int64_t(m_blocks) * n_blocks; }
};

TF_HOST_DEVICE TileGrid make_tile_grid(int64_t m, int64_t n, int bm, int bn, int group_m) {
  return {int((m + bm - 1) / bm), int((n + bn - 1) / bn), group_m < 1 ? 1 : group_m};
}

struct GroupedOrder {
  struct Params {};
  TF_HOST_DEVICE static TileCoord at(const Params&, const TileGrid& g, int64_t t) {
    const int64_t per_group = int64_t(g.group_m) * g.n_blocks;
    const int64_t group = t / per_group;
    const int first_m = int(group * g.group_m);
    const int rows = g.m_blocks - first_m < g.group_m ? g.m_blocks - first_m : g.group_m;
    const int64_t in_group = t - group * per_group;
    return {first_m + int(in_group % rows), int(in_group / rows)};
  }
};

struct RotatedOrder {
  struct Params {
    int first_m = 0;  // in [0, m_blocks): the m-block visited first
  };
  TF_HOST_DEVICE static TileCoord at(const Params& p, const TileGrid& g, int64_t t) {
    TileCoord c = GroupedOrder::at({}, g, t);
    c.m = (c.m + p.first_m) % g.m_blocks;
    return c;
  }
};

// First m-block of `rank`'s shard when the M rows are split evenly over `world` ranks (rank r owns
// rows [r * M / world, (r + 1) * M / world)); the RotatedOrder start that visits it first.
TF_HOST_DEVICE int rank_first_m_block(int64_t m, int bm, int rank, int world) {
  return int(m * rank / world / bm);
}

}  // namespace taxfree::gemm
