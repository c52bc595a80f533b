// all_gather_matmul host logic that needs no GPU: variant names, shard shapes, argument
// validation, the push and ksplit variants' plans and the `auto` choice table.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/runtime/byte_range.h"
#include "taxfree/runtime/error.h"

namespace taxfree {

namespace {

constexpr int64_t kElem = 2;  // bf16 / fp16

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A row-major matrix operand: non-null, 16-byte aligned, stride >= its width and a multiple of
// 16 bytes (TMA and the 16-byte copies need both).
void check_matrix(const char* name, const void* p, const char* ld_name, int64_t ld, int64_t width,
                  const char* width_name) {
  TF_REQUIRE(p != nullptr, Status::InvalidArgument, "all_gather_matmul: " << name << " is null");
  TF_REQUIRE(aligned16(p), Status::InvalidArgument,
             "all_gather_matmul: " << name << " at " << p << " must be 16-byte aligned");
  TF_REQUIRE(ld >= width, Status::InvalidArgument,
             "all_gather_matmul: " << ld_name << "=" << ld << " must be >= " << width_name << "=" << width);
  TF_REQUIRE(ld % 8 == 0, Status::InvalidArgument,
             "all_gather_matmul: " << ld_name << "=" << ld << " elements must be a multiple of 8 (16-byte rows)");
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

AgmmVariant parse_agmm_variant(const std::string& name) {
  if (name == "bsp") return AgmmVariant::bsp;
  if (name == "bsp-own") return AgmmVariant::bsp_own;
  if (name == "decomposed") return AgmmVariant::decomposed;
  if (name == "pull") return AgmmVariant::pull;
  if (name == "push") return AgmmVariant::push;
  if (name == "sm-specialized") return AgmmVariant::sm_specialized;
  if (name == "fused-ce") return AgmmVariant::fused_ce;
  if (name == "ksplit") return AgmmVariant::ksplit;
  if (name == "nsplit") return AgmmVariant::nsplit;
  if (name == "auto") return AgmmVariant::automatic;
  TF_THROW(Status::InvalidArgument, "unknown all_gather_matmul variant '"
                                        << name
                                        << "' (known: bsp, bsp-own, decomposed, pull, push, sm-specialized, "
                                           "fused-ce, ksplit, nsplit, auto)");
}

const char* variant_name(AgmmVariant v) {
  switch (v) {
    case AgmmVariant::bsp: return "bsp";
    case AgmmVariant::bsp_own: return "bsp-own";
    case AgmmVariant::decomposed: return "decomposed";
    case AgmmVariant::pull: return "pull";
    case AgmmVariant::push: return "push";
    case AgmmVariant::sm_specialized: return "sm-specialized";
    case AgmmVariant::fused_ce: return "fused-ce";
    case AgmmVariant::ksplit: return "ksplit";
    case AgmmVariant::nsplit: return "nsplit";
    case AgmmVariant::automatic: return "auto";
  }
  return "unknown";
}

ShardShape agmm_shard_shape(int64_t m, int64_t k, int gather_dim, int world) {
  TF_REQUIRE(world >= 1, Status::InvalidArgument, "all_gather_matmul: world=" << world << " must be >= 1");
  TF_REQUIRE(gather_dim == 0 || gather_dim == 1, Status::InvalidArgument,
             "all_gather_matmul: gather_dim=" << gather_dim << " must be 0 (rows) or 1 (columns)");
  TF_REQUIRE(m >= 1 && k >= 1, Status::InvalidArgument,
             "all_gather_matmul: sizes must be >= 1: M=" << m << " K=" << k);
  TF_REQUIRE(m <= INT_MAX && k <= INT_MAX, Status::InvalidArgument,
             "all_gather_matmul: sizes must be < 2^31: M=" << m << " K=" << k);
  if (gather_dim == 0) {
    TF_REQUIRE(m % world == 0, Status::InvalidArgument,
               "all_gather_matmul: gather_dim 0 needs M divisible by the number of ranks: M=" << m << ", world="
                                                                                              << world);
    return {m / world, k, ceil_div(k, 8) * 8};
  }
  TF_REQUIRE(k % world == 0, Status::InvalidArgument,
             "all_gather_matmul: gather_dim 1 needs K divisible by the number of ranks: K=" << k << ", world="
                                                                                            << world);
  TF_REQUIRE((k / world) % 8 == 0, Status::InvalidArgument,
             "all_gather_matmul: gather_dim 1 needs K / world divisible by 8 (16-byte column blocks): K="
                 << k << ", world=" << world << ", K / world=" << k / world);
  return {m, k / world, k};
}

void validate_agmm_args(const AgmmArgs& a, int world, const AgmmConfig& cfg) {
  TF_REQUIRE(valid_dtype(a.dtype), Status::InvalidArgument,
             "all_gather_matmul: dtype " << int(a.dtype) << " is not bf16 or fp16");
  TF_REQUIRE(a.b_layout == gemm::BLayout::nk || a.b_layout == gemm::BLayout::kn, Status::InvalidArgument,
             "all_gather_matmul: B layout " << int(a.b_layout) << " is not nk or kn");
  TF_REQUIRE(a.n >= 1 && a.n <= INT_MAX, Status::InvalidArgument, "all_gather_matmul: N=" << a.n << " out of range");
  const ShardShape s = agmm_shard_shape(a.m, a.k, a.gather_dim, world);
  TF_REQUIRE(a.m <= cfg.max_m && a.k <= cfg.max_k, Status::InvalidArgument,
             "all_gather_matmul: M=" << a.m << " K=" << a.k << " exceed the op's capacity (max_m=" << cfg.max_m
                                     << ", max_k=" << cfg.max_k << "); build the op with a larger AgmmConfig");
  check_matrix("A_shard", a.a_shard, "lda_shard", a.lda_shard, s.cols, "its columns");
  // The copy engine moves A_shard into gathered rows (cudaMemcpy2DAsync, mid-launch): both pitches
  // within its limit, checked here.
  TF_REQUIRE(a.lda_shard <= INT_MAX / kElem, Status::InvalidArgument,
             "all_gather_matmul: lda_shard=" << a.lda_shard
                                             << " elements exceeds the copy engine's pitch limit of 2^31 - 1 bytes");
  TF_REQUIRE(s.ld <= INT_MAX / kElem, Status::InvalidArgument,
             "all_gather_matmul: K=" << a.k << " makes a gathered row of " << s.ld * kElem
                                     << " bytes, beyond the copy engine's pitch limit of 2^31 - 1 bytes");
  const bool nk = a.b_layout == gemm::BLayout::nk;
  check_matrix("B", a.b, "ldb", a.ldb, nk ? a.k : a.n, nk ? "K" : "N");
  check_matrix("C", a.c, "ldc", a.ldc, a.n, "N");
  const AgmmOperandRanges r = agmm_operand_ranges(a, world);
  TF_REQUIRE(!overlap(r.c, r.a_shard), Status::InvalidArgument, "all_gather_matmul: C overlaps A_shard");
  TF_REQUIRE(!overlap(r.c, r.b), Status::InvalidArgument, "all_gather_matmul: C overlaps B");
}

AgmmOperandRanges agmm_operand_ranges(const AgmmArgs& a, int world) {
  const ShardShape s = agmm_shard_shape(a.m, a.k, a.gather_dim, world);
  const bool nk = a.b_layout == gemm::BLayout::nk;
  return {matrix_range(a.a_shard, s.rows, s.cols, a.lda_shard, kElem),
          matrix_range(a.b, nk ? a.n : a.k, nk ? a.k : a.n, a.ldb, kElem), matrix_range(a.c, a.m, a.n, a.ldc, kElem)};
}

void validate_agmm_config(const AgmmConfig& c) {
  TF_REQUIRE(c.max_m >= 1 && c.max_k >= 1, Status::InvalidArgument,
             "all_gather_matmul: capacity max_m=" << c.max_m << " max_k=" << c.max_k << " must be >= 1");
  TF_REQUIRE(c.push_ctas >= 0, Status::InvalidArgument, "all_gather_matmul: push_ctas=" << c.push_ctas << " must be >= 0");
  TF_REQUIRE(c.col_chunk >= 0 && c.col_chunk % 64 == 0, Status::InvalidArgument,
             "all_gather_matmul: col_chunk=" << c.col_chunk << " must be a non-negative multiple of 64 (one GEMM k-block)");
  TF_REQUIRE(c.side_gather_ctas >= 0 && c.side_gather_ctas <= agmm::kKsplitMaxCtas, Status::InvalidArgument,
             "all_gather_matmul: side_gather_ctas=" << c.side_gather_ctas << " must be in [0, " << agmm::kKsplitMaxCtas
                                                    << "]");
  TF_REQUIRE(c.ksplit_max_m >= 0 && c.ksplit_max_n >= 0 && c.ksplit_max_m <= INT_MAX && c.ksplit_max_n <= INT_MAX,
             Status::InvalidArgument,
             "all_gather_matmul: ksplit_max_m=" << c.ksplit_max_m << " and ksplit_max_n=" << c.ksplit_max_n
                                                << " must be in [0, 2^31)");
}

int64_t push_flag_capacity(int64_t max_m, int64_t max_k, int world) {
  return int64_t(world) * ceil_div(max_m, 64) * ceil_div(max_k, 64);
}

PushPlan make_push_plan(const AgmmArgs& a, int world, const AgmmConfig& cfg, int num_sms) {
  validate_agmm_config(cfg);
  const ShardShape s = agmm_shard_shape(a.m, a.k, a.gather_dim, world);
  // The push kernel needs SMs of its own (a GEMM CTA fills an SM). 4 SMs of 16-byte copies are
  // estimated to keep one NVLink direction busy; more help only where the GEMM does not need
  // them: take the most (up to 16) that leave the GEMM's wave count unchanged.
  constexpr int kMinPush = 4, kMaxPush = 16;
  PushPlan p;
  if (cfg.push_ctas > 0) {
    TF_REQUIRE(cfg.push_ctas < num_sms, Status::InvalidArgument,
               "all_gather_matmul: push_ctas=" << cfg.push_ctas << " leaves no SM for the GEMM (" << num_sms << " SMs)");
    p.push_ctas = cfg.push_ctas;
    p.gemm = gemm::choose_gemm_config(a.m, a.n, a.k, a.dtype, a.b_layout, num_sms - p.push_ctas, gemm::KCuts::none);
  } else {
    TF_REQUIRE(num_sms > kMinPush, Status::NotSupported,
               "all_gather_matmul push needs more than " << kMinPush << " SMs (have " << num_sms << ")");
    // Whole tiles only: the A-ready wait runs with whole tiles (split-K needs AlwaysReady).
    p.gemm = gemm::choose_gemm_config(a.m, a.n, a.k, a.dtype, a.b_layout, num_sms - kMinPush, gemm::KCuts::none);
    const gemm::TileGrid g = gemm::make_tile_grid(a.m, a.n, p.gemm.bm, p.gemm.bn, p.gemm.group_m);
    const int64_t waves = ceil_div(g.tiles(), num_sms - kMinPush);
    p.push_ctas = kMinPush;
    for (int c = kMinPush + 1; c <= kMaxPush && c < num_sms; ++c)
      if (ceil_div(g.tiles(), num_sms - c) == waves) p.push_ctas = c;
  }
  p.gemm.max_ctas = num_sms - p.push_ctas;

  agmm::PieceGrid& g = p.grid;
  g.world = world;
  g.gather_dim = a.gather_dim;
  g.m = a.m, g.k = a.k;
  g.shard_rows = s.rows, g.shard_cols = s.cols;
  g.row_chunk = p.gemm.bm;
  if (cfg.col_chunk > 0) {
    // Wider than the shard is one piece across it; the GEMM's producer walks pieces in 32 bits.
    g.col_chunk = std::min(cfg.col_chunk, ceil_div(s.cols, 64) * 64);
  } else {
    // About 8 pieces across a shard: the GEMM can start on a piece's first k-blocks while the rest
    // is in flight, at the cost of one flag check per piece per tile. A power of two times 64 that
    // divides the shard where it can, so the GEMM's producer skips the piece walk on the k-blocks
    // inside a piece (piece_start_mask).
    int64_t chunk = 256;
    while (chunk < 4096 && chunk * 2 * 8 <= s.cols) chunk *= 2;
    int64_t dividing = chunk;
    while (dividing > 256 && s.cols % dividing != 0) dividing /= 2;
    g.col_chunk = a.gather_dim == 1 && s.cols % dividing == 0 ? dividing : chunk;
  }
  g.row_chunks = ceil_div(g.shard_rows, g.row_chunk);
  g.col_chunks = ceil_div(g.shard_cols, g.col_chunk);
  // One GEMM wave covers about ctas / n_blocks m-blocks: send that many row chunks at a time.
  const gemm::TileGrid tiles = gemm::make_tile_grid(a.m, a.n, p.gemm.bm, p.gemm.bn, p.gemm.group_m);
  g.group_rows = std::max<int64_t>(1, ceil_div(std::min<int64_t>(tiles.tiles(), p.gemm.max_ctas), tiles.n_blocks));
  return p;
}

WaitingGemmOrder waiting_gemm_order(const AgmmArgs& a, const gemm::GemmConfig& cfg, int rank, int world) {
  if (a.gather_dim != 0) return {0, cfg.group_m};
  const int64_t tile_rows = int64_t(cfg.bm) * std::max(1, cfg.cluster_m);
  const int64_t shard_tiles = agmm_shard_shape(a.m, a.k, 0, world).rows / tile_rows;
  return {gemm::rank_first_m_block(a.m, int(tile_rows), rank, world),
          int(std::clamp<int64_t>(shard_tiles, 1, std::max(1, cfg.group_m)))};
}

PullPlan make_pull_plan(const AgmmArgs& a, int world, int num_sms) {
  const ShardShape s = agmm_shard_shape(a.m, a.k, a.gather_dim, world);
  TF_REQUIRE(world <= agmm::kPullMaxWorld, Status::NotSupported,
             "all_gather_matmul pull reads A from at most " << agmm::kPullMaxWorld << " ranks, not " << world);
  PullPlan p;
  // Split-K where the heuristic wants it: at small M a whole tile's k-loop would wait out ~100
  // remote loads in a row (r77: 214-233 us at M <= 8 on whole tiles).
  p.gemm = gemm::choose_gemm_config(a.m, a.n, a.k, a.dtype, a.b_layout, num_sms, gemm::KCuts::split);
  // The rank's share: every compiled tile takes a whole SM (gemm_tiles.h), so a whole GPU's grid is
  // unchanged, and W ranks simulated on one GPU stay co-resident.
  p.gemm.max_ctas = num_sms;
  if (a.gather_dim == 0) {
    TF_REQUIRE(s.rows % p.gemm.bm == 0, Status::NotSupported,
               "all_gather_matmul pull at gather_dim 0 needs whole tiles per shard: M / world = "
                   << s.rows << " is not a multiple of the GEMM's " << p.gemm.bm << " rows");
    p.source_unit = int(s.rows / p.gemm.bm);
  } else {
    TF_REQUIRE(s.cols % 64 == 0, Status::NotSupported,
               "all_gather_matmul pull at gather_dim 1 needs whole k-blocks per shard: K / world = " << s.cols
                   << " is not a multiple of 64");
    p.source_unit = int(s.cols / 64);
  }
  return p;
}

PushPlan make_sm_specialized_plan(const AgmmArgs& a, int world, const AgmmConfig& cfg, int num_sms) {
  PushPlan p = make_push_plan(a, world, cfg, num_sms);
  const int cluster = std::max(1, p.gemm.cluster_m);
  p.push_ctas = int(ceil_div(p.push_ctas, cluster) * cluster);
  TF_REQUIRE(num_sms - p.push_ctas >= cluster, Status::InvalidArgument,
             "all_gather_matmul sm-specialized: " << p.push_ctas << " mover CTAs (push_ctas=" << cfg.push_ctas
                                                  << " in whole clusters of " << cluster << ") leave the GEMM "
                                                  << num_sms - p.push_ctas << " of " << num_sms
                                                  << " SMs, fewer than one cluster");
  p.gemm.max_ctas = num_sms - p.push_ctas;
  return p;
}

FusedCePlan make_fused_ce_plan(const AgmmArgs& a, int world, int num_sms) {
  const ShardShape s = agmm_shard_shape(a.m, a.k, a.gather_dim, world);
  FusedCePlan p;
  p.gemm = gemm::choose_gemm_config(a.m, a.n, a.k, a.dtype, a.b_layout, num_sms, gemm::KCuts::none);
  p.gemm.max_ctas = num_sms;  // as pull's
  agmm::PieceGrid& g = p.grid;
  g.world = world;
  g.gather_dim = a.gather_dim;
  g.m = a.m, g.k = a.k;
  g.shard_rows = s.rows, g.shard_cols = s.cols;
  // Row chunks of whole GEMM m-blocks: the first wave waits only for the first chunk.
  g.row_chunk = ceil_div(ceil_div(s.rows, kFusedCeRowChunks), p.gemm.bm) * p.gemm.bm;
  g.col_chunk = s.cols;
  g.row_chunks = ceil_div(g.shard_rows, g.row_chunk);
  g.col_chunks = 1;
  g.group_rows = 1;
  return p;
}

namespace {
// Checks ksplit's paths and nsplit share (after agmm_shard_shape's); returns the shard shape.
ShardShape check_replicated_split(const AgmmArgs& a, int world, const AgmmConfig& cfg, const char* variant) {
  const ShardShape s = agmm_shard_shape(a.m, a.k, a.gather_dim, world);
  TF_REQUIRE(a.gather_dim == 1, Status::NotSupported,
             "all_gather_matmul " << variant << " splits the product across the ranks from K-sharded A: it needs "
                                  << "gather_dim 1, not " << a.gather_dim);
  TF_REQUIRE(a.b_replicated, Status::InvalidArgument,
             "all_gather_matmul " << variant << " multiplies by this rank's part of B: it needs B the same on every "
                                  << "rank (AgmmArgs::b_replicated is false)");
  TF_REQUIRE(a.m <= cfg.ksplit_max_m && a.n <= cfg.ksplit_max_n, Status::InvalidArgument,
             "all_gather_matmul " << variant << ": M=" << a.m << " N=" << a.n
                                  << " exceed the op's partial buffers (ksplit_max_m=" << cfg.ksplit_max_m
                                  << ", ksplit_max_n=" << cfg.ksplit_max_n << "); build the op with a larger AgmmConfig");
  return s;
}
}  // namespace

agmm::KsplitSlices make_ksplit_plan(const AgmmArgs& a, int world, const AgmmConfig& cfg, int num_sms) {
  const ShardShape s = check_replicated_split(a, world, cfg, "ksplit");
  TF_REQUIRE(num_sms >= 1, Status::InvalidArgument, "all_gather_matmul ksplit: num_sms=" << num_sms << " must be >= 1");
  agmm::KsplitSlices k;
  k.world = world;
  k.m = a.m, k.n = a.n;
  k.ldp = ceil_div(a.n, 8) * 8;
  k.shard_cols = s.cols;
  // About 32 KiB of partial and A per CTA: one CTA at decode sizes (a few flags, one wait), one per
  // SM from M ~ 128 on (N = 3584), where the local fp32 sum needs the HBM bandwidth of many SMs.
  const int64_t bytes = a.m * k.ldp * 4 + a.m * s.cols * kElem;
  k.ctas = int(std::clamp<int64_t>(ceil_div(bytes, 32 << 10), 1, std::min(num_sms, agmm::kKsplitMaxCtas)));
  return k;
}

int side_gather_ctas(const AgmmConfig& cfg, int num_sms) {
  const int want = cfg.side_gather_ctas > 0 ? cfg.side_gather_ctas : std::clamp(num_sms / 8, 1, agmm::kSideGatherCtas);
  return std::min(want, std::max(1, num_sms / 2));  // the exchange beside it keeps the rest
}

int ksplit_exchange_sms(const AgmmConfig& cfg, int num_sms) {
  return std::max(1, num_sms - side_gather_ctas(cfg, num_sms));
}

agmm::KsplitSkinny make_ksplit_skinny_plan(const AgmmArgs& a, int world, const AgmmConfig& cfg, int resident_ctas) {
  const ShardShape s = check_replicated_split(a, world, cfg, "ksplit");
  TF_REQUIRE(a.m <= agmm::kSkinnyMaxM, Status::InvalidArgument,
             "all_gather_matmul ksplit-skinny: M=" << a.m << " exceeds its " << agmm::kSkinnyMaxM << " rows");
  TF_REQUIRE(resident_ctas >= 1, Status::InvalidArgument,
             "all_gather_matmul ksplit-skinny: resident_ctas=" << resident_ctas << " must be >= 1");
  agmm::KsplitSkinny p;
  p.world = world;
  p.m = a.m, p.n = a.n;
  p.ldp = ceil_div(a.n, 8) * 8;
  p.shard_cols = s.cols;
  p.slices = int(ceil_div(a.n, agmm::kSkinnySliceCols));  // n <= ksplit_max_n < 2^31
  // One slice per CTA while they fit (N = 3584: 112 CTAs of 32 columns on 132 SMs; 32 columns is
  // the least per SM at MMA-tile granularity); wider N loops each CTA over several slices.
  p.ctas = std::min(p.slices, resident_ctas);
  p.m_tiles = agmm::skinny_m_tiles(a.m);
  return p;
}

agmm::BlockGatherPlan make_nsplit_plan(const AgmmArgs& a, int world, const AgmmConfig& cfg, int num_sms) {
  check_replicated_split(a, world, cfg, "nsplit");
  TF_REQUIRE(num_sms >= 1, Status::InvalidArgument, "all_gather_matmul nsplit: num_sms=" << num_sms << " must be >= 1");
  agmm::BlockGatherPlan p;
  p.blocks = {a.n, ceil_div(ceil_div(a.n, world), 8) * 8};
  p.m = a.m;
  p.ctas = int(std::min<int64_t>(a.m, std::min(num_sms, agmm::kKsplitMaxCtas)));
  return p;
}

KsplitHeap ksplit_heap(const AgmmConfig& cfg, int world) {
  if (cfg.ksplit_max_m <= 0 || cfg.ksplit_max_n <= 0) return {};
  KsplitHeap h;
  h.partial_floats = cfg.ksplit_max_m * ceil_div(cfg.ksplit_max_n, 8) * 8;
  const int64_t rows = std::min(cfg.ksplit_max_m, agmm::kSkinnyMaxM);
  h.skinny_partial_lines = ceil_div(cfg.ksplit_max_n, agmm::kSkinnySliceCols) * rows * agmm::kSkinnyLinesPerRow;
  h.skinny_a_lines = rows * ceil_div(ceil_div(cfg.max_k, world), 4);
  h.band_flags = ceil_div(cfg.ksplit_max_m, 64) * ceil_div(cfg.ksplit_max_n, 64);
  // per-slice partial and sum flags (two-kernel path) + per-band flags (band path) + nsplit's C
  // all-gather + the two-kernel path's side gather (its ready and its flags)
  const int64_t flags = int64_t(world) + int64_t(world) * (4 * agmm::kKsplitMaxCtas + h.band_flags);
  const int64_t inbox = 2 * int64_t(world - 1) * (h.skinny_partial_lines + h.skinny_a_lines) * 16;
  h.bytes = (1 + 2 * int64_t(world - 1)) * h.partial_floats * 4 + flags * 8 + inbox;
  return h;
}

int64_t nsplit_partial_floats(const AgmmConfig& cfg, int world) {
  if (cfg.ksplit_max_m <= 0 || cfg.ksplit_max_n <= 0) return 0;
  return cfg.ksplit_max_m * ceil_div(ceil_div(cfg.ksplit_max_n, world), 8) * 8;
}

// `auto`, from the 2xH200 benches (docs/PERFORMANCE.md: r19-r22 at N = 3584 / 4096 / 7168,
// K = 8192), the fastest variant per case, never slower than bsp beyond noise:
//  gather_dim 1 (K-sharded A): where B is replicated and within ksplit's capacity, ksplit below
//    kNsplitMinM (r25-r38: 1.9-2.3x the best bsp at M <= 16, 1.5-1.7x at 32-64, 1.45-1.6x at 128,
//    1.4-1.45x at 256: it reads half of B and does half the FLOPs) and nsplit from it (r33: 1.26-1.32x
//    at 512, 1.46-1.48x at 1024: it moves 16-bit C blocks, not fp32 partials); else bsp
//    up to M = 128; decomposed up to M = 512 (1.15-1.2x); fused-ce above when its k-loop can start
//    at this rank's own columns (shards a whole number of k-blocks wide: M = 1024, 1.25-1.31x
//    against decomposed's 1.19-1.20x), else decomposed.
//  gather_dim 0 (row-sharded A): decomposed from M x N = 3.5M elements of C on (M = 512 N = 7168:
//    1.06-1.13x; M >= 1024: 1.1-1.45x); below it the copy engine's latency is not hidden (M = 64:
//    decomposed 57 us vs bsp 37-41; M = 512 N = 4096: a tie), so bsp; and only with shards of
//    kDecMinShardRows or more (its per-shard GEMMs; a prediction for W >= 4 from one GPU's GEMM
//    times, not yet measured there).
// One rank (r243, 1 H200, K = 8192): nothing travels, and what the variants above overlap with the
// GEMM is the copy into the returned gathered A, which slows a compute-bound cuBLASLt more than it
// takes alone (gather_dim 0 M = 8192 N = 4096: decomposed 814 us, bsp 759 = the copy then cuBLASLt
// 696), so bsp. gather_dim 1 with ksplit's conditions: its one-kernel skinny path up to
// kSkinnyMaxM (1.15-1.2x bsp), then nsplit, whose one product goes straight into C (M = 256:
// 34-35 us against bsp's 37-38 and the two-kernel ksplit's 40, whose fp32 partial is a pure round
// trip at one rank).
AgmmVariant choose_agmm_variant(const AgmmArgs& a, int world, const AgmmConfig& cfg) {
  const bool ksplit_ok = a.gather_dim == 1 && a.b_replicated && a.m <= cfg.ksplit_max_m && a.n <= cfg.ksplit_max_n;
  if (world == 1)
    return !ksplit_ok ? AgmmVariant::bsp : a.m <= agmm::kSkinnyMaxM ? AgmmVariant::ksplit : AgmmVariant::nsplit;
  if (a.gather_dim == 0)
    return a.m * a.n >= 3'500'000 && a.m / world >= agmm::kDecMinShardRows ? AgmmVariant::decomposed : AgmmVariant::bsp;
  if (ksplit_ok) return a.m >= agmm::kNsplitMinM ? AgmmVariant::nsplit : AgmmVariant::ksplit;
  if (a.m <= 128) return AgmmVariant::bsp;
  if (a.m <= 512) return AgmmVariant::decomposed;
  const int64_t cols = agmm_shard_shape(a.m, a.k, a.gather_dim, world).cols;
  return cols % 64 == 0 ? AgmmVariant::fused_ce : AgmmVariant::decomposed;
}

std::string describe_agmm_launch(AgmmVariant requested, AgmmVariant runs, const AgmmArgs& a, const AgmmConfig& c) {
  std::ostringstream os;
  os << "all_gather_matmul " << variant_name(requested);
  if (runs != requested) os << " (" << variant_name(runs) << ")";
  os << " M=" << a.m << " N=" << a.n << " K=" << a.k << " gather_dim=" << a.gather_dim << " "
     << gemm::dtype_name(a.dtype) << " B " << gemm::layout_name(a.b_layout) << (a.b_replicated ? " replicated" : "")
     << "; config max_m=" << c.max_m
     << " max_k=" << c.max_k << " bsp_symmetric=" << c.bsp_symmetric << " push_ctas=" << c.push_ctas
     << " col_chunk=" << c.col_chunk << " side_gather_ctas=" << c.side_gather_ctas
     << " ksplit_max_m=" << c.ksplit_max_m << " ksplit_max_n=" << c.ksplit_max_n;
  for (const char* knob : {agmm::kKsplitPathEnv, agmm::kKsplitExchangeEnv})
    if (const char* v = std::getenv(knob); v != nullptr && *v != '\0') os << " " << knob << "=" << v;
  return os.str();
}

}  // namespace taxfree
