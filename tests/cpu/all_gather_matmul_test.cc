// all_gather_matmul host logic without a GPU: shard shapes and the "divisible" errors, the piece
// grid and send order of the push variant for 2 to 8 ranks, the A-ready wait's mapping from
// (tile, k-block) to pieces, argument validation, variant names and the auto table (ksplit's and
// nsplit's plans: all_gather_matmul_split_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../../src/ops/all_gather_matmul/pull_ready.cuh"
#include "expect_error.h"
#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/runtime/error.h"

namespace taxfree {
namespace {

using test::expect_error;

const int kWorlds[] = {2, 3, 4, 5, 6, 7, 8};

TEST(AgmmShards, ShapesForEveryWorld) {
  for (int w : kWorlds) {
    const ShardShape r = agmm_shard_shape(int64_t(w) * 500, 1001, 0, w);
    EXPECT_EQ(r.rows, 500);
    EXPECT_EQ(r.cols, 1001);
    EXPECT_EQ(r.ld, 1008);  // 16-byte rows
    const ShardShape c = agmm_shard_shape(999, int64_t(w) * 504, 1, w);
    EXPECT_EQ(c.rows, 999);
    EXPECT_EQ(c.cols, 504);
    EXPECT_EQ(c.ld, int64_t(w) * 504);
  }
}

TEST(AgmmShards, ShapesThatCannotSplitNameDivisible) {
  expect_error([] { agmm_shard_shape(1001, 8192, 0, 2); }, Status::InvalidArgument, "divisible");
  expect_error([] { agmm_shard_shape(1024, 8192, 0, 3); }, Status::InvalidArgument, "divisible");
  expect_error([] { agmm_shard_shape(1026, 8192, 0, 4); }, Status::InvalidArgument, "divisible");
  expect_error([] { agmm_shard_shape(1020, 8192, 0, 8); }, Status::InvalidArgument, "divisible");
  expect_error([] { agmm_shard_shape(1024, 8200, 1, 4); }, Status::InvalidArgument, "divisible by 8");  // 2050 a rank
  expect_error([] { agmm_shard_shape(1024, 8196, 1, 8); }, Status::InvalidArgument, "divisible");
  expect_error([] { agmm_shard_shape(1024, 1001, 1, 2); }, Status::InvalidArgument, "divisible");
  expect_error([] { agmm_shard_shape(1024, 1000, 1, 2); }, Status::InvalidArgument, "divisible by 8");
  expect_error([] { agmm_shard_shape(1024, 8192, 2, 2); }, Status::InvalidArgument, "gather_dim");
  expect_error([] { agmm_shard_shape(0, 8192, 0, 2); }, Status::InvalidArgument, ">= 1");
}

// Small but awkward shapes: shards not multiples of the tile, K not a multiple of the k-block; each
// planned for a whole GPU's SMs and for a rank's share of one GPU shared by W simulated ranks
// (tests/gpu/simulated_ranks.h), where the GEMM's tile may differ.
struct GridCase {
  int64_t m, n, k;
  int gather_dim;
  int sms = 132;
};
std::vector<GridCase> grid_cases(int w) {
  const std::vector<GridCase> shapes = {{int64_t(w) * 500, 1000, 1001, 0}, {int64_t(w) * 64, 512, 640, 0},
                                        {int64_t(w) * 4096, 4096, 8192, 0}, {999, 1000, int64_t(w) * 504, 1},
                                        {1, 3584, int64_t(w) * 4096, 1},    {1024, 3584, 8192 / 2 * w, 1}};
  std::vector<GridCase> cases = shapes;
  for (GridCase c : shapes) c.sms = (132 - 4) / w, cases.push_back(c);
  return cases;
}

AgmmArgs args_for(const GridCase& c) {
  AgmmArgs a;
  a.m = c.m, a.n = c.n, a.k = c.k, a.gather_dim = c.gather_dim;
  return a;
}

TEST(AgmmPieces, EveryElementOfTheGatheredAInExactlyOnePieceOfItsSource) {
  for (int w : kWorlds)
    for (const GridCase& c : grid_cases(w))
      for (int64_t chunk : {int64_t(0), int64_t(64), int64_t(192)}) {
        if (c.m * c.k > 40'000'000) continue;
        AgmmConfig cfg;
        cfg.col_chunk = chunk;
        for (const agmm::PieceGrid& g : {make_push_plan(args_for(c), w, cfg, c.sms).grid,
                                         make_fused_ce_plan(args_for(c), w, c.sms).grid}) {
        std::vector<uint8_t> seen(size_t(c.m * c.k), 0);
        std::set<int64_t> flags;
        for (int s = 0; s < w; ++s)
          for (int64_t i = 0; i < g.row_chunks; ++i)
            for (int64_t j = 0; j < g.col_chunks; ++j) {
              const agmm::Piece p = g.piece(i, j);
              ASSERT_GT(p.rows, 0);
              ASSERT_GT(p.cols, 0);
              ASSERT_LE(p.r0 + p.rows, g.shard_rows);
              ASSERT_LE(p.c0 + p.cols, g.shard_cols);
              const int64_t f = g.flag_index(s, i, j);
              ASSERT_TRUE(f >= 0 && f < g.flags());
              ASSERT_TRUE(flags.insert(f).second) << "flag index used twice";
              for (int64_t r = 0; r < p.rows; ++r)
                for (int64_t cc = 0; cc < p.cols; ++cc) ++seen[size_t((g.row0(s) + p.r0 + r) * c.k + g.col0(s) + p.c0 + cc)];
            }
        ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](uint8_t v) { return v == 1; }))
            << "world " << w << " M=" << c.m << " K=" << c.k << " gd" << c.gather_dim;
        }
      }
}

// The GEMM's producer skips the piece walk on k-blocks with kb & piece_start_mask != 0: no piece of
// any source may start inside one of them, or its flag would never be waited for.
TEST(AgmmPieces, SkippedKBlocksStartNoPiece) {
  int aligned = 0;
  for (int w : kWorlds)
    for (const GridCase& c : grid_cases(w))
      for (int64_t chunk : {int64_t(0), int64_t(64), int64_t(192), int64_t(512), int64_t(1024)}) {
        AgmmConfig cfg;
        cfg.col_chunk = chunk;
        for (const agmm::PieceGrid& g : {make_push_plan(args_for(c), w, cfg, c.sms).grid,
                                         make_fused_ce_plan(args_for(c), w, c.sms).grid}) {
        const int mask = agmm::piece_start_mask(g);
        aligned += mask != 0;
        std::set<int64_t> starts;  // first columns of every piece of every source
        for (int s = 0; s < w; ++s)
          for (int64_t j = 0; j < g.col_chunks; ++j) starts.insert(g.col0(s) + g.piece(0, j).c0);
        for (int64_t kb = 0; kb * 64 < c.k; ++kb) {
          const bool starts_here = starts.lower_bound(kb * 64) != starts.end() && *starts.lower_bound(kb * 64) < kb * 64 + 64;
          if (kb & mask) ASSERT_FALSE(starts_here) << "world " << w << " M=" << c.m << " K=" << c.k << " gd" << c.gather_dim
                                                   << " col_chunk " << g.col_chunk << ": kb " << kb << " skipped";
        }
        }
      }
  EXPECT_GT(aligned, 0) << "no grid could skip any k-block";
}

// fused-ce's gather_dim 1 GEMM starts each tile's k-loop at first_k_block and wraps around. The
// producer waits only at k-blocks where for_each_piece meets a piece: every piece under a tile
// must be met before (or at) the first k-block of the rotated order that reads any of its columns,
// except this rank's own (in place before the GEMM), and exactly once.
TEST(AgmmPieces, RotatedKLoopMeetsEveryPieceBeforeReadingIt) {
  int rotated = 0;
  for (int w : kWorlds)
    for (const GridCase& c : grid_cases(w))  // 2^32 + 64: wider than any shard, and than 32 bits
      for (int64_t chunk : {int64_t(0), int64_t(64), int64_t(192), (int64_t(1) << 32) + 64}) {
        AgmmConfig cfg;
        cfg.col_chunk = chunk;
        for (const agmm::PieceGrid& g : {make_push_plan(args_for(c), w, cfg, c.sms).grid,
                                         make_fused_ce_plan(args_for(c), w, c.sms).grid})
          for (int rank = 0; rank < w; ++rank) {
            const int64_t kbs = (c.k + 63) / 64;
            const int first = agmm::first_k_block(g, rank);
            ASSERT_TRUE(first >= 0 && first < kbs);
            rotated += first != 0;
            if (c.gather_dim == 1 && g.shard_cols % 64 == 0 && g.col_chunk % 64 == 0)
              ASSERT_EQ(first * 64, rank * g.shard_cols) << "gather_dim 1 starts at this rank's own columns";
            const int64_t r_hi = std::min<int64_t>(128, c.m);  // one tile's rows: the first m-block
            std::set<int64_t> met;
            for (int64_t i = 0; i < kbs; ++i) {
              const int64_t kb = (i + first) % kbs, c_lo = kb * 64, c_hi = std::min(c_lo + 64, c.k);
              agmm::for_each_piece(g, 0, r_hi, c_lo, c_hi,
                                   [&](int, int64_t f) { ASSERT_TRUE(met.insert(f).second) << "piece met twice"; });
              // Every piece this k-block reads (any source but this rank) has been met by now.
              for (int s = 0; s < w; ++s)
                for (int64_t pi = 0; pi < g.row_chunks; ++pi)
                  for (int64_t pj = 0; pj < g.col_chunks; ++pj) {
                    const agmm::Piece p = g.piece(pi, pj);
                    const int64_t r0 = g.row0(s) + p.r0, c0 = g.col0(s) + p.c0;
                    const bool reads = r0 < r_hi && r0 + p.rows > 0 && c0 < c_hi && c0 + p.cols > c_lo;
                    if (reads && s != rank)
                      ASSERT_TRUE(met.count(g.flag_index(s, pi, pj)))
                          << "world " << w << " rank " << rank << " M=" << c.m << " K=" << c.k << " gd" << c.gather_dim
                          << " col_chunk " << g.col_chunk << ": k-block " << kb << " (first " << first
                          << ") reads source " << s << " piece (" << pi << ", " << pj << ") before waiting for it";
                  }
            }
          }
      }
  EXPECT_GT(rotated, 0) << "no grid rotated its k-loop";
}

TEST(AgmmPieces, SendOrderIsABijectionAndPeersGoRankMinusOneFirst) {
  for (int w : kWorlds)
    for (const GridCase& c : grid_cases(w)) {
      const agmm::PieceGrid g = make_push_plan(args_for(c), w, AgmmConfig{}, c.sms).grid;
      std::set<std::pair<int64_t, int64_t>> pieces;
      for (int64_t t = 0; t < g.pieces(); ++t) {
        const agmm::Piece p = g.piece_in_order(t);
        ASSERT_TRUE(p.i >= 0 && p.i < g.row_chunks && p.j >= 0 && p.j < g.col_chunks);
        ASSERT_TRUE(pieces.insert({p.i, p.j}).second);
      }
      for (int rank = 0; rank < w; ++rank)
        for (bool local : {false, true}) {
          std::set<std::pair<int, int64_t>> items;
          std::vector<int> first_seen;
          std::vector<int64_t> last_t(size_t(w), -1);
          for (int64_t x = 0; x < agmm::push_items(g, local); ++x) {
            const agmm::PushItem it = agmm::push_item(g, rank, local, x);
            ASSERT_TRUE(it.target >= 0 && it.target < w);
            ASSERT_TRUE(local || it.target != rank);
            ASSERT_TRUE(items.insert({it.target, it.t}).second);
            ASSERT_EQ(it.t, last_t[size_t(it.target)] + 1) << "each target gets the pieces in send order";
            last_t[size_t(it.target)] = it.t;
            if (std::find(first_seen.begin(), first_seen.end(), it.target) == first_seen.end())
              first_seen.push_back(it.target);
          }
          ASSERT_EQ(int64_t(items.size()), (w - 1 + (local ? 1 : 0)) * g.pieces());
          std::vector<int> want;
          if (local) want.push_back(rank);
          for (int i = 1; i < w; ++i) want.push_back((rank - i + w) % w);
          EXPECT_EQ(first_seen, want) << "world " << w << " rank " << rank;
          // gather_dim 0: the local copy and rank-1 share the head, the others follow one by one.
          if (c.gather_dim == 0 && w > 2) {
            const int64_t head = (local ? 2 : 1) * g.pieces();
            EXPECT_EQ(agmm::push_item(g, rank, local, head).target, (rank - 2 + w) % w);
          }
        }
    }
}

// The GEMM producer walks each tile's k-blocks in order; over one tile it must wait for every piece
// under the tile's rows exactly once, and for nothing else.
TEST(AgmmPieces, ReadyWaitVisitsEachPieceUnderATileOnce) {
  for (int w : kWorlds)
    for (const GridCase& c : grid_cases(w))
      for (int bm : {64, 128}) {
        AgmmConfig cfg;
        const agmm::PieceGrid g = make_push_plan(args_for(c), w, cfg, c.sms).grid;
        for (int64_t r_lo = 0; r_lo < c.m; r_lo += bm) {
          const int64_t r_hi = std::min(c.m, r_lo + bm);
          std::vector<int> visits(size_t(g.flags()), 0);
          for (int64_t kb = 0; kb * 64 < c.k; ++kb)
            agmm::for_each_piece(g, r_lo, r_hi, kb * 64, std::min(c.k, kb * 64 + 64), [&](int s, int64_t f) {
              ASSERT_EQ(f / g.pieces(), s);
              ++visits[size_t(f)];
            });
          for (int s = 0; s < w; ++s)
            for (int64_t i = 0; i < g.row_chunks; ++i)
              for (int64_t j = 0; j < g.col_chunks; ++j) {
                const agmm::Piece p = g.piece(i, j);
                const int64_t pr0 = g.row0(s) + p.r0;
                const bool under = pr0 < r_hi && pr0 + p.rows > r_lo;
                ASSERT_EQ(visits[size_t(g.flag_index(s, i, j))], under ? 1 : 0)
                    << "world " << w << " M=" << c.m << " K=" << c.k << " gd" << c.gather_dim << " rows [" << r_lo
                    << ", " << r_hi << ") piece (" << s << ", " << i << ", " << j << ")";
              }
        }
      }
}

TEST(AgmmPlan, PushLeavesTheGemmItsWavesAndNamesItsSms) {
  AgmmArgs a = args_for({8192, 4096, 8192, 0});
  const PushPlan p = make_push_plan(a, 2, AgmmConfig{}, 132);
  EXPECT_GE(p.push_ctas, 4);
  EXPECT_LE(p.push_ctas, 16);
  EXPECT_EQ(p.gemm.max_ctas, 132 - p.push_ctas);
  a = args_for({2, 3584, 8192, 1});
  EXPECT_EQ(make_push_plan(a, 2, AgmmConfig{}, 132).push_ctas, 16);  // a few tiles: SMs to spare
  AgmmConfig cfg;
  cfg.push_ctas = 132;
  expect_error([&] { make_push_plan(a, 2, cfg, 132); }, Status::InvalidArgument, "push_ctas");
  // One SM left, or a share of 5: the GEMM's config is one the SMs it gets can launch (no
  // 2-CTA cluster on one SM), for push and sm-specialized alike.
  for (const auto& [asked, sms] : {std::pair{131, 132}, std::pair{0, 5}, std::pair{63, 66}}) {
    cfg.push_ctas = asked;
    for (const AgmmArgs& b : {a, args_for({8192, 4096, 8192, 0})})
      for (const PushPlan& q : {make_push_plan(b, 2, cfg, sms), make_sm_specialized_plan(b, 2, cfg, sms)})
        EXPECT_GE(q.gemm.max_ctas, q.gemm.cluster_m * q.gemm.cluster_k)
            << q.gemm.name() << " push_ctas=" << asked << " of " << sms << " SMs";
  }
  cfg.push_ctas = 0;
  cfg.col_chunk = 100;
  expect_error([&] { make_push_plan(a, 2, cfg, 132); }, Status::InvalidArgument, "multiple of 64");
}

// The constructor's config checks, callable without a GPU (the bench runs them before any rank
// starts): each field out of its range named with its value; the edges of each range accepted.
TEST(AgmmConfigCheck, NamesTheFieldOutOfRange) {
  EXPECT_NO_THROW(validate_agmm_config(AgmmConfig{}));
  const auto bad = [](auto set, const std::string& needle) {
    AgmmConfig c;
    set(c);
    expect_error([&] { validate_agmm_config(c); }, Status::InvalidArgument, needle);
  };
  bad([](AgmmConfig& c) { c.max_m = 0; }, "capacity max_m=0");
  bad([](AgmmConfig& c) { c.max_k = -5; }, "max_k=-5 must be >= 1");
  bad([](AgmmConfig& c) { c.push_ctas = -1; }, "push_ctas=-1 must be >= 0");
  bad([](AgmmConfig& c) { c.col_chunk = 100; }, "col_chunk=100 must be a non-negative multiple of 64");
  bad([](AgmmConfig& c) { c.col_chunk = -64; }, "col_chunk=-64 must be a non-negative multiple of 64");
  bad([](AgmmConfig& c) { c.side_gather_ctas = agmm::kKsplitMaxCtas + 1; }, "side_gather_ctas=1025 must be in [0, 1024]");
  bad([](AgmmConfig& c) { c.ksplit_max_n = int64_t(1) << 31; }, "ksplit_max_n=2147483648 must be in [0, 2^31)");
  AgmmConfig edge;
  edge.col_chunk = (int64_t(1) << 32) + 64, edge.side_gather_ctas = agmm::kKsplitMaxCtas, edge.ksplit_max_m = 0;
  EXPECT_NO_THROW(validate_agmm_config(edge));
}

// The op sizes its piece flags by push_flag_capacity at construction; every plan within the
// capacity must fit them (else its launches fail with Internal): small M, where the GEMM may take
// a swap-AB tile of 16 or 32 rows, and the narrowest column chunk a config may ask for included.
TEST(AgmmPlan, PieceFlagsFitTheCapacityForEveryShapeAndColumnChunk) {
  for (int w : kWorlds)
    for (int64_t m : {int64_t(w), int64_t(2 * w), int64_t(16 * w), int64_t(24 * w), int64_t(48 * w), int64_t(64 * w),
                      int64_t(96 * w), int64_t(200 * w), int64_t(1024 * w)})
      for (int gd : {0, 1})
        for (int64_t col_chunk : {0, 64, 128, 512})
          for (int sms : {16, 132}) {
            const int64_t k = int64_t(w) * 1024;  // divisible by the world (gather_dim 1)
            const AgmmArgs a = args_for({m, 3584, k, gd});
            AgmmConfig cfg;
            cfg.col_chunk = col_chunk;
            for (const PushPlan& p : {make_push_plan(a, w, cfg, sms), make_sm_specialized_plan(a, w, cfg, sms)})
              EXPECT_LE(p.grid.flags(), push_flag_capacity(m, k, w))
                  << "world " << w << " M=" << m << " gd" << gd << " col_chunk " << col_chunk << " sms " << sms << " "
                  << p.gemm.name() << " row_chunk " << p.grid.row_chunk;
          }
}

// The waiting GEMM's tile order (push, sm-specialized, fused-ce) at gather_dim 0: its first tile
// holds this rank's first shard row, counted in the cluster tiles the GEMM's order walks (2 x 128
// rows for the large-M configs), and its first rasterisation group stays inside the shard.
TEST(AgmmPlan, WaitingGemmStartsOnItsOwnShardInClusterTiles) {
  for (int w : kWorlds) {
    std::vector<GridCase> cases = grid_cases(w);
    cases.push_back({int64_t(w) * 1024, 4096, 8192, 0});
    for (const GridCase& c : cases) {
      if (c.gather_dim != 0) continue;
      const AgmmArgs a = args_for(c);
      for (const gemm::GemmConfig& cfg : {make_push_plan(a, w, AgmmConfig{}, c.sms).gemm, make_fused_ce_plan(a, w, c.sms).gemm}) {
        const int64_t tile_rows = int64_t(cfg.bm) * cfg.cluster_m, shard_rows = c.m / w;
        for (int r = 0; r < w; ++r) {
          const WaitingGemmOrder o = waiting_gemm_order(a, cfg, r, w);
          const gemm::TileGrid g = gemm::make_tile_grid(c.m, c.n, int(tile_rows), cfg.bn, o.group_m);
          const std::string what = "world " + std::to_string(w) + " M=" + std::to_string(c.m) + " " + cfg.name() +
                                   " rank " + std::to_string(r);
          EXPECT_EQ(gemm::RotatedOrder::at({o.first_m}, g, 0).m, r * shard_rows / tile_rows) << what;
          EXPECT_GE(o.group_m, 1) << what;
          EXPECT_LE(o.group_m, std::max(1, cfg.group_m)) << what;
          if (shard_rows % tile_rows != 0) continue;  // tiles straddle shards: no group can stay inside
          for (int64_t t = 0; t < int64_t(o.group_m) * g.n_blocks; ++t) {
            const int64_t row = gemm::RotatedOrder::at({o.first_m}, g, t).m * tile_rows;
            EXPECT_TRUE(row >= r * shard_rows && row < (r + 1) * shard_rows) << what << " order index " << t;
          }
        }
      }
    }
  }
  const AgmmArgs cols = args_for({1024, 3584, 8192, 1});
  const gemm::GemmConfig cfg = make_fused_ce_plan(cols, 2, 132).gemm;
  EXPECT_EQ(waiting_gemm_order(cols, cfg, 1, 2).first_m, 0);
  EXPECT_EQ(waiting_gemm_order(cols, cfg, 1, 2).group_m, cfg.group_m);
}

// pull's source of every CTA's A, at every world 1-8, on a whole GPU's SMs and on a simulated
// rank's share: m-block (k-block) u is rank u / source_unit's; a pair tile's second CTA past M (an
// odd m-block count: odd worlds) reads the last rank's map, never one past the world (r283: an
// illegal instruction at W = 5, M = 640).
TEST(AgmmPlan, PullSourceOfEveryCtaIsARank) {
  int past_m = 0;
  for (int w = 1; w <= agmm::kPullMaxWorld; ++w)
    for (int sms : {132, (132 - 4) / w})
      for (int64_t tiles : {1, 2, 3, 5}) {
        SCOPED_TRACE(testing::Message() << "world " << w << " SMs " << sms << " m-blocks per shard " << tiles);
        const AgmmArgs a = args_for({w * tiles * 128, 843, 45, 0});
        const PullPlan p = make_pull_plan(a, w, sms);
        agmm::PullReady::Params prm;
        prm.sources = w, prm.gather_dim = 0, prm.source_unit = p.source_unit;
        const int real = int((a.m + p.gemm.bm - 1) / p.gemm.bm), cluster = std::max(1, p.gemm.cluster_m);
        const int ctas = (real + cluster - 1) / cluster * cluster;  // m-blocks of the grid's CTAs
        for (int m = 0; m < ctas; ++m) {
          const int s = agmm::PullReady::source(prm, {m, 0}, 0);
          if (m < real) {
            EXPECT_EQ(s, m / p.source_unit) << "m-block " << m;
          } else {
            EXPECT_EQ(s, w - 1) << "m-block " << m << " past M";
            ++past_m;
          }
        }
        const AgmmArgs b = args_for({333, 843, w * tiles * 64, 1});
        prm.gather_dim = 1, prm.source_unit = make_pull_plan(b, w, sms).source_unit;
        for (int kb = 0; kb < w * tiles; ++kb) EXPECT_EQ(agmm::PullReady::source(prm, {0, 0}, kb), kb / tiles);
      }
  EXPECT_GT(past_m, 0) << "no pair tile past M: the case is not exercised";
}

// pull: every GEMM tile reads A from one rank only, so a shard must span whole m-blocks (gather_dim
// 0) or k-blocks (gather_dim 1); the source of m-block / k-block u is u / source_unit. Other
// shapes, and more ranks than tensor maps, are NotSupported (not InvalidArgument: the shape is
// valid, this variant does not run it).
TEST(AgmmPlan, PullTilesReadOneRankEach) {
  for (int w = 2; w <= agmm::kPullMaxWorld; ++w)
    for (int64_t m : {int64_t(w) * 128, int64_t(w) * 1024, int64_t(w) * 4096}) {
      SCOPED_TRACE(testing::Message() << "world " << w << " M " << m);
      const AgmmArgs a = args_for({m, 4096, 8192, 0});
      const PullPlan p = make_pull_plan(a, w, 132);
      ASSERT_EQ(m / w % p.gemm.bm, 0);
      EXPECT_EQ(int64_t(p.source_unit) * p.gemm.bm, m / w);  // m-block u is rank u / source_unit's
      const AgmmArgs b = args_for({m, 3584, int64_t(w) * 1024, 1});
      EXPECT_EQ(make_pull_plan(b, w, 132).source_unit, 1024 / 64);
    }
  // Small M: the heuristic splits K (many CTAs per tile, few remote loads each), as for any GEMM;
  // the grid is the rank's share of SMs (a whole GPU's, or 1/W of one with simulated ranks).
  const AgmmArgs skinny = args_for({4, 3584, 8192, 1});
  for (int sms : {132, 66}) {
    gemm::GemmConfig want = gemm::choose_gemm_config(4, 3584, 8192, skinny.dtype, skinny.b_layout, sms, gemm::KCuts::split);
    want.max_ctas = sms;
    EXPECT_EQ(make_pull_plan(skinny, 2, sms).gemm.name(), want.name());
    EXPECT_EQ(make_fused_ce_plan(skinny, 2, sms).gemm.max_ctas, sms);
  }
  EXPECT_TRUE(make_pull_plan(skinny, 2, 132).gemm.splits_k());
  expect_error([] { make_pull_plan(args_for({2 * 100, 4096, 8192, 0}), 2, 132); }, Status::NotSupported,
               "whole tiles per shard");
  expect_error([] { make_pull_plan(args_for({64, 3584, 2 * 1000, 1}), 2, 132); }, Status::NotSupported,
               "whole k-blocks per shard");
  expect_error([] { make_pull_plan(args_for({16 * 128, 4096, 16 * 64, 1}), 16, 132); }, Status::NotSupported,
               "at most 8 ranks");
  expect_error([] { make_pull_plan(args_for({3 * 128 + 1, 4096, 8192, 0}), 3, 132); }, Status::InvalidArgument,
               "divisible");
}

// sm-specialized: the movers are CTAs of the GEMM kernel, so they come in whole clusters of its
// config, and the GEMM gets exactly the SMs after them.
TEST(AgmmPlan, SmSpecializedMoversAreWholeClustersOfTheGemm) {
  for (int w : kWorlds)
    for (const GridCase& c : grid_cases(w))
      for (int asked : {0, 1, 3, 5}) {
        AgmmConfig cfg;
        cfg.push_ctas = asked;
        const AgmmArgs a = args_for(c);
        const PushPlan push = make_push_plan(a, w, cfg, c.sms), p = make_sm_specialized_plan(a, w, cfg, c.sms);
        const int cluster = std::max(1, p.gemm.cluster_m);
        EXPECT_EQ(p.push_ctas % cluster, 0) << p.gemm.name();
        EXPECT_GE(p.push_ctas, push.push_ctas);
        EXPECT_LT(p.push_ctas, push.push_ctas + cluster);
        EXPECT_EQ(p.gemm.max_ctas, c.sms - p.push_ctas);
        EXPECT_TRUE(p.gemm.bm == push.gemm.bm && p.gemm.bn == push.gemm.bn && p.gemm.stages == push.gemm.stages &&
                    p.gemm.cluster_m == push.gemm.cluster_m && p.gemm.swap_ab == push.gemm.swap_ab)
            << p.gemm.name() << " vs push's " << push.gemm.name();
        EXPECT_EQ(p.grid.pieces(), push.grid.pieces());
      }
  AgmmConfig cfg;
  cfg.push_ctas = 131;  // a GEMM with clusters of 2 rounds it up to every SM
  const AgmmArgs a = args_for({8192, 4096, 8192, 0});
  if (make_push_plan(a, 2, cfg, 132).gemm.cluster_m == 2)
    expect_error([&] { make_sm_specialized_plan(a, 2, cfg, 132); }, Status::InvalidArgument, "leave no SM");
}

alignas(256) uint16_t g_mem[1 << 16];

AgmmArgs valid_args() {
  AgmmArgs a;
  a.m = 256, a.n = 64, a.k = 64, a.gather_dim = 0;
  a.a_shard = g_mem, a.lda_shard = 64;            // [128, 64]
  a.b = g_mem + 8192, a.ldb = 64;                 // [64, 64] nk
  a.c = g_mem + 16384, a.ldc = 64;                // [256, 64]
  return a;
}

TEST(AgmmValidation, RejectsBadArgumentsNamingThem) {
  const AgmmConfig cfg;
  validate_agmm_args(valid_args(), 2, cfg);  // the baseline is fine
  auto bad = [&](const char* needle, auto edit) {
    AgmmArgs a = valid_args();
    edit(a);
    expect_error([&] { validate_agmm_args(a, 2, cfg); }, Status::InvalidArgument, needle);
  };
  bad("divisible", [](AgmmArgs& a) { a.m = 255; });
  bad("A_shard is null", [](AgmmArgs& a) { a.a_shard = nullptr; });
  bad("16-byte aligned", [](AgmmArgs& a) { a.a_shard = g_mem + 1; });
  bad("lda_shard", [](AgmmArgs& a) { a.lda_shard = 32; });
  bad("multiple of 8", [](AgmmArgs& a) { a.lda_shard = 68; });
  bad("pitch limit of 2^31 - 1 bytes", [](AgmmArgs& a) { a.lda_shard = int64_t(1) << 30; });
  AgmmConfig wide;
  wide.max_k = int64_t(1) << 30;
  AgmmArgs k30 = valid_args();  // A_shard's pitch fits; the gathered row's (K) does not
  k30.gather_dim = 1, k30.k = int64_t(1) << 30, k30.lda_shard = int64_t(1) << 29, k30.ldb = k30.k;
  expect_error([&] { validate_agmm_args(k30, 2, wide); }, Status::InvalidArgument,
               "K=1073741824 makes a gathered row of 2147483648 bytes");
  // gather_dim 0: K = 2^30 - 7 has no valid A_shard pitch (a multiple of 8, at least K, within the
  // copy engine's limit), hence the contract's K <= 2^30 - 8.
  AgmmArgs k0 = valid_args();
  k0.k = (int64_t(1) << 30) - 7, k0.lda_shard = k0.k, k0.ldb = int64_t(1) << 30;
  expect_error([&] { validate_agmm_args(k0, 2, wide); }, Status::InvalidArgument, "multiple of 8");
  k0.lda_shard = int64_t(1) << 30;
  expect_error([&] { validate_agmm_args(k0, 2, wide); }, Status::InvalidArgument,
               "lda_shard=1073741824 elements exceeds the copy engine's pitch limit");
  bad("ldb", [](AgmmArgs& a) { a.ldb = 8; });
  bad("ldc", [](AgmmArgs& a) { a.ldc = 60; });
  bad("C overlaps A_shard", [](AgmmArgs& a) { a.c = g_mem + 64; });
  bad("C overlaps B", [](AgmmArgs& a) { a.c = g_mem + 8192; });
  bad("capacity", [](AgmmArgs& a) { a.m = 32768, a.c = g_mem + 16384; });
  bad("dtype", [](AgmmArgs& a) { a.dtype = gemm::DType(7); });
  bad("layout", [](AgmmArgs& a) { a.b_layout = gemm::BLayout(7); });
  bad("gather_dim", [](AgmmArgs& a) { a.gather_dim = 2; });
}

// (What auto picks: the AutoPicks* tests below.)
TEST(AgmmVariants, NamesRoundTrip) {
  for (AgmmVariant v : {AgmmVariant::bsp, AgmmVariant::bsp_own, AgmmVariant::decomposed, AgmmVariant::pull,
                        AgmmVariant::push, AgmmVariant::sm_specialized, AgmmVariant::fused_ce, AgmmVariant::ksplit,
                        AgmmVariant::nsplit, AgmmVariant::automatic})
    EXPECT_EQ(parse_agmm_variant(variant_name(v)), v);
  expect_error([] { parse_agmm_variant("bogus"); }, Status::InvalidArgument, "unknown");
}

// auto's other rules: fused-ce only where its k-loop can start at the rank's own columns (shards a
// whole number of 64-column k-blocks), decomposed for gather_dim 0 only from 3.5M elements of C.
TEST(AgmmVariants, AutoPicksFusedCeOnlyWithRotatableShardsAndDecomposedForLargeRowShards) {
  for (int w : kWorlds) {
    AgmmArgs a = args_for({1024, 3584, int64_t(w) * 4096, 1});
    EXPECT_EQ(choose_agmm_variant(a, w, AgmmConfig{}), AgmmVariant::fused_ce) << "world " << w;
    a.k = int64_t(w) * 4104;  // shards of 4104 columns: not whole k-blocks, no rotation
    ASSERT_NE(agmm::first_k_block(make_fused_ce_plan(a, w, 132).grid, 1), 4104 / 64);
    EXPECT_EQ(choose_agmm_variant(a, w, AgmmConfig{}), AgmmVariant::decomposed) << "world " << w;
    a.m = 512;
    EXPECT_EQ(choose_agmm_variant(a, w, AgmmConfig{}), AgmmVariant::decomposed) << "world " << w;
  }
  EXPECT_EQ(choose_agmm_variant(args_for({512, 4096, 8192, 0}), 2, AgmmConfig{}), AgmmVariant::bsp);
  EXPECT_EQ(choose_agmm_variant(args_for({512, 7168, 8192, 0}), 2, AgmmConfig{}), AgmmVariant::decomposed);
  EXPECT_EQ(choose_agmm_variant(args_for({1024, 4096, 8192, 0}), 2, AgmmConfig{}), AgmmVariant::decomposed);
}

// gather_dim 0: decomposed runs one GEMM per shard, so auto keeps it to shards of
// kDecMinShardRows or more: the sweep at two ranks is unchanged, and at eight ranks the
// small-M shapes go to bsp (W = 8, M = 1024: 128-row shards, 8 GEMMs of ~27 µs against one of ~87).
TEST(AgmmVariants, AutoKeepsDecomposedToShardsOfEnoughRows) {
  const AgmmConfig cfg;
  for (int64_t m : {1024, 2048, 4096, 8192, 16384})
    for (int64_t n : {4096, 7168})
      EXPECT_EQ(choose_agmm_variant(args_for({m, n, 8192, 0}), 2, cfg), AgmmVariant::decomposed) << m << " x " << n;
  EXPECT_EQ(choose_agmm_variant(args_for({1024, 4096, 8192, 0}), 8, cfg), AgmmVariant::bsp);
  EXPECT_EQ(choose_agmm_variant(args_for({1024, 7168, 8192, 0}), 8, cfg), AgmmVariant::bsp);
  EXPECT_EQ(choose_agmm_variant(args_for({2048, 4096, 8192, 0}), 8, cfg), AgmmVariant::decomposed);
  EXPECT_EQ(choose_agmm_variant(args_for({4096, 7168, 8192, 0}), 8, cfg), AgmmVariant::decomposed);
  EXPECT_EQ(choose_agmm_variant(args_for({512, 7168, 8192, 0}), 4, cfg), AgmmVariant::bsp);
  EXPECT_EQ(choose_agmm_variant(args_for({1024, 7168, 8192, 0}), 4, cfg), AgmmVariant::decomposed);
  EXPECT_EQ(choose_agmm_variant(args_for({1020, 4096, 8192, 0}), 4, cfg), AgmmVariant::bsp);  // 255 rows
  EXPECT_EQ(choose_agmm_variant(args_for({1536, 4096, 8192, 0}), 6, cfg), AgmmVariant::decomposed);
}

// ksplit's two-kernel exchange: reduce-scatter + all-gather where it saves enough bytes over
// all-to-all; at two ranks from 3 MB of partial (as measured), at eight from ~135 KB (all-to-all's
// bytes grow with W), never at one rank.
TEST(AgmmKsplitExchange, OwnerSumsWhereTheyMoveFewerBytes) {
  EXPECT_FALSE(agmm::ksplit_owner_sums((3 << 20) - 1, 2));
  EXPECT_TRUE(agmm::ksplit_owner_sums(3 << 20, 2));
  EXPECT_FALSE(agmm::ksplit_owner_sums(int64_t(1) << 40, 1));
  const int64_t m128 = 128 * 3584 * 4;  // M = 128, N = 3584: 1.8 MB of partial
  EXPECT_FALSE(agmm::ksplit_owner_sums(m128, 2));
  EXPECT_TRUE(agmm::ksplit_owner_sums(m128, 4));
  EXPECT_TRUE(agmm::ksplit_owner_sums(m128, 8));
  EXPECT_FALSE(agmm::ksplit_owner_sums(128 << 10, 8));
  EXPECT_TRUE(agmm::ksplit_owner_sums(140 << 10, 8));
  // Once owner sums pay at some world, they pay at every larger one.
  for (int64_t bytes = 16 << 10; bytes <= (8 << 20); bytes += 16 << 10)
    for (int w = 2; w < 8; ++w)
      if (agmm::ksplit_owner_sums(bytes, w))
        EXPECT_TRUE(agmm::ksplit_owner_sums(bytes, w + 1)) << bytes << " B, W=" << w;
}

// The launch check mode's description: what every rank must agree on, and nothing they need not
// (pointers, strides).
TEST(AgmmLaunchCheck, DescriptionNamesTheSharedArgumentsOnly) {
  const AgmmConfig cfg;
  AgmmArgs a = args_for({1024, 3584, 8192, 1});
  a.b_replicated = true;
  AgmmArgs b = a;
  b.a_shard = &a, b.c = &b, b.lda_shard = 8192, b.ldc = 4096, b.ldb = 3600;
  const std::string d = describe_agmm_launch(AgmmVariant::automatic, AgmmVariant::nsplit, a, cfg);
  EXPECT_EQ(d, describe_agmm_launch(AgmmVariant::automatic, AgmmVariant::nsplit, b, cfg));
  EXPECT_NE(d.find("all_gather_matmul auto (nsplit) M=1024 N=3584 K=8192 gather_dim=1 bf16 B nk replicated"),
            std::string::npos) << d;
  b.m = 1016;
  EXPECT_NE(d, describe_agmm_launch(AgmmVariant::automatic, AgmmVariant::nsplit, b, cfg));
  // The layout picks the band tile (nk 128 x 224, kn 128 x 256 at M = 512-1024), whose flags the
  // ranks index alike: a rank passing B the other way round must be caught.
  b = a, b.b_layout = gemm::BLayout::kn;
  EXPECT_NE(d, describe_agmm_launch(AgmmVariant::automatic, AgmmVariant::nsplit, b, cfg));
  AgmmConfig other = cfg;
  other.ksplit_max_m = 512;
  EXPECT_NE(d, describe_agmm_launch(AgmmVariant::automatic, AgmmVariant::nsplit, a, other));
  EXPECT_NE(d, describe_agmm_launch(AgmmVariant::nsplit, AgmmVariant::nsplit, a, cfg));
}

// auto picks ksplit only where it can run: gather_dim 1, B replicated, within the op's capacity.
TEST(AgmmVariants, AutoPicksKsplitOnlyWhereItRuns) {
  AgmmArgs a = args_for({1, 3584, 8192, 1});
  a.b_replicated = true;
  AgmmConfig cfg;
  for (int64_t m : {1, 128, 256, 511, 512, 1024}) {
    a.m = m;
    EXPECT_EQ(choose_agmm_variant(a, 2, cfg), m < agmm::kNsplitMinM ? AgmmVariant::ksplit : AgmmVariant::nsplit)
        << "M=" << m;
  }
  a.m = cfg.ksplit_max_m + 1;  // beyond the op's partial buffers
  EXPECT_NE(choose_agmm_variant(a, 2, cfg), AgmmVariant::ksplit);
  EXPECT_NE(choose_agmm_variant(a, 2, cfg), AgmmVariant::nsplit);
  a.m = 1;
  a.b_replicated = false;
  EXPECT_NE(choose_agmm_variant(a, 2, cfg), AgmmVariant::ksplit);
  a.b_replicated = true;
  cfg.ksplit_max_m = 0;
  EXPECT_NE(choose_agmm_variant(a, 2, cfg), AgmmVariant::ksplit);
  cfg = AgmmConfig{};
  a.n = cfg.ksplit_max_n + 8;
  EXPECT_NE(choose_agmm_variant(a, 2, cfg), AgmmVariant::ksplit);
  a = args_for({1024, 4096, 8192, 0});
  a.b_replicated = true;
  EXPECT_NE(choose_agmm_variant(a, 2, cfg), AgmmVariant::ksplit);
}

// One rank: nothing travels, so auto never overlaps a copy with the GEMM (bsp), except ksplit's one
// kernel at skinny M and nsplit above it (one product straight into C), where ksplit's conditions
// hold.
TEST(AgmmVariants, AutoAtOneRankPicksBspOrTheSplitsThatWriteCOnce) {
  AgmmConfig cfg;
  for (int gd : {0, 1})
    for (int64_t m : {1, 32, 33, 256, 1024, 8192})
      for (int64_t n : {3584, 4096, 7168})
        for (bool replicated : {false, true}) {
          AgmmArgs a = args_for({m, n, 8192, gd});
          a.b_replicated = replicated;
          const bool splits = gd == 1 && replicated && m <= cfg.ksplit_max_m;
          const AgmmVariant want = !splits ? AgmmVariant::bsp : m <= agmm::kSkinnyMaxM ? AgmmVariant::ksplit
                                                                                     : AgmmVariant::nsplit;
          EXPECT_EQ(choose_agmm_variant(a, 1, cfg), want) << "M=" << m << " N=" << n << " gd " << gd
                                                           << (replicated ? " replicated" : "");
        }
  AgmmArgs a = args_for({256, 3584, 8192, 1});
  a.b_replicated = true;
  EXPECT_EQ(choose_agmm_variant(a, 1, cfg), AgmmVariant::nsplit);
  EXPECT_EQ(choose_agmm_variant(a, 2, cfg), AgmmVariant::ksplit);  // two ranks: the table above
  cfg.ksplit_max_m = 0;
  EXPECT_EQ(choose_agmm_variant(a, 1, cfg), AgmmVariant::bsp);
}

}  // namespace
}  // namespace taxfree
