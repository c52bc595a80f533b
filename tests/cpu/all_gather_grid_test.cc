// all_gather_push_grid (no GPU): the push variant's protocol, blocks and chunk per size.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "expect_error.h"
#include "taxfree/ops/all_gather.h"
#include "host_heap.h"

namespace taxfree {
namespace {

// The launch check mode's description names the push grid, which every rank must share.
TEST(AllGatherLaunchCheck, DescriptionNamesBytesAndPushGrid) {
  AllGatherConfig c;
  c.max_blocks = 132;
  EXPECT_EQ(describe_all_gather_launch(AllGatherVariant::nccl, 4096, c), "all_gather nccl bytes=4096");
  const std::string ll = describe_all_gather_launch(AllGatherVariant::push, 4096, c);
  EXPECT_NE(ll.find("all_gather push bytes=4096 low-latency"), std::string::npos) << ll;
  const std::string direct = describe_all_gather_launch(AllGatherVariant::push, 4 << 20, c);
  EXPECT_NE(direct.find(" direct blocks="), std::string::npos) << direct;
  AllGatherConfig fewer = c;
  fewer.max_blocks = 8;
  EXPECT_NE(direct, describe_all_gather_launch(AllGatherVariant::push, 4 << 20, fewer));
}

// ll_max_bytes sizes the staging lines (4 x world x it, in bytes): a value whose product would wrap
// is refused before anything is allocated (no GPU needed to get there).
TEST(AllGatherConfigCheck, HugeLowLatencyLimitIsRefused) {
  test::HostHeap host(0, 2);
  const RankShare share = host.share(132);
  AllGatherConfig c;
  c.ll_max_bytes = (uint64_t(1) << 62) + 16;  // 2 x 2 x it / 8 lines x 16 B wraps to 128 bytes
  test::expect_invalid([&] { AllGather op(share, c); }, "ll_max_bytes 4611686018427387920 must be a multiple of 16, at most 2^40");
  EXPECT_EQ(host.heap.used(), 0u) << "nothing allocated";
}

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

// Callers that own the flags (simulated ranks) reach the grid and the launch without the op's
// constructor: an unresolved max_blocks, more blocks than a sender's row of `arrived` holds, or
// threads the kernels do not take are refused before anything is enqueued (no GPU needed).
TEST(AllGatherPushGrid, ShapesOutsideTheLimitsAreRefused) {
  AllGatherConfig c;
  for (int blocks : {0, -1, AllGather::kMaxBlocks + 1}) {
    c.max_blocks = blocks;
    test::expect_invalid([&] { all_gather_push_grid(c, 4096); },
                         "all_gather_push_grid: config.max_blocks=" + std::to_string(blocks) + " must be in [1, 1024]");
  }
  c.max_blocks = 8, c.threads = 48;
  test::expect_invalid([&] { all_gather_push_grid(c, 4096); }, "all_gather_push_grid: threads=48 per block");
  AllGatherPushGrid g;
  g.blocks = AllGather::kMaxBlocks + 1;
  test::expect_invalid([&] { launch_all_gather_push({}, g, 512, nullptr); }, "launch_all_gather_push: blocks=1025");
  g.blocks = 4;
  test::expect_invalid([&] { launch_all_gather_push({}, g, 1024, nullptr); }, "launch_all_gather_push: threads=1024 per block");
  test::HostHeap host(0, 2);
  const RankShare share = host.share(132);
  AllGatherConfig negative;
  negative.max_blocks = -1;
  test::expect_invalid([&] { AllGather op(share, negative); }, "max_blocks -1 must be >= 0");
}

}  // namespace
}  // namespace taxfree
