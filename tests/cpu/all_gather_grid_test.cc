// all_gather_push_grid (no GPU): the push variant's protocol, blocks and chunk per size.
#include <gtest/gtest.h>

#include <cstdint>

#include "taxfree/ops/all_gather.h"

namespace taxfree {
namespace {

TEST(AllGatherPushGrid, ProtocolBlocksAndChunkPerSize) {
  AllGatherConfig c;
  c.threads = 512, c.max_blocks = 132, c.ll_max_bytes = 1 << 20;  // one resident block per SM of an H200
  // Low-latency up to ll_max_bytes: two 8-byte lines per thread, at least one block.
  AllGatherPushGrid g = all_gather_push_grid(c, 16);
  EXPECT_TRUE(g.low_latency);
  EXPECT_EQ(g.blocks, 1);
  g = all_gather_push_grid(c, 64 << 10);  // 8192 lines / 1024 per block
  EXPECT_TRUE(g.low_latency);
  EXPECT_EQ(g.blocks, 8);
  g = all_gather_push_grid(c, 1 << 20);  // 131072 lines: 128 blocks
  EXPECT_TRUE(g.low_latency);
  EXPECT_EQ(g.blocks, 128);
  // Direct above it: chunks of 512 threads x 8 x 16 B = 64 KiB, one block per chunk up to max_blocks.
  g = all_gather_push_grid(c, (1 << 20) + 16);
  EXPECT_FALSE(g.low_latency);
  EXPECT_EQ(g.chunk, uint64_t(64) << 10);
  EXPECT_EQ(g.blocks, 17);
  g = all_gather_push_grid(c, uint64_t(256) << 20);  // one wave: every block loops over its chunks
  EXPECT_EQ(g.blocks, 132);
  // Fewer threads: smaller chunks; max_blocks caps both protocols.
  c.threads = 128, c.max_blocks = 5;
  g = all_gather_push_grid(c, 3 << 20);
  EXPECT_EQ(g.chunk, uint64_t(16) << 10);
  EXPECT_EQ(g.blocks, 5);
  EXPECT_EQ(all_gather_push_grid(c, 64 << 10).blocks, 5);
  c.ll_max_bytes = 0;  // never low-latency
  EXPECT_FALSE(all_gather_push_grid(c, 16).low_latency);
}

}  // namespace
}  // namespace taxfree
