// flash_decode across ranks, host logic (no GPU): the gather layout and buffer sizes for several
// world sizes, the workspace bound against every plan, validation messages, variant names, the
// fused schedule (simulated: no deadlock for any per-rank grids and splits), and the partition +
// gather layout + LSE combine against a direct softmax over the whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_seed.h"
#include "../../src/ops/flash_decode/reference.h"
#include "expect_error.h"
#include "taxfree/device/ll_line.cuh"
#include "taxfree/kernels/attention/fused_schedule.h"
#include "taxfree/kernels/attention/lse_combine.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"

namespace taxfree::flash_decode {
namespace {

namespace at = taxfree::attention;

using taxfree::test::expect_invalid;

FlashDecodeConfig config(int batch, int q_heads, int kv_heads, int head_dim = 128) {
  FlashDecodeConfig c;
  c.max_batch = batch, c.max_q_heads = q_heads, c.max_kv_heads = kv_heads, c.max_head_dim = head_dim;
  return c;
}

// The launch check mode's description: the shape and scale every rank must share, not the slices,
// lengths, layout or cache each rank has for itself; the default scale is the explicit 1/sqrt(d).
TEST(FlashDecodeLaunchCheck, DescriptionNamesTheSharedArgumentsOnly) {
  const FlashDecodeConfig c = config(8, 64, 8);
  DecodeArgs a;
  a.batch = 4, a.q_heads = 64, a.kv_heads = 8, a.head_dim = 128, a.capacity = 4096, a.max_len = 4096;
  DecodeArgs b = a;
  b.layout = KvLayout::paged_hnd, b.capacity = 0, b.page_size = 64, b.max_len = 17;
  b.softmax_scale = 1.f / std::sqrt(128.f);
  const std::string d = describe_flash_decode_launch(FlashDecodeVariant::fused, a, c, false);
  EXPECT_EQ(d, describe_flash_decode_launch(FlashDecodeVariant::fused, b, c, false));
  EXPECT_NE(d.find("flash_decode fused batch=4 heads=64/8 head_dim=128 bf16"), std::string::npos) << d;
  EXPECT_NE(d, describe_flash_decode_launch(FlashDecodeVariant::bsp, a, c, false));
  b.softmax_scale = 0.09f;
  EXPECT_NE(d, describe_flash_decode_launch(FlashDecodeVariant::fused, b, c, false));
  FlashDecodeConfig direct = c;
  direct.split_merge = FlashDecodeConfig::SplitMerge::direct;
  EXPECT_NE(d, describe_flash_decode_launch(FlashDecodeVariant::fused, a, direct, false));
  FlashDecodeConfig global = c;
  global.split_merge = FlashDecodeConfig::SplitMerge::global;  // each rank's own choice
  EXPECT_EQ(d, describe_flash_decode_launch(FlashDecodeVariant::fused, a, global, false));
  // Whether the launch merges directly follows the SM count (direct_merge_applies): ranks on GPUs
  // of different counts would take different layouts.
  EXPECT_NE(describe_flash_decode_launch(FlashDecodeVariant::fused, a, direct, true),
            describe_flash_decode_launch(FlashDecodeVariant::fused, a, direct, false));
  const FlashDecodeBuffers sizes = flash_decode_buffers(direct, 2, 132);
  EXPECT_TRUE(direct_merge_applies(sizes, 2, 16, 2, 64, 8, 128));  // 16 groups on 16 SMs
  EXPECT_FALSE(direct_merge_applies(sizes, 2, 15, 2, 64, 8, 128));
}

TEST(FlashDecodeDistPlan, GatherLayout) {
  for (int batch : {1, 3, 32})
    for (int q : {1, 8, 96})
      for (int d : {64, 128}) {
        const GatherLayout l = gather_layout(batch, q, d);
        EXPECT_EQ(l.rows, int64_t(batch) * q);
        EXPECT_EQ(l.lse_offset, l.rows * d);
        EXPECT_EQ(l.block_floats % 64, 0);  // 256-byte blocks: float4 and NCCL alignment
        EXPECT_GE(l.block_floats, l.rows * (d + 1));
        EXPECT_LT(l.block_floats, l.rows * (d + 1) + 64);
      }
  // The largest block: batch 32 x 64 heads x (128 + 1) floats = 1 MiB + 8 KiB.
  EXPECT_EQ(gather_layout(32, 64, 128).block_floats * 4, 32 * 64 * 129 * 4);
}

TEST(FlashDecodeDistPlan, BufferSizesForWorld2348) {
  const FlashDecodeConfig c = config(4, 96, 12);
  const int64_t block = 4 * 96 * 129 * 4;  // a multiple of 256 already
  for (int world = 2; world <= 8; ++world) {
    SCOPED_TRACE(world);
    const FlashDecodeBuffers b = flash_decode_buffers(c, world, 132);
    EXPECT_EQ(b.fused_parity_lines, uint64_t(world * 4 * 96 * 65));  // 128/2 + 1 lines a row
    EXPECT_EQ(b.fused_inbox_bytes, 2 * b.fused_parity_lines * 16);
    EXPECT_EQ(b.bsp_gather_bytes, uint64_t(world * block));
    EXPECT_GT(b.workspace_bytes, 0u);
  }
  // Forced single split: no workspace.
  FlashDecodeConfig one = c;
  one.num_splits = 1;
  EXPECT_EQ(flash_decode_buffers(one, 2, 132).workspace_bytes, 0u);
}

// Consecutive fused launches of different shapes use disjoint inbox lines (a sender may write its
// lines of e + 1 while a receiver still reads those of e), every launch stays inside the inbox, and
// e + 2 reuses e's parity from the same line. A base taken from the launch's own shape failed this
// (a small launch's parity 1 inside a large one's parity 0).
TEST(FlashDecodeDistPlan, FusedInboxParitiesNeverOverlapAcrossShapes) {
  const FlashDecodeConfig c = config(4, 96, 12);
  struct Shape {
    int64_t rows;
    int head_dim;
  };
  const Shape shapes[] = {{4 * 96, 128}, {1 * 96, 128}, {4 * 16, 128}, {3 * 8, 64}, {1, 64}, {4 * 96, 64}};
  for (int world = 2; world <= 8; ++world) {
    const FlashDecodeBuffers b = flash_decode_buffers(c, world, 132);
    const auto lines = int64_t(b.fused_parity_lines);
    for (uint64_t e : {1ull, 2ull, 7ull, (1ull << 32) + 3})
      for (const Shape& x : shapes)
        for (const Shape& y : shapes) {
          SCOPED_TRACE(testing::Message() << "world " << world << " epoch " << e << " rows " << x.rows << "/"
                                          << y.rows << " head_dim " << x.head_dim << "/" << y.head_dim);
          const at::LineSpan now = at::fused_inbox_span(e, lines, world, x.rows, x.head_dim);
          const at::LineSpan next = at::fused_inbox_span(e + 1, lines, world, y.rows, y.head_dim);
          EXPECT_TRUE(now.end <= next.begin || next.end <= now.begin);
          for (const at::LineSpan& s : {now, next}) {
            EXPECT_GE(s.begin, 0);
            EXPECT_LE(s.end * 16, int64_t(b.fused_inbox_bytes));
          }
          EXPECT_EQ(at::fused_inbox_span(e + 2, lines, world, y.rows, y.head_dim).begin, now.begin);
        }
  }
}

// The flag an LL line of epoch e carries (ll_line.cuh): a reader of parity e & 1 must not take a
// zeroed (never written) line or a stale one of the same parity (e - 2, e - 4, ...) for current,
// also past 2^32 launches, where uint32(e) was 0 at e = 2^32.
TEST(FlashDecodeDistPlan, LineFlagsAreNeverZeroAndDifferFromTheParitysEarlierEpochs) {
  constexpr uint64_t kPeriod = 0xffffffffull;
  const uint64_t epochs[] = {1, 2, 3, kPeriod - 1, kPeriod, kPeriod + 1, 1ull << 32, (1ull << 32) + 1,
                             2 * kPeriod, 1ull << 33, (1ull << 40) + 5, ~0ull - 1, ~0ull};
  for (uint64_t e : epochs) {
    SCOPED_TRACE(testing::Message() << "epoch " << e);
    EXPECT_NE(dev::ll_flag(e), 0u);
    for (uint64_t back = 1; back <= 64 && back <= e; ++back) EXPECT_NE(dev::ll_flag(e), dev::ll_flag(e - back));
    if (e >= kPeriod) EXPECT_EQ(dev::ll_flag(e), dev::ll_flag(e - kPeriod));  // the documented period
  }
  // The epochs launches carry (sequence_entered: the launch count mod 2^32, plus 1), across the
  // wrap where 2^32 is followed by 1: parities still alternate, and each flag is nonzero and
  // differs from those of its parity's earlier epochs in the window.
  std::vector<uint64_t> seq;
  for (uint64_t n = (1ull << 32) - 16; n < (1ull << 32) + 16; ++n) seq.push_back(n % (1ull << 32) + 1);
  for (size_t i = 0; i < seq.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "epoch " << seq[i]);
    EXPECT_NE(dev::ll_flag(seq[i]), 0u);
    if (i > 0) EXPECT_NE(seq[i] & 1, seq[i - 1] & 1);
    for (size_t j = i % 2; j < i; j += 2) EXPECT_NE(dev::ll_flag(seq[i]), dev::ll_flag(seq[j])) << "epoch " << seq[j];
  }
}

// The direct split merge's region: after the merged layout's in each parity, sized for 16 splits
// of min(max rows, 128) rows; a direct launch's lines (every sender, split < 16 and row of every
// shape within its limit) stay inside it, never meet the merged layout's lines of the same parity
// or any line of the other parity, and are distinct per (sender, split, row).
TEST(FlashDecodeDistPlan, DirectRegionHoldsEverySplitOfEveryDirectShape) {
  FlashDecodeConfig c = config(4, 96, 12);
  EXPECT_EQ(flash_decode_buffers(c, 2, 132).fused_direct_sender_lines, 0u) << "only when configured";
  c.split_merge = FlashDecodeConfig::SplitMerge::direct;
  struct Shape {
    int64_t rows;
    int head_dim;
  };
  const Shape shapes[] = {{128, 128}, {96, 128}, {16, 128}, {24, 64}, {1, 64}, {128, 64}};
  for (int world = 1; world <= 8; ++world) {
    const FlashDecodeBuffers b = flash_decode_buffers(c, world, 132);
    EXPECT_EQ(b.fused_direct_begin, uint64_t(world) * 4 * 96 * 65);
    EXPECT_EQ(b.fused_direct_rows, 128u);
    EXPECT_EQ(b.fused_direct_sender_lines, 16u * 128 * 65);
    EXPECT_EQ(b.fused_parity_lines, b.fused_direct_begin + world * b.fused_direct_sender_lines);
    EXPECT_EQ(b.fused_inbox_bytes, 2 * b.fused_parity_lines * 16);
    const auto parity = int64_t(b.fused_parity_lines), begin = int64_t(b.fused_direct_begin),
               sender = int64_t(b.fused_direct_sender_lines);
    for (uint64_t e : {1ull, 2ull, (1ull << 32) + 3})
      for (const Shape& x : shapes) {
        SCOPED_TRACE(testing::Message() << "world " << world << " epoch " << e << " rows " << x.rows << " head_dim "
                                        << x.head_dim);
        const int64_t row = at::ll_lines_per_row(x.head_dim), lo = int64_t(e & 1) * parity + begin;
        const at::LineSpan merged = at::fused_inbox_span(e, parity, world, 4 * 96, 128);
        EXPECT_LE(merged.end, lo) << "the merged layout's largest launch ends before the direct region";
        int64_t expect_next = lo;  // row-major in (sender, split, row): each row right after the last
        for (int p = 0; p < world; ++p)
          for (int s = 0; s < at::kMaxDirectSplits; ++s)
            for (int64_t r = 0; r < x.rows; ++r) {
              const int64_t l = at::direct_line(e, parity, begin, sender, x.rows, x.head_dim, p, s, r);
              if (r == 0 && s == 0) expect_next = lo + p * sender;  // each sender's block starts its own
              ASSERT_EQ(l, expect_next);
              expect_next = l + row;
              ASSERT_GE(l, lo);
              ASSERT_LE(l + row, int64_t(e & 1) * parity + parity);
              ASSERT_LE(l + row, lo + (p + 1) * sender) << "inside sender " << p << "'s block";
            }
      }
  }
  // A small op: 96 rows at most, so 16 x 96 rows per sender.
  const FlashDecodeBuffers small = flash_decode_buffers([&] {
    FlashDecodeConfig one = config(1, 96, 12);
    one.split_merge = FlashDecodeConfig::SplitMerge::direct;
    return one;
  }(), 2, 132);
  EXPECT_EQ(small.fused_direct_rows, 96u);
  EXPECT_EQ(small.fused_direct_sender_lines, 16u * 96 * 65);
}

// The direct merge's conditions: configured, rows within the op's direct rows, groups <= SMs,
// world <= 8, world x group within the shared-memory stage (80 rows at head_dim 128, 81 at 64).
TEST(FlashDecodeDistPlan, DirectMergeAppliesOnlyWithinItsLimits) {
  FlashDecodeConfig c = config(4, 96, 12);
  const FlashDecodeBuffers none = flash_decode_buffers(c, 2, 132);
  EXPECT_FALSE(direct_merge_applies(none, 2, 132, 1, 96, 12, 128)) << "not configured";
  c.split_merge = FlashDecodeConfig::SplitMerge::direct;
  const FlashDecodeBuffers b = flash_decode_buffers(c, 2, 132);
  EXPECT_TRUE(direct_merge_applies(b, 2, 132, 1, 96, 12, 128));
  EXPECT_FALSE(direct_merge_applies(b, 2, 132, 2, 96, 12, 128)) << "192 rows > 128";
  EXPECT_TRUE(direct_merge_applies(b, 2, 132, 2, 64, 8, 128)) << "128 rows";
  EXPECT_FALSE(direct_merge_applies(b, 2, 8, 1, 96, 12, 128)) << "12 groups > 8 SMs";
  EXPECT_TRUE(direct_merge_applies(b, 8, 132, 1, 96, 12, 128)) << "8 ranks x 8 heads = 64 staged rows";
  EXPECT_FALSE(direct_merge_applies(b, 9, 132, 1, 96, 12, 128)) << "9 ranks";
  EXPECT_TRUE(direct_merge_applies(b, 5, 132, 1, 16, 1, 128)) << "5 x 16 = 80 rows";
  EXPECT_FALSE(direct_merge_applies(b, 6, 132, 1, 16, 1, 128)) << "6 x 16 = 96 rows";
  EXPECT_TRUE(direct_merge_applies(b, 5, 132, 1, 16, 1, 64));
  EXPECT_EQ(at::direct_stage_rows(128), 80);
  EXPECT_EQ(at::direct_stage_rows(64), 81);
}

// Every plan a launch within the maxima can make fits the workspace sized at construction.
TEST(FlashDecodeDistPlan, WorkspaceBoundCoversEveryPlan) {
  for (int forced : {0, 3, 64})
    for (int sms : {1, 66, 132}) {
      FlashDecodeConfig c = config(16, 96, 12);
      c.num_splits = forced;
      const uint64_t bound = flash_decode_buffers(c, 2, sms).workspace_bytes;
      for (int batch : {1, 2, 7, 16})
        for (auto [q, kv] : std::vector<std::pair<int, int>>{{96, 12}, {16, 1}, {12, 12}, {96, 6}, {32, 2}})
          for (int d : {64, 128})
            for (int max_len : {0, 1, 300, 4096, 100000, 524288}) {
              // The plan from max_len, and from ragged lengths (host_slice_len given): the longest
              // and ever shorter ones.
              std::vector<int32_t> lens(static_cast<size_t>(batch));
              for (int b = 0; b < batch; ++b) lens[size_t(b)] = max_len >> (2 * b);
              for (int ragged : {0, 1}) {
                const int splits = forced           ? forced
                                   : ragged == 1 ? choose_splits(kv, lens, sms)
                                                 : choose_splits(batch, kv, max_len, sms);
                EXPECT_LE(decode_workspace_bytes(batch, q, kv, d, splits), bound)
                    << "forced=" << forced << " sms=" << sms << " batch=" << batch << " heads=" << q << "/" << kv
                    << " d=" << d << " max_len=" << max_len << " ragged=" << ragged << " splits=" << splits;
              }
            }
    }
}

TEST(FlashDecodeDistPlan, ConfigValidation) {
  EXPECT_NO_THROW(validate_flash_decode_config(config(1, 8, 1), 1));
  EXPECT_NO_THROW(validate_flash_decode_config(config(32, 64, 8), kMaxWorld));
  expect_invalid([] { validate_flash_decode_config(config(1, 8, 1), 0); }, "world=0");
  expect_invalid([] { validate_flash_decode_config(config(1, 8, 1), kMaxWorld + 1); }, "world=65");
  expect_invalid([] { validate_flash_decode_config(config(0, 8, 1), 2); }, "max_batch=0");
  expect_invalid([] { validate_flash_decode_config(config(1, 8, 0), 2); }, "max_kv_heads=0");
  expect_invalid([] { validate_flash_decode_config(config(1, 4, 8), 2); }, "max_q_heads=4");
  expect_invalid([] { validate_flash_decode_config(config(1, 8, 1, 96), 2); }, "max_head_dim=96");
  expect_invalid([] { validate_flash_decode_config(config(65535, 65535, 65535), 2); }, "max_batch*max_kv_heads=");
  FlashDecodeConfig c = config(1, 8, 1);
  c.num_splits = kMaxSplits + 1;
  expect_invalid([&] { validate_flash_decode_config(c, 2); }, "num_splits=65");
  c = config(1, 8, 1);
  c.bsp_buffers = BspBuffers(7);
  expect_invalid([&] { validate_flash_decode_config(c, 2); }, "bsp_buffers=7");
  c = config(1, 8, 1);
  c.split_merge = FlashDecodeConfig::SplitMerge(5);
  expect_invalid([&] { validate_flash_decode_config(c, 2); }, "split_merge=5");
  expect_invalid([&] { flash_decode_buffers(config(1, 8, 1), 2, 0); }, "num_sms=0");
}

template <class T = void>
T* fake(uintptr_t addr) {
  return reinterpret_cast<T*>(addr);
}

TEST(FlashDecodeDistPlan, ArgsValidation) {
  const FlashDecodeConfig c = config(4, 32, 4, 128);
  DecodeArgs a;
  a.batch = 3, a.q_heads = 32, a.kv_heads = 4, a.head_dim = 128;
  a.q = fake(0x10000000), a.k = fake(0x20000000), a.v = fake(0x30000000);  // apart: no overlap
  a.capacity = 256, a.max_len = 100;
  a.slice_len = fake<const int32_t>(0x50000000);
  a.out = fake(0x60000000);
  EXPECT_NO_THROW(validate_flash_decode_args(a, c));
  auto bad = [&](auto edit, const std::string& needle) {
    DecodeArgs b = a;
    edit(b);
    expect_invalid([&] { validate_flash_decode_args(b, c); }, needle);
  };
  bad([](DecodeArgs& b) { b.out = nullptr; }, "out is null");
  bad([](DecodeArgs& b) { b.o_part = fake<float>(0x70000); }, "o_part=0x70000 must be null");
  bad([](DecodeArgs& b) { b.lse_part = fake<float>(0x70000); }, "lse_part=0x70000 must be null");
  bad([](DecodeArgs& b) { b.batch = 5; }, "batch=5 exceeds this FlashDecode's max_batch=4");
  // Buffers packed for the op's largest batch: a larger batch is named as such, not as the
  // overlap its sizes would imply.
  const uintptr_t packed = 4 * 32 * 128 * 2;  // q, then out, for batch 4
  bad([&](DecodeArgs& b) { b.batch = 5, b.q = fake(0x10000000), b.out = fake(0x10000000 + packed); },
      "batch=5 exceeds this FlashDecode's max_batch=4");
  bad([](DecodeArgs& b) { b.q_heads = 64, b.kv_heads = 4; }, "q_heads=64 exceeds");
  bad([](DecodeArgs& b) { b.kv_heads = 8; }, "kv_heads=8 exceeds");
  bad([](DecodeArgs& b) { b.q = fake(0x10008); }, "q=0x10008 must be 16-byte aligned");  // the local checks too
  const FlashDecodeConfig small_d = config(4, 32, 4, 64);
  expect_invalid([&] { validate_flash_decode_args(a, small_d); }, "head_dim=128 exceeds this FlashDecode's max_head_dim=64");
}

TEST(FlashDecodeDistPlan, VariantNames) {
  EXPECT_EQ(parse_flash_decode_variant("bsp"), FlashDecodeVariant::bsp);
  EXPECT_EQ(parse_flash_decode_variant("fused"), FlashDecodeVariant::fused);
  EXPECT_STREQ(variant_name(FlashDecodeVariant::bsp), "bsp");
  EXPECT_STREQ(variant_name(FlashDecodeVariant::fused), "fused");
  expect_invalid([] { parse_flash_decode_variant("push"); }, "unknown flash_decode variant 'push'");
}

// ---- The fused schedule, simulated ------------------------------------------------------------
// Every rank runs the kernel's loop: CTA c starts with item c, and at each item takes the next
// ticket before working on the one it holds (dev::work_take: one counter per rank, items grid,
// grid + 1, ... handed out in index order to whichever CTA asks); a split beyond its sequence's effective
// count is skipped; the last split of a group to arrive pushes the group's partial to every rank
// and then waits for every rank's partial of the group. All CTAs are resident (fused_grid <=
// resident slots). A rank on the clustered schedule has one "CTA" per group (its cluster): it
// attends all its splits without waiting, pushes, then waits. A random scheduler steps any CTA
// that can move; the run must finish (no state where every unfinished CTA waits), every rank must
// combine every group exactly once, and every persistent CTA end holding exactly one ticket past
// the items (items - grid + grid tickets in all: what work_take's advance to the next launch
// counts on).
struct SimRank {
  bool clustered = false;           // clustered schedule: CTA c = the cluster of group c
  int splits;                       // num_splits of this rank's launch
  std::vector<int> effective;       // [group] effective splits (1..splits; 1 for an empty slice)
  int grid;
  int tickets = 0;                  // persistent: tickets taken (the work counter)
  std::vector<int> next;            // [cta] persistent: the item it holds; clustered: 0 / 1 done
  std::vector<int> waiting;         // [cta] group it waits on, or -1
  std::vector<int> arrived;         // [group] splits finished
  std::vector<char> pushed;         // [group]
  std::vector<int> combined;        // [group] combines done
};

bool simulate(std::mt19937& rng, int world, int groups, std::vector<SimRank>& ranks) {
  auto all_pushed = [&](int g) {
    for (const auto& r : ranks)
      if (!r.pushed[size_t(g)]) return false;
    return true;
  };
  for (;;) {
    std::vector<std::pair<int, int>> movable;  // (rank, cta)
    bool unfinished = false;
    for (int r = 0; r < world; ++r) {
      SimRank& s = ranks[size_t(r)];
      for (int c = 0; c < s.grid; ++c) {
        const bool done = s.waiting[size_t(c)] < 0 && s.next[size_t(c)] >= (s.clustered ? 1 : s.splits * groups);
        if (done && !s.clustered && s.next[size_t(c)] >= s.splits * groups + s.grid) return false;  // ticket past the count
        unfinished |= !done;
        if (!done && (s.waiting[size_t(c)] < 0 || all_pushed(s.waiting[size_t(c)]))) movable.emplace_back(r, c);
      }
    }
    if (!unfinished) return true;
    if (movable.empty()) return false;  // deadlock
    auto [r, c] = movable[std::uniform_int_distribution<size_t>(0, movable.size() - 1)(rng)];
    SimRank& s = ranks[size_t(r)];
    if (s.waiting[size_t(c)] >= 0) {  // the flags are all there: combine, move on
      ++s.combined[size_t(s.waiting[size_t(c)])];
      s.waiting[size_t(c)] = -1;
      continue;
    }
    if (s.clustered) {  // every split attended (no wait), the rows pushed, then the wait
      s.next[size_t(c)] = 1;
      s.pushed[size_t(c)] = 1;
      s.waiting[size_t(c)] = c;
      continue;
    }
    const int item = s.next[size_t(c)];
    s.next[size_t(c)] = s.tickets++;  // the next ticket, taken before this item's work
    const at::FusedItem it = at::fused_item(item, s.splits);
    if (it.split >= s.effective[size_t(it.group)]) continue;
    if (++s.arrived[size_t(it.group)] < s.effective[size_t(it.group)]) continue;
    s.pushed[size_t(it.group)] = 1;  // push before the wait (step 1 before step 2)
    s.waiting[size_t(c)] = it.group;
  }
}

TEST(FlashDecodeDistSchedule, NoDeadlockForAnyGridsAndSplits) {
  SCOPED_TRACE(test::seed_trace());
  std::mt19937 rng(test::cpu_test_seed());
  for (int trial = 0; trial < 1000; ++trial) {
    const int world = 1 + int(rng() % 8), groups = 1 + int(rng() % 12);
    std::vector<SimRank> ranks(static_cast<size_t>(world));
    for (auto& s : ranks) {
      s.clustered = rng() % 3 == 0;
      s.splits = 1 + int(rng() % 5);
      for (int g = 0; g < groups; ++g) s.effective.push_back(1 + int(rng() % s.splits));
      const int resident = 1 + int(rng() % (s.splits * groups + 3));  // small grids: long persistent loops
      s.grid = s.clustered ? groups : at::fused_grid(int64_t(s.splits) * groups, resident);
      s.next.resize(size_t(s.grid));
      for (int c = 0; c < s.grid; ++c) s.next[size_t(c)] = s.clustered ? 0 : c;  // CTA c starts with item c
      s.tickets = s.clustered ? 0 : s.grid;  // tickets hand out items grid, grid + 1, ...
      s.waiting.assign(size_t(s.grid), -1);
      s.arrived.assign(size_t(groups), 0);
      s.pushed.assign(size_t(groups), 0);
      s.combined.assign(size_t(groups), 0);
    }
    ASSERT_TRUE(simulate(rng, world, groups, ranks)) << "deadlock or miscount in trial " << trial;
    for (const auto& s : ranks) {
      for (int g = 0; g < groups; ++g) ASSERT_EQ(s.combined[size_t(g)], 1) << "trial " << trial << " group " << g;
      if (!s.clustered) EXPECT_EQ(s.tickets, s.splits * groups + s.grid) << "trial " << trial;
    }
  }
}

// The clustered schedule's row blocks: every row of a group in exactly one CTA's block, blocks
// contiguous and in CTA order, none larger than ceil(group / ctas), so each CTA's rows are one run
// of lines.
TEST(FlashDecodeDistSchedule, ClusterRowBlocksCoverEveryRowOnce) {
  for (int group = 1; group <= 16; ++group)
    for (int ctas = 2; ctas <= at::kMaxClusterCtas; ++ctas) {
      SCOPED_TRACE(testing::Message() << "group " << group << " ctas " << ctas);
      int next = 0;
      for (int k = 0; k < ctas; ++k) {
        const at::RowBlock b = at::cluster_rows(group, ctas, k);
        ASSERT_LE(b.begin, b.end);
        if (b.begin == b.end) continue;
        ASSERT_EQ(b.begin, next) << "CTA " << k;
        ASSERT_LE(b.end - b.begin, at::cluster_rows_per_cta(group, ctas));
        ASSERT_LE(at::cluster_rows_per_cta(group, ctas) * ctas, at::kClusterSlots) << "the inbox holds every slot";
        next = b.end;
      }
      EXPECT_EQ(next, group);
    }
  EXPECT_EQ(at::cluster_rows(8, 11, 7).begin, 7);  // 96/12 heads at 11 splits: one row per CTA
  EXPECT_EQ(at::cluster_rows(8, 11, 8).end - at::cluster_rows(8, 11, 8).begin, 0);
  EXPECT_EQ(at::cluster_rows(8, 2, 1).begin, 4);
}

TEST(FlashDecodeDistSchedule, GridNeverExceedsResidentSlots) {
  EXPECT_EQ(at::fused_grid(10, 264), 10);
  EXPECT_EQ(at::fused_grid(264, 264), 264);
  EXPECT_EQ(at::fused_grid(int64_t(64) * 512, 264), 264);
  EXPECT_EQ(at::fused_item(0, 3).group, 0);
  EXPECT_EQ(at::fused_item(7, 3).group, 2);
  EXPECT_EQ(at::fused_item(7, 3).split, 1);
}

// ---- Partition + gather layout + combine = direct softmax --------------------------------------
// Sequences dealt to `world` ranks by partition(); each rank's partial of every row rounded to fp32
// and written into its block of a gathered buffer (GatherLayout, as both variants lay it out);
// the combine reads it with the kernels' strides. Empty slices (lse = -inf) carry NaN in o.
TEST(FlashDecodeDistCombine, PartitionedPartialsThroughTheGatherLayoutMatchDirectSoftmax) {
  SCOPED_TRACE(test::seed_trace());
  std::mt19937 rng(test::cpu_test_seed() + 1);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int dim = 64, q_heads = 2;
  const std::vector<int32_t> lens = {12345, 1, 0, 3, 700};
  const int batch = int(lens.size());
  for (int world = 1; world <= 8; ++world) {
    SCOPED_TRACE(world);
    const GatherLayout l = gather_layout(batch, q_heads, dim);
    std::vector<float> gathered(size_t(world) * l.block_floats, std::numeric_limits<float>::quiet_NaN());
    const auto slices = partition(lens, world);
    std::vector<std::vector<double>> scores(size_t(l.rows)), values(size_t(l.rows));
    for (int64_t row = 0; row < l.rows; ++row) {
      const int b = int(row / q_heads);
      scores[size_t(row)].resize(size_t(lens[size_t(b)]));
      values[size_t(row)].resize(size_t(lens[size_t(b)]) * dim);
      for (auto& x : scores[size_t(row)]) x = 3 * nd(rng);
      for (auto& x : values[size_t(row)]) x = nd(rng);
      std::vector<double> o(static_cast<size_t>(dim));
      for (int r = 0; r < world; ++r) {
        const Slice s = slices[size_t(r)][size_t(b)];
        float* block = gathered.data() + size_t(r) * l.block_floats;
        const double lse = ref::direct(s.len(), dim, scores[size_t(row)].data() + s.start,
                                       values[size_t(row)].data() + int64_t(s.start) * dim, o.data());
        block[l.lse_offset + row] = float(lse);
        if (s.len() > 0)
          for (int d = 0; d < dim; ++d) block[row * dim + d] = float(o[size_t(d)]);
      }
    }
    std::vector<float> out(static_cast<size_t>(dim));
    std::vector<double> want(static_cast<size_t>(dim));
    for (int64_t row = 0; row < l.rows; ++row) {
      const int b = int(row / q_heads);
      const float lse = at::lse_combine(gathered.data() + row * dim, l.block_floats,
                                        gathered.data() + l.lse_offset + row, l.block_floats, world, dim, out.data());
      const double wl = ref::direct(lens[size_t(b)], dim, scores[size_t(row)].data(), values[size_t(row)].data(),
                                    want.data());
      if (lens[size_t(b)] == 0) {
        EXPECT_EQ(lse, -INFINITY) << "row " << row;
      } else {
        EXPECT_NEAR(lse, wl, 1e-5 * std::fabs(wl) + 1e-5) << "row " << row;
      }
      for (int d = 0; d < dim; ++d) EXPECT_NEAR(out[size_t(d)], want[size_t(d)], 1e-5) << "row " << row << " d " << d;
    }
  }
}

}  // namespace
}  // namespace taxfree::flash_decode
