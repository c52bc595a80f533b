// Tile orders of the persistent GEMM: every tile exactly once, for grouped and rank-rotated orders.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "taxfree/kernels/gemm/tile_scheduler.cuh"
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
  for (int world : {1, 2, 3, 4, 8})
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

}  // namespace
}  // namespace taxfree::gemm
