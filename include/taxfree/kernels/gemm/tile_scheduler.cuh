// Tile scheduling of the persistent GEMM: which output tile, and which K range of it, the u-th
// work unit is (host + device).
//
// Tiles are cluster tiles: kCluster CTAs side by side along M (BM * kCluster rows x BN columns);
// CTA r of a cluster computes m-block tile.m * kCluster + r. The persistent kernel runs
// min(units, resident clusters) clusters; cluster c takes units c, c + clusters, ... in order, and
// producer and consumers of every CTA of a cluster walk the same sequence.
//
// A tile-order policy maps an order index t in [0, tiles) to a tile; it must be a bijection (every
// tile exactly once). Policies:
//   GroupedOrder  L2-friendly rasterisation: groups of `group_m` consecutive m-blocks are swept
//                 column by column, so the CTAs running at once share a few A row panels and a
//                 few B column panels.
//   RotatedOrder  GroupedOrder with the m-blocks renumbered to start at `first_m` and wrap, so a
//                 rank can start on its own shard of A and then go to rank+1, rank+2, ...
//
// A WorkPlan cuts the ordered tiles into units: tiles [0, dp_tiles) of the order are one unit each
// (all K); the remaining tiles are cut into `splits` units along K, consecutive in the unit order
// so they run at once on neighbouring CTAs. Their fp32 partial sums are reduced by whichever unit
// of the tile finishes last (epilogue.cuh). dp_tiles = 0 is classic split-K (too few tiles to fill
// the GPU); dp_tiles = tiles - (tiles % clusters) splits only the tiles of the last, partial wave
// (the tail that would leave most SMs idle).
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

// One unit of work: K blocks [kb_begin, kb_end) of the tile at order index t. slot >= 0 numbers the
// split tiles (t - dp_tiles) for the split-K workspace; -1 for a whole tile.
struct WorkUnit {
  int64_t t;
  int64_t slot;
  int split;
  int kb_begin, kb_end;
};

struct WorkPlan {
  TileGrid grid;     // cluster tiles
  int k_blocks;      // ceil(K / 64)
  int splits;        // >= 1: K ranges per split tile
  int64_t dp_tiles;  // in [0, tiles]: leading tiles of the order that are not split
  TF_HOST_DEVICE int64_t units() const { return dp_tiles + (grid.tiles() - dp_tiles) * splits; }
  TF_HOST_DEVICE int64_t split_tiles() const { return grid.tiles() - dp_tiles; }
  // Split s of a tile gets k-blocks [s * k_blocks / splits, (s + 1) * k_blocks / splits): sizes differ
  // by at most one, and none is empty if splits <= k_blocks (the host caps splits; the kernel traps
  // on an empty range).
  TF_HOST_DEVICE WorkUnit unit(int64_t u) const {
    if (u < dp_tiles) return {u, -1, 0, 0, k_blocks};
    const int64_t v = u - dp_tiles, slot = v / splits;
    const int s = int(v - slot * splits);
    return {dp_tiles + slot, slot, s, int(int64_t(s) * k_blocks / splits), int(int64_t(s + 1) * k_blocks / splits)};
  }
};

// dp_tiles for a plan that splits only the last partial wave of `tiles` over `clusters` clusters
// (none when the tiles fill whole waves).
TF_HOST_DEVICE int64_t tail_dp_tiles(int64_t tiles, int64_t clusters) {
  return clusters <= 0 ? tiles : tiles - tiles % clusters;
}

// First m-block of `rank`'s shard when the M rows are split evenly over `world` ranks (rank r owns
// rows [r * M / world, (r + 1) * M / world)); the RotatedOrder start that visits it first.
TF_HOST_DEVICE int rank_first_m_block(int64_t m, int bm, int rank, int world) {
  return int(m * rank / world / bm);
}

}  // namespace taxfree::gemm
