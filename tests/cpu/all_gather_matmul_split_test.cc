// all_gather_matmul's ksplit and nsplit plans without a GPU, for 1 to 8 ranks: what they
// reject (naming it), nsplit's column blocks and partial buffer, the shard gather, ksplit's slices
// of each partial group, the skinny path's plan, inbox and heap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.h"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/runtime/error.h"

namespace taxfree {
namespace {

using test::expect_error;

const int kWorlds[] = {2, 3, 4, 5, 6, 7, 8};

// gather_dim 1 with B replicated on every rank: what ksplit and nsplit take.
AgmmArgs ksplit_args(int64_t m, int64_t n, int64_t k) {
  AgmmArgs a;
  a.m = m, a.n = n, a.k = k, a.gather_dim = 1, a.b_replicated = true;
  return a;
}

// ksplit and nsplit share their contract (gather_dim 1, B replicated, ksplit's capacity) and
// name themselves in the errors.
TEST(AgmmKsplit, KsplitAndNsplitRejectWhatTheyCannotRunNamingIt) {
  const AgmmConfig cfg;
  using Plan = std::function<void(const AgmmArgs&, const AgmmConfig&)>;
  const std::pair<const char*, Plan> plans[] = {
      {"ksplit", [](const AgmmArgs& a, const AgmmConfig& c) { make_ksplit_plan(a, 2, c, 132); }},
      {"nsplit", [](const AgmmArgs& a, const AgmmConfig& c) { make_nsplit_plan(a, 2, c, 132); }}};
  for (const auto& [name, plan] : plans) {
    SCOPED_TRACE(name);
    plan(ksplit_args(1024, 16384, 8192), cfg);  // at capacity: fine
    AgmmArgs a = ksplit_args(1024, 4096, 8192);
    a.gather_dim = 0;
    expect_error([&] { plan(a, cfg); }, Status::NotSupported, name);
    a = ksplit_args(64, 4096, 8192);
    a.b_replicated = false;
    expect_error([&] { plan(a, cfg); }, Status::InvalidArgument, "b_replicated");
    expect_error([&] { plan(ksplit_args(1025, 4096, 8192), cfg); }, Status::InvalidArgument, "ksplit_max_m=1024");
    expect_error([&] { plan(ksplit_args(64, 16385, 8192), cfg); }, Status::InvalidArgument, "ksplit_max_n=16384");
    AgmmConfig off;
    off.ksplit_max_m = 0;
    expect_error([&] { plan(ksplit_args(1, 4096, 8192), off); }, Status::InvalidArgument, "ksplit_max_m=0");
    expect_error([&] { plan(ksplit_args(1, 4096, 8200), cfg); }, Status::InvalidArgument, "divisible by 8");
  }
}

// Every column of C in exactly one rank's block, blocks in rank order, each starting on an
// 8-column (16-byte) boundary, for every world and N from 1 up (narrow N leaves ranks empty); the
// all-gather CTAs' rows cover M once, in order, with no CTA past what the GPU holds.
TEST(AgmmNsplit, BlocksCoverEveryColumnOnceForEveryWorld) {
  for (int w = 1; w <= 8; ++w)
    for (int64_t n : {1, 5, 8, 9, 17, 1003, 3584, 16384}) {
      const agmm::BlockGatherPlan p = make_nsplit_plan(ksplit_args(16, n, 8 * w), w, AgmmConfig{}, 132);
      const agmm::ColumnBlocks& b = p.blocks;
      int64_t next = 0;
      for (int r = 0; r < w; ++r) {
        EXPECT_EQ(b.begin(r), next) << "world " << w << " n " << n << " rank " << r;
        EXPECT_GE(b.cols(r), 0);
        if (b.cols(r) > 0) EXPECT_EQ(b.begin(r) % 8, 0) << "world " << w << " n " << n << " rank " << r;
        next += b.cols(r);
      }
      EXPECT_EQ(next, n) << "world " << w;
      EXPECT_LE(b.width, (n + w - 1) / w + 7) << "world " << w << " n " << n;  // balanced to 8 columns
    }
  for (int64_t m : {1, 5, 131, 132, 133, 1024}) {
    const agmm::BlockGatherPlan p = make_nsplit_plan(ksplit_args(m, 3584, 8192), 2, AgmmConfig{}, 132);
    EXPECT_GE(p.ctas, 1);
    EXPECT_LE(p.ctas, std::min<int64_t>(m, 132)) << "M=" << m;
    int64_t next = 0;
    for (int j = 0; j < p.ctas; ++j) {
      EXPECT_EQ(p.rows(j).begin, next) << "M=" << m << " CTA " << j;
      EXPECT_GT(p.rows(j).end, p.rows(j).begin) << "M=" << m << " CTA " << j;  // no idle CTA
      next = p.rows(j).end;
    }
    EXPECT_EQ(next, m);
  }
}

// nsplit's fp32 partial (device memory sized by nsplit_partial_floats) holds the widest block of
// every shape within the op's capacity, rows at the block's width as the launch lays them out.
TEST(AgmmNsplit, PartialHoldsEveryBlockWithinCapacity) {
  for (int w = 1; w <= 8; ++w)
    for (int64_t max_n : {16384, 1003}) {
      AgmmConfig cfg;
      cfg.ksplit_max_n = max_n;
      for (int64_t n : {int64_t(1), int64_t(9), int64_t(1003), max_n - 1, max_n}) {
        if (n > max_n) continue;
        const agmm::BlockGatherPlan p = make_nsplit_plan(ksplit_args(cfg.ksplit_max_m, n, 8 * w), w, cfg, 132);
        for (int r = 0; r < w; ++r) EXPECT_LE(p.blocks.cols(r), p.blocks.width);
        EXPECT_LE(p.m * p.blocks.width, nsplit_partial_floats(cfg, w)) << "world " << w << " n " << n;
      }
    }
  AgmmConfig off;
  off.ksplit_max_m = 0;
  EXPECT_EQ(nsplit_partial_floats(off, 2), 0);
}

// ksplit's side gather: 16 CTAs on a whole H100 / H200, an eighth of a smaller share (W ranks
// simulated on one GPU: their waiting grids fit together), never none; a configured width wins up
// to half the share. The exchange beside it takes the rest, so the two grids that wait for peers
// at once never exceed the share (audit of the thirty-seventh session: 144 CTAs on 132 SMs at W = 2).
TEST(AgmmKsplit, SideGatherScalesWithTheShare) {
  const AgmmConfig def;
  EXPECT_EQ(side_gather_ctas(def, 132), agmm::kSideGatherCtas);
  EXPECT_EQ(side_gather_ctas(def, 114), 14);
  EXPECT_EQ(side_gather_ctas(def, 64), 8);
  EXPECT_EQ(side_gather_ctas(def, 16), 2);
  EXPECT_EQ(side_gather_ctas(def, 7), 1);
  EXPECT_EQ(side_gather_ctas(def, 1), 1);
  AgmmConfig set;
  set.side_gather_ctas = 40;
  EXPECT_EQ(side_gather_ctas(set, 132), 40);
  EXPECT_EQ(side_gather_ctas(set, 16), 8);
  EXPECT_EQ(ksplit_exchange_sms(def, 132), 132 - agmm::kSideGatherCtas);
  for (const AgmmConfig& c : {def, set})
    for (int world : {2, 3, 4, 8})
      for (int sms : {132, 114, (132 - 4) / world}) {
        // The largest exchange the plan makes (M = 1024 x N = 1024: past one CTA per SM).
        const agmm::KsplitSlices sl = make_ksplit_plan(ksplit_args(1024, 1024, int64_t(world) * 4104), world, c,
                                                       ksplit_exchange_sms(c, sms));
        EXPECT_LE(sl.ctas + side_gather_ctas(c, sms), sms) << "W=" << world << " on " << sms << " SMs";
        EXPECT_GE(sl.ctas, sms / 2) << "W=" << world << " on " << sms << " SMs";
      }
}

// The A shards as a block all-gather (nsplit, and ksplit's side-stream gather on at most
// kSideGatherCtas SMs): rank r's shard at columns r * shard_cols, every row once, in order, no idle
// CTA, for every world.
TEST(AgmmKsplit, ShardGatherCoversEveryShardRowOnceForEveryWorld) {
  for (int w : kWorlds)
    for (int max_ctas : {agmm::kSideGatherCtas, 132})
      for (int64_t m : {1, 5, 15, 16, 17, 200, 511}) {
        const agmm::BlockGatherPlan p = agmm::shard_gather_plan(m, 4104, w, max_ctas);
        const std::string what = "world " + std::to_string(w) + " M=" + std::to_string(m);
        EXPECT_EQ(p.ctas, std::min<int64_t>(m, max_ctas)) << what;
        for (int r = 0; r < w; ++r) {
          EXPECT_EQ(p.blocks.begin(r), int64_t(r) * 4104) << what;
          EXPECT_EQ(p.blocks.cols(r), 4104) << what;
        }
        int64_t next = 0;
        for (int j = 0; j < p.ctas; ++j) {
          ASSERT_EQ(p.rows(j).begin, next) << what << " CTA " << j;
          ASSERT_GT(p.rows(j).end, p.rows(j).begin) << what << " CTA " << j;
          next = p.rows(j).end;
        }
        EXPECT_EQ(next, m) << what;
      }
}

// The default capacity fits the default heap (team.h: max(4, world + 2) GiB) beside the op's other
// buffers for every world the launcher runs, and disabling ksplit takes nothing.
TEST(AgmmKsplit, HeapAtTheDefaultsStaysSmallForEveryWorld) {
  for (int w : kWorlds) {
    const KsplitHeap h = ksplit_heap(AgmmConfig{}, w);
    EXPECT_EQ(h.partial_floats, 1024 * 16384);
    EXPECT_GE(h.bytes, (2 * w - 1) * h.partial_floats * 4);
    const int64_t heap = std::max<int64_t>(4, w + 2) << 30;
    EXPECT_LE(h.bytes, heap / 8) << "world " << w << ": " << h.bytes << " bytes";
  }
  AgmmConfig off;
  off.ksplit_max_n = 0;
  EXPECT_EQ(ksplit_heap(off, 2).bytes, 0);
}

// The exchange kernel's bookkeeping: CTA j's slices of the partial (8-float groups) and of A_shard
// (rows) tile both exactly, in order; receivers' slots and flags are distinct per source.
TEST(AgmmKsplit, SlicesCoverEachPartialGroupOnceForEveryWorld) {
  for (int w : kWorlds)
    for (int num_sms : {132, 7})
      for (auto [m, n] : {std::pair<int64_t, int64_t>{1, 3584}, {3, 1003}, {64, 1003}, {127, 3584}, {1000, 1003},
                          {1024, 3584}}) {
        const agmm::KsplitSlices sl = make_ksplit_plan(ksplit_args(m, n, int64_t(w) * 4104), w, AgmmConfig{}, num_sms);
        const std::string what = "world " + std::to_string(w) + " M=" + std::to_string(m) + " N=" + std::to_string(n);
        EXPECT_EQ(sl.world, w);
        EXPECT_EQ(sl.shard_cols, 4104) << what;
        EXPECT_TRUE(sl.ldp % 8 == 0 && sl.ldp >= n && sl.ldp < n + 8) << what;
        EXPECT_EQ(sl.groups() * 8, m * sl.ldp) << what;
        ASSERT_TRUE(sl.ctas >= 1 && sl.ctas <= num_sms) << what << ": " << sl.ctas << " CTAs";
        if (m == 1) EXPECT_EQ(sl.ctas, 1) << what << ": decode sizes need one CTA";
        if (m == 1024 && num_sms == 132) EXPECT_EQ(sl.ctas, 132) << what;
        int64_t groups = 0;
        for (int j = 0; j < sl.ctas; ++j) {
          const auto g = sl.partial_groups(j);
          ASSERT_EQ(g.begin, groups) << what << " CTA " << j;
          ASSERT_LE(g.begin, g.end);
          groups = g.end;
        }
        EXPECT_EQ(groups, sl.groups()) << what;
      }
  for (int w : kWorlds) {
    std::set<int64_t> flags;
    for (int s = 0; s < w; ++s)
      for (int j = 0; j < agmm::kKsplitMaxCtas; ++j) {
        const int64_t f = agmm::KsplitSlices::flag_index(s, j);
        ASSERT_TRUE(f >= 0 && f < int64_t(w) * agmm::kKsplitMaxCtas);
        ASSERT_TRUE(flags.insert(f).second);
      }
    std::set<int> want;
    for (int i = 0; i < w - 1; ++i) want.insert(i);
    for (int receiver = 0; receiver < w; ++receiver) {
      std::set<int> slots;
      for (int s = 0; s < w; ++s)
        if (s != receiver) slots.insert(agmm::KsplitSlices::slot(s, receiver));
      EXPECT_EQ(slots, want) << "world " << w << " receiver " << receiver;
    }
  }
}


// The skinny path's plan: slices of 32 columns cover N once, one CTA per slice up to the resident
// CTAs (then CTAs loop), MMA row tiles cover M, the A lines of the CTAs tile A_shard exactly, and
// every launch within the op's capacity fits the inbox ksplit_heap sized, for every world.
TEST(AgmmKsplitSkinny, PlanCoversTheShapeAndFitsTheInboxForEveryWorld) {
  for (int w : kWorlds) {
    AgmmConfig cfg;
    cfg.max_k = int64_t(w) * 4104;  // the launches' K: within the op's capacity
    for (int resident : {132, 264, 7})
      for (auto [m, n] : {std::pair<int64_t, int64_t>{1, 3584}, {3, 3592}, {16, 1000}, {17, 1003}, {31, 16384},
                          {32, 1}}) {
        const int64_t k = int64_t(w) * 4104;
        const agmm::KsplitSkinny p = make_ksplit_skinny_plan(ksplit_args(m, n, k), w, cfg, resident);
        const std::string what = "world " + std::to_string(w) + " M=" + std::to_string(m) + " N=" +
                                 std::to_string(n) + " resident " + std::to_string(resident);
        EXPECT_EQ(p.world, w);
        EXPECT_EQ(p.shard_cols, 4104) << what;
        EXPECT_TRUE(p.ldp % 8 == 0 && p.ldp >= n && p.ldp < n + 8) << what;
        EXPECT_EQ(p.slices, (n + 31) / 32) << what;
        EXPECT_EQ(p.ctas, std::min<int64_t>(p.slices, resident)) << what;
        EXPECT_EQ(p.m_tiles, m <= 16 ? 1 : 2) << what;
        if (m == 1 && n == 3584 && resident == 132) EXPECT_EQ(p.ctas, 112) << what;
        int64_t lines = 0;
        for (int j = 0; j < p.ctas; ++j) {
          const auto r = p.a_range(j);
          ASSERT_EQ(r.begin, lines) << what << " CTA " << j;
          ASSERT_LE(r.begin, r.end) << what;
          lines = r.end;
        }
        EXPECT_EQ(lines * 4, m * p.shard_cols) << what;
        EXPECT_EQ(p.partial_line(p.slices - 1, m - 1) + agmm::kSkinnyLinesPerRow, p.partial_lines()) << what;
        const KsplitHeap h = ksplit_heap(cfg, w);
        EXPECT_LE(p.partial_lines(), h.skinny_partial_lines) << what;
        EXPECT_LE(p.a_lines(), h.skinny_a_lines) << what;
      }
  }
}

// At the op's capacity the inbox still holds a launch (the largest M, N and K), with fewer
// ksplit rows than kSkinnyMaxM too; nothing when ksplit is off.
TEST(AgmmKsplitSkinny, HeapHoldsTheLargestLaunchForEveryWorld) {
  for (int w : kWorlds)
    for (int64_t max_m : {1024, 20}) {
      AgmmConfig cfg;
      cfg.ksplit_max_m = max_m;
      cfg.max_k = int64_t(w) * 4104;
      const int64_t m = std::min<int64_t>(max_m, agmm::kSkinnyMaxM);
      const agmm::KsplitSkinny p = make_ksplit_skinny_plan(ksplit_args(m, cfg.ksplit_max_n, cfg.max_k), w, cfg, 132);
      const KsplitHeap h = ksplit_heap(cfg, w);
      EXPECT_EQ(p.partial_lines(), h.skinny_partial_lines) << "world " << w << " max_m " << max_m;
      EXPECT_EQ(p.a_lines(), h.skinny_a_lines) << "world " << w << " max_m " << max_m;
      // The band path's flags: the largest launch under any non-swap tile (64 columns at least).
      for (int64_t bn : {64, 128, 256})
        EXPECT_LE((max_m + 63) / 64 * ((cfg.ksplit_max_n + bn - 1) / bn), h.band_flags) << "bn " << bn;
      const gemm::GemmConfig g = gemm::choose_gemm_config(max_m, cfg.ksplit_max_n, cfg.max_k / w, gemm::DType::bf16,
                                                          gemm::BLayout::nk, 132, gemm::KCuts::split,
                                                          gemm::SwapAB::never, gemm::EpilogueOutput::fp32);
      EXPECT_FALSE(g.swap_ab);
      EXPECT_GE(g.bn, 64);
      EXPECT_EQ(g.bn % 32, 0);  // a tile with the bands' fp32 epilogue compiled
      // Flags: two-kernel path (partial and sum flags per slice), nsplit's C all-gather, the side
      // gather (ready, CTAs), the bands.
      const int64_t flags = 2 * w * agmm::kKsplitMaxCtas + w * agmm::kKsplitMaxCtas +
                            (w + w * agmm::kKsplitMaxCtas) + w * h.band_flags;
      EXPECT_EQ(h.bytes, (1 + 2 * int64_t(w - 1)) * h.partial_floats * 4 + flags * 8 +
                             2 * int64_t(w - 1) * (h.skinny_partial_lines + h.skinny_a_lines) * 16);
    }
}

TEST(AgmmKsplitSkinny, RejectsWhatItCannotRunNamingIt) {
  const AgmmConfig cfg;
  expect_error([&] { make_ksplit_skinny_plan(ksplit_args(33, 3584, 8192), 2, cfg, 132); }, Status::InvalidArgument,
               "M=33");
  expect_error([&] { make_ksplit_skinny_plan(ksplit_args(8, 3584, 8192), 2, cfg, 0); }, Status::InvalidArgument,
               "resident_ctas=0");
  AgmmArgs a = ksplit_args(8, 3584, 8192);
  a.b_replicated = false;
  expect_error([&] { make_ksplit_skinny_plan(a, 2, cfg, 132); }, Status::InvalidArgument, "b_replicated");
  AgmmConfig off;
  off.ksplit_max_m = 0;
  expect_error([&] { make_ksplit_skinny_plan(ksplit_args(1, 3584, 8192), 2, off, 132); }, Status::InvalidArgument,
               "ksplit_max_m=0");
}

}  // namespace
}  // namespace taxfree
