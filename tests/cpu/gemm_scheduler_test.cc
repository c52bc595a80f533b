// Tile orders and work plans of the persistent GEMM: every tile exactly once, for grouped and
// rank-rotated orders; every (tile, k-block) exactly once, for split-K plans; every row of C kept
// once under the overlapped last m-block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "expect_error.h"
#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_detail.h"
#include "taxfree/ops/gemm_tiles.h"

namespace taxfree::gemm {
namespace {

// Walks the work items exactly as the kernel does (CTA b takes b, b + ctas, ...) and counts visits.
template <class Order>
void expect_each_tile_once(const typename Order::Params& p, const TileGrid& g, int ctas) {
  std::vector<int> visits(size_t(g.tiles()), 0);
  for (int b = 0; b < ctas; ++b)
    for (int64_t t = b; t < g.tiles(); t += ctas) {
      const TileCoord c = Order::at(p, g, t);
      ASSERT_GE(c.m, 0);
      ASSERT_LT(c.m, g.m_blocks);
      ASSERT_GE(c.n, 0);
      ASSERT_LT(c.n, g.n_blocks);
      ++visits[size_t(c.m) * g.n_blocks + c.n];
    }
  for (size_t i = 0; i < visits.size(); ++i)
    ASSERT_EQ(visits[i], 1) << "tile m=" << i / g.n_blocks << " n=" << i % g.n_blocks << " of " << g.m_blocks << "x"
                            << g.n_blocks << " blocks, group_m=" << g.group_m;
}

const int64_t kMs[] = {1, 16, 64, 127, 128, 129, 512, 1000, 1024, 2048, 4096, 8192, 16384};
const int64_t kNs[] = {8, 64, 3584, 3592, 4096, 7168, 14336};
const int kGroups[] = {1, 3, 8, 16, 64};

TEST(GemmTileScheduler, GroupedOrderCoversEveryTileOnce) {
  for (const CompiledTile& t : kCompiledTiles)
    for (int64_t m : kMs)
      for (int64_t n : kNs)
        for (int g : kGroups) {
          const TileGrid grid = make_tile_grid(m, n, t.bm, t.bn, g);
          expect_each_tile_once<GroupedOrder>({}, grid, 132);
        }
}

TEST(GemmTileScheduler, RotatedOrderCoversEveryTileOnceForEveryRank) {
  for (int world = 1; world <= 8; ++world)
    for (int64_t m : kMs)
      for (int64_t n : {int64_t(64), int64_t(3592), int64_t(4096)})
        for (int g : {1, 8, 16})
          for (int rank = 0; rank < world; ++rank) {
            const TileGrid grid = make_tile_grid(m, n, 128, 256, g);
            const RotatedOrder::Params p{rank_first_m_block(m, 128, rank, world)};
            ASSERT_LT(p.first_m, grid.m_blocks);
            expect_each_tile_once<RotatedOrder>(p, grid, 132);
            expect_each_tile_once<RotatedOrder>(p, grid, 7);
          }
}

TEST(GemmTileScheduler, RotatedOrderStartsAtTheRanksShard) {
  // 4 ranks x 2048 rows, 128-row tiles: rank r's rows start at m-block 16 r; with group_m 8 the
  // first 8 x n_blocks work items are all in its shard, then the order moves on to rank r+1.
  const int64_t m = 8192, n = 4096;
  for (int rank = 0; rank < 4; ++rank) {
    const TileGrid grid = make_tile_grid(m, n, 128, 256, 8);
    const RotatedOrder::Params p{rank_first_m_block(m, 128, rank, 4)};
    EXPECT_EQ(p.first_m, 16 * rank);
    for (int64_t t = 0; t < 2 * 8 * grid.n_blocks; ++t) {
      const int m_block = RotatedOrder::at(p, grid, t).m;
      EXPECT_GE(m_block, 16 * rank) << "t=" << t;
      EXPECT_LT(m_block, 16 * rank + 16) << "t=" << t;
    }
    EXPECT_EQ(RotatedOrder::at(p, grid, 16 * grid.n_blocks).m, (16 * rank + 16) % 64);
  }
}

// The overlapped last m-block (overlapped_row0): every m-block of bm rows, pairs' CTAs past M
// included, loads bm rows inside A where M >= bm (no zero fill), starts no later than its own first
// row, and the rows it keeps (from its own first, below M) cover [0, M) exactly once.
TEST(GemmTileScheduler, OverlappedLastMBlockLoadsWholeTilesInsideAAndKeepsEachRowOnce) {
  for (int bm : {16, 32, 64, 128, 192})
    for (int64_t m : {1, 7, 63, 64, 65, 127, 128, 129, 136, 200, 257, 383, 448, 1000, 4099}) {
      const int m_blocks = int((m + bm - 1) / bm) + 1;  // one more: a pair's CTA wholly past M
      std::vector<int> kept(size_t(m), 0);
      for (int b = 0; b < m_blocks; ++b) {
        const int64_t own = int64_t(b) * bm, row0 = overlapped_row0(own, bm, m);
        EXPECT_LE(row0, own) << "bm " << bm << " M " << m << " m-block " << b;
        EXPECT_GE(row0, 0);
        if (m >= bm) EXPECT_LE(row0 + bm, m) << "bm " << bm << " M " << m << " m-block " << b << ": zero fill";
        else EXPECT_EQ(row0, 0);
        for (int64_t r = std::max(row0, own); r < std::min<int64_t>(row0 + bm, m); ++r) ++kept[size_t(r)];
      }
      EXPECT_EQ(std::count(kept.begin(), kept.end(), 1), m) << "bm " << bm << " M " << m;
    }
}

TEST(GemmTileScheduler, GroupedOrderSweepsGroupsColumnByColumn) {
  const TileGrid grid = make_tile_grid(1000, 1024, 128, 256, 4);  // 8 x 4 blocks
  ASSERT_EQ(grid.m_blocks, 8);
  ASSERT_EQ(grid.n_blocks, 4);
  const TileCoord first = GroupedOrder::at({}, grid, 0), second = GroupedOrder::at({}, grid, 1);
  const TileCoord fifth = GroupedOrder::at({}, grid, 4), group2 = GroupedOrder::at({}, grid, 16);
  EXPECT_EQ(first.m, 0);
  EXPECT_EQ(first.n, 0);
  EXPECT_EQ(second.m, 1);
  EXPECT_EQ(second.n, 0);
  EXPECT_EQ(fifth.m, 0);
  EXPECT_EQ(fifth.n, 1);
  EXPECT_EQ(group2.m, 4);
  EXPECT_EQ(group2.n, 0);
}


// Walks a plan as the kernel does (cluster c walks units c, c + clusters, ...) and checks that every
// (tile, k-block) is covered exactly once, every segment is non-empty, whole tiles come first, and
// the parts of a cut tile are numbered 0..parts-1 in K order, agree on `parts` and fit max_parts.
void expect_plan_covers(const WorkPlan& plan, int64_t clusters) {
  const int64_t tiles = plan.grid.tiles();
  std::vector<int> kb_visits(size_t(tiles) * size_t(plan.k_blocks), 0);
  std::vector<std::vector<std::pair<int, int>>> parts(size_t(plan.split_tiles()));  // (part, kb_begin)
  std::vector<int> part_counts(size_t(plan.split_tiles()), 0);
  for (int64_t c = 0; c < clusters; ++c)
    for (SegmentWalk walk(plan, c, clusters); !walk.done();) {
      const WorkSegment w = walk.get();
      walk.next(w);
      ASSERT_GE(w.t, 0);
      ASSERT_LT(w.t, tiles);
      ASSERT_LT(w.kb_begin, w.kb_end) << "empty segment of tile " << w.t;
      ASSERT_GE(w.kb_begin, 0);
      ASSERT_LE(w.kb_end, plan.k_blocks);
      for (int kb = w.kb_begin; kb < w.kb_end; ++kb) ++kb_visits[size_t(w.t) * plan.k_blocks + kb];
      if (w.t < plan.dp_tiles) {
        ASSERT_EQ(w.slot, -1);
        ASSERT_EQ(w.parts, 1);
        ASSERT_EQ(w.kb_end - w.kb_begin, plan.k_blocks);
      } else {
        ASSERT_EQ(w.slot, w.t - plan.dp_tiles);
        ASSERT_GE(w.part, 0);
        ASSERT_LT(w.part, w.parts);
        ASSERT_LE(w.parts, plan.max_parts);
        auto& seen = parts[size_t(w.slot)];
        ASSERT_TRUE(part_counts[size_t(w.slot)] == 0 || part_counts[size_t(w.slot)] == w.parts);
        part_counts[size_t(w.slot)] = w.parts;
        seen.push_back({w.part, w.kb_begin});
      }
    }
  for (size_t i = 0; i < kb_visits.size(); ++i)
    ASSERT_EQ(kb_visits[i], 1) << "tile " << i / plan.k_blocks << " k-block " << i % plan.k_blocks;
  for (size_t slot = 0; slot < parts.size(); ++slot) {
    auto seen = parts[slot];
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(int(seen.size()), part_counts[slot]) << "slot " << slot;
    for (size_t i = 0; i < seen.size(); ++i) {
      ASSERT_EQ(seen[i].first, int(i)) << "slot " << slot << ": parts not numbered 0..parts-1";
      if (i > 0) ASSERT_GT(seen[i].second, seen[i - 1].second) << "slot " << slot << ": parts not in K order";
    }
  }
}

TEST(GemmWorkPlan, EveryTileAndKBlockOnceForEverySplitConfig) {
  for (int cluster : {1, 2})
    for (int64_t m : {1, 64, 129, 1000, 4096})
      for (int64_t n : {64, 3592, 14336})
        for (int64_t k : {1, 64, 65, 200, 1001, 8192})
          for (int splits : {1, 2, 3, 7, 16, 64})
            for (SplitScope scope : {SplitScope::all, SplitScope::tail, SplitScope::stream})
              for (int64_t clusters : {1, 7, 66, 132}) {
                if (scope == SplitScope::stream && splits != 1) continue;
                GemmArgs a;
                a.m = m, a.n = n, a.k = k;
                GemmConfig cfg;
                cfg.bm = 128, cfg.bn = 128, cfg.cluster_m = cluster, cfg.splits = splits, cfg.split_scope = scope;
                cfg.group_m = 3;
                const WorkPlan plan = detail::make_work_plan(a, cfg, clusters);
                SCOPED_TRACE(testing::Message() << "M=" << m << " N=" << n << " K=" << k << " " << cfg.name()
                                                << " clusters=" << clusters);
                ASSERT_EQ(plan.grid.m_blocks, (m + 128 * cluster - 1) / (128 * cluster));
                ASSERT_LE(plan.sk_units, plan.sk_length());
                if (!cfg.splits_k()) ASSERT_EQ(plan.split_tiles(), 0);
                if (scope == SplitScope::all && splits > 1 && plan.k_blocks > 1)
                  ASSERT_EQ(plan.split_tiles(), plan.grid.tiles());
                if (scope == SplitScope::tail) ASSERT_LT(plan.split_tiles(), clusters);
                if (scope == SplitScope::stream) ASSERT_LT(plan.split_tiles(), 2 * clusters);
                if (plan.split_tiles() == 0) ASSERT_EQ(plan.sk_units, 0);
                expect_plan_covers(plan, std::min<int64_t>(plan.units(), clusters));
                const detail::WorkspaceNeed need = detail::workspace_need(plan, cfg);
                EXPECT_EQ(need.partial_bytes,
                          size_t(plan.split_tiles()) * cluster * plan.max_parts * 128 * 128 * sizeof(float));
                EXPECT_EQ(need.counters, size_t(plan.split_tiles()) * cluster * 2);
              }
}

TEST(GemmWorkPlan, SplitKCutsEveryTileInEqualParts) {
  GemmArgs a;
  a.m = 1, a.n = 3584, a.k = 8192;  // 56 tiles of 64 x 64, 128 k-blocks
  GemmConfig cfg;
  cfg.bm = 64, cfg.bn = 64, cfg.splits = 3;
  const WorkPlan plan = detail::make_work_plan(a, cfg, 132);
  EXPECT_EQ(plan.dp_tiles, 0);
  EXPECT_EQ(plan.units(), 56 * 3);
  EXPECT_EQ(plan.max_parts, 3);
  for (int64_t u = 0; u < plan.units(); ++u) {
    const WorkSegment w = plan.segment(u, plan.unit_begin(u));
    EXPECT_EQ(w.slot, u / 3);
    EXPECT_EQ(w.part, u % 3);
    EXPECT_EQ(w.kb_end - w.kb_begin, plan.unit_end(u) - plan.unit_begin(u)) << "a unit is one segment";
  }
  a.k = 128;  // 2 k-blocks: 3 splits are capped at 2
  EXPECT_EQ(detail::make_work_plan(a, cfg, 132).max_parts, 2);
}

// Every tile of a split-all plan is cut alike: 2^26 tiles (near the largest grid the scheduler's
// 64-bit range arithmetic takes) plan with the parts of a small grid. Planning is O(1) in the tiles
// (a walk over them took over a second at this size); that cost is the host(us) column of the gemm
// bench, not a clock read here. A grid whose range arithmetic would overflow 64 bits is refused, and
// the heuristic, which skips splitting many waves, picks a config that plans for the largest shapes
// validation accepts.
TEST(GemmWorkPlan, SplitAllPlansHugeGridsAtOnce) {
  GemmArgs a;
  a.m = a.n = int64_t(1) << 19, a.k = 8192;
  GemmConfig cfg;
  cfg.bm = 64, cfg.bn = 64;
  for (int s : {2, 3, 12}) {
    cfg.splits = s;
    const WorkPlan plan = detail::make_work_plan(a, cfg, 132);
    EXPECT_EQ(plan.grid.tiles(), int64_t(1) << 26);
    GemmArgs small = a;
    small.m = 1, small.n = 3584;
    EXPECT_EQ(plan.max_parts, detail::make_work_plan(small, cfg, 132).max_parts) << s << " splits";
    EXPECT_EQ(plan.split_tiles(), plan.grid.tiles());
  }
  a.m = a.n = (int64_t(1) << 31) - 1;
  test::expect_error([&] { detail::make_work_plan(a, cfg, 132); }, Status::InvalidArgument, "64-bit arithmetic");
  for (int64_t k : {int64_t(8192), (int64_t(1) << 31) - 1}) {
    const GemmConfig c = choose_gemm_config(a.m, a.n, k, DType::bf16, BLayout::nk);
    a.k = k;
    EXPECT_NO_THROW(detail::make_work_plan(a, c, 132)) << c.name();
  }
}

TEST(GemmWorkPlan, TailSplitLeavesWholeWavesWhole) {
  GemmArgs a;
  a.m = 2048, a.n = 7168, a.k = 8192;  // 16 x 28 = 448 tiles of 128 x 256: 3 waves of 132 + 52
  GemmConfig cfg;
  cfg.splits = 2, cfg.split_scope = SplitScope::tail;
  const WorkPlan plan = detail::make_work_plan(a, cfg, 132);
  EXPECT_EQ(plan.dp_tiles, 396);
  EXPECT_EQ(plan.units(), 396 + 52 * 2);
  EXPECT_EQ(plan.segment(396, plan.unit_begin(396)).kb_end, 64);
  EXPECT_EQ(plan.segment(397, plan.unit_begin(397)).kb_begin, 64);
  a.m = 12 * 128, a.n = 11 * 256;  // 132 tiles, exactly one wave: nothing to split
  EXPECT_EQ(detail::make_work_plan(a, cfg, 132).split_tiles(), 0);
}

TEST(GemmWorkPlan, StreamKGivesEveryClusterTheSameWork) {
  GemmArgs a;
  a.m = 2048, a.n = 7168, a.k = 8192;  // 448 tiles, 128 k-blocks each
  GemmConfig cfg;
  cfg.split_scope = SplitScope::stream;
  const WorkPlan plan = detail::make_work_plan(a, cfg, 132);
  EXPECT_EQ(plan.dp_tiles, 448 - 52 - 132);  // two whole waves, then 184 tiles in 132 ranges
  EXPECT_EQ(plan.sk_units, 132);
  EXPECT_LE(plan.max_parts, 3);
  for (int64_t c = 0; c < 132; ++c) {
    int64_t kbs = 0;
    for (SegmentWalk walk(plan, c, 132); !walk.done();) {
      const WorkSegment w = walk.get();
      walk.next(w);
      kbs += w.kb_end - w.kb_begin;
    }
    EXPECT_GE(kbs, 448 * 128 / 132) << "cluster " << c;
    EXPECT_LE(kbs, 448 * 128 / 132 + 1) << "cluster " << c;
  }
}

}  // namespace
}  // namespace taxfree::gemm
