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
//                 (m-blocks of cluster tiles: rank_first_m_block(m, BM * kCluster, ...)).
//
// A WorkPlan cuts the ordered tiles into units. Tiles [0, dp_tiles) of the order are one unit each
// (all of K). The remaining "split" tiles, laid end to end as one line of k-blocks (tile after
// tile), are cut into sk_units equal contiguous ranges, one unit each; a range may end inside a
// tile and continue into the next, so a unit is one or more segments (a tile and a k-block
// range). Every tile cut between units has its fp32 partial sums reduced by whichever of its
// segments finishes last (epilogue.cuh). The host picks (ops/gemm.h: SplitScope):
//   split-K    dp_tiles = 0, sk_units = tiles * S: ranges align with tiles, S parts each;
//   tail       dp_tiles = tiles - r (r = tiles % clusters), sk_units = r * S;
//   stream-K   the last partial wave plus one full wave (or all tiles, under one wave) cut into
//              one range per cluster: every cluster gets the same number of k-blocks.
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

// The first row of A a CTA loads for the m-block starting at row `block_row0` of `bm` rows: that
// row, but for an m-block reaching past M (M >= bm), M - bm, so the tile overlaps the one before it
// and loads no zero fill. Then every CTA of a wave loads whole A tiles and keeps the full CTAs' pace
// on B: a last m-block of 64 rows or fewer ran ahead of its column and slowed the wave by up to
// 50% once B was over half the L2 (r327-r328: "drift", docs/notes/gemm-tuning.md). The rows before
// block_row0 are computed again and discarded: the epilogue writes rows >= block_row0 only, and
// a row of C depends on its own row of A only, so a Ready policy still waits for the m-block's own
// rows (the overlap may read rows being written: their results are never stored).
TF_HOST_DEVICE int64_t overlapped_row0(int64_t block_row0, int bm, int64_t m) {
  const int64_t last = m > bm ? m - bm : 0;
  return block_row0 < last ? block_row0 : last;
}

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

// One segment of a unit: K blocks [kb_begin, kb_end) of the tile at order index t. For a tile
// cut between units, slot = t - dp_tiles numbers it in the split-K workspace and this segment is
// part `part` (in K order) of `parts`; a whole tile has slot -1 and parts 1.
struct WorkSegment {
  int64_t t;
  int64_t slot;
  int part, parts;
  int kb_begin, kb_end;
};

struct WorkPlan {
  TileGrid grid;     // cluster tiles
  int k_blocks;      // ceil(K / 64)
  int64_t dp_tiles;  // in [0, tiles]: leading tiles of the order that run whole
  int64_t sk_units;  // ranges the other tiles are cut into; in [1, split k-blocks] if any
  int max_parts;     // most segments any split tile has (workspace partials per tile)

  TF_HOST_DEVICE int64_t units() const { return dp_tiles + sk_units; }
  TF_HOST_DEVICE int64_t split_tiles() const { return grid.tiles() - dp_tiles; }
  TF_HOST_DEVICE int64_t sk_length() const { return split_tiles() * k_blocks; }
  // Range v of the split k-block line: [sk_begin(v), sk_begin(v + 1)); sizes differ by at most one
  // and none is empty (sk_units <= sk_length).
  TF_HOST_DEVICE int64_t sk_begin(int64_t v) const { return v * sk_length() / sk_units; }
  // The range holding position `pos` of the line: the largest v with sk_begin(v) <= pos.
  TF_HOST_DEVICE int64_t sk_range_of(int64_t pos) const { return ((pos + 1) * sk_units - 1) / sk_length(); }
  // Where unit u's work starts and ends on the split line ([0, 0) for a whole tile or u >= units()).
  TF_HOST_DEVICE int64_t unit_begin(int64_t u) const {
    return u < dp_tiles || u >= units() ? 0 : sk_begin(u - dp_tiles);
  }
  TF_HOST_DEVICE int64_t unit_end(int64_t u) const { return u < dp_tiles || u >= units() ? 0 : sk_begin(u - dp_tiles + 1); }
  // The segment of unit u that starts at line position `pos` (unit_begin(u) <= pos < unit_end(u));
  // for a whole tile, its only segment (pos ignored). The next segment starts at pos + its length.
  TF_HOST_DEVICE WorkSegment segment(int64_t u, int64_t pos) const {
    if (u < dp_tiles) return {u, -1, 0, 1, 0, k_blocks};
    const int64_t slot = pos / k_blocks, tile_pos = slot * k_blocks;
    const int64_t first = sk_range_of(tile_pos), last = sk_range_of(tile_pos + k_blocks - 1);
    const int64_t end = unit_end(u) < tile_pos + k_blocks ? unit_end(u) : tile_pos + k_blocks;
    return {dp_tiles + slot, slot, int(u - dp_tiles - first), int(last - first + 1), int(pos - tile_pos),
            int(end - tile_pos)};
  }
};

// The segments of units first, first + step, ... in order: the sequence that producer and consumers
// of every CTA of cluster `first` walk (step = clusters).
struct SegmentWalk {
  const WorkPlan& plan;
  int64_t u, step, pos, end;
  TF_HOST_DEVICE SegmentWalk(const WorkPlan& p, int64_t first, int64_t stride)
      : plan(p), u(first), step(stride), pos(p.unit_begin(first)), end(p.unit_end(first)) {}
  TF_HOST_DEVICE bool done() const { return u >= plan.units(); }
  // The current segment; call next() with it to move on.
  TF_HOST_DEVICE WorkSegment get() const { return plan.segment(u, pos); }
  TF_HOST_DEVICE void next(const WorkSegment& w) {
    pos += w.kb_end - w.kb_begin;
    if (pos >= end) {
      u += step;
      pos = plan.unit_begin(u);
      end = plan.unit_end(u);
    }
  }
};

// First m-block of `rank`'s shard when the M rows are split evenly over `world` ranks (rank r owns
// rows [r * M / world, (r + 1) * M / world)); the RotatedOrder start that visits it first.
TF_HOST_DEVICE int rank_first_m_block(int64_t m, int bm, int rank, int world) {
  return int(m * rank / world / bm);
}

}  // namespace taxfree::gemm
