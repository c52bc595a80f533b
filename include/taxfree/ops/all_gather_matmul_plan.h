// Shard and piece bookkeeping of all_gather_matmul: pure functions of the shape, shared by the host
// (validation, tests) and the device (the push kernel, the GEMM's A-ready policy, the ksplit
// exchange). No CUDA calls.
//
// The gathered A is [m, k] row-major. Source rank s contributes one block ("shard"):
//   gather_dim 0: rows    [s * m / world, (s + 1) * m / world), all k columns;
//   gather_dim 1: columns [s * k / world, (s + 1) * k / world), all m rows.
// Each shard is cut into pieces of row_chunk x col_chunk elements (the last row / column of pieces
// may be smaller). A piece is the unit one epoch flag publishes: flag (s, i, j) says piece (i, j)
// of source s has landed in this rank's gathered A.
//
// Send order: a source sends its pieces group by group (group_rows row chunks per group), and
// column-chunk-major inside a group, which is the order in which the GEMM's waves consume them
// (one wave covers a few m-blocks across all of K).
#pragma once

#include <cstdint>

#include "taxfree/device/config.cuh"

namespace taxfree::agmm {

struct Piece {
  int64_t i, j;        // row-chunk and column-chunk index within the shard
  int64_t r0, rows;    // shard-local rows [r0, r0 + rows)
  int64_t c0, cols;    // shard-local columns [c0, c0 + cols)
};

struct PieceGrid {
  int world = 1;
  int gather_dim = 0;
  int64_t m = 0, k = 0;                   // gathered A
  int64_t shard_rows = 0, shard_cols = 0;  // one shard
  int64_t row_chunk = 1, col_chunk = 1;    // piece size (the last ones smaller)
  int64_t row_chunks = 0, col_chunks = 0;  // pieces per shard along each dimension
  int64_t group_rows = 1;                  // row chunks per send group, >= 1

  TF_HOST_DEVICE int64_t pieces() const { return row_chunks * col_chunks; }  // per shard
  TF_HOST_DEVICE int64_t flags() const { return int64_t(world) * pieces(); }
  // Where shard s starts in the gathered A.
  TF_HOST_DEVICE int64_t row0(int s) const { return gather_dim == 0 ? int64_t(s) * shard_rows : 0; }
  TF_HOST_DEVICE int64_t col0(int s) const { return gather_dim == 1 ? int64_t(s) * shard_cols : 0; }
  TF_HOST_DEVICE int64_t flag_index(int s, int64_t i, int64_t j) const {
    return (int64_t(s) * row_chunks + i) * col_chunks + j;
  }

  TF_HOST_DEVICE Piece piece(int64_t i, int64_t j) const {
    Piece p;
    p.i = i, p.j = j;
    p.r0 = i * row_chunk, p.c0 = j * col_chunk;
    p.rows = shard_rows - p.r0 < row_chunk ? shard_rows - p.r0 : row_chunk;
    p.cols = shard_cols - p.c0 < col_chunk ? shard_cols - p.c0 : col_chunk;
    return p;
  }

  // The t-th piece a source sends, t in [0, pieces()): a bijection (GroupedOrder's scheme).
  TF_HOST_DEVICE Piece piece_in_order(int64_t t) const {
    const int64_t per_group = group_rows * col_chunks;
    const int64_t group = t / per_group, first = group * group_rows;
    const int64_t rows = row_chunks - first < group_rows ? row_chunks - first : group_rows;
    const int64_t in = t - group * per_group;
    return piece(first + in % rows, in / rows);
  }
};

// No piece of any source starts at a k-block (64 columns) with kb & piece_start_mask(g) != 0. The
// mask is col_chunk / 64 - 1 when every piece's first column is a multiple of col_chunk (gather_dim
// 0, or shards a multiple of col_chunk wide) and col_chunk / 64 is a power of two; all ones for
// gather_dim 0 pieces as wide as K (only k-block 0 starts any); otherwise 0 (nothing skipped). Lets
// the GEMM's producer skip the piece walk (integer divisions) on most k-blocks.
TF_HOST_DEVICE int piece_start_mask(const PieceGrid& g) {
  if (g.gather_dim == 0 && g.col_chunks == 1) return 0x7fffffff;  // pieces span K: only k-block 0
  const int64_t blocks = g.col_chunk / 64;
  const bool aligned = g.col_chunk % 64 == 0 && (blocks & (blocks - 1)) == 0 &&
                       (g.gather_dim == 0 || g.shard_cols % g.col_chunk == 0);
  return aligned ? int(blocks - 1) : 0;
}

// Calls fn(source, flag_index) for every piece that intersects rows [r_lo, r_hi) x columns
// [c_lo, c_hi) of the gathered A and starts at column >= c_lo. A GEMM producer that walks the
// k-blocks of one tile in order and calls this with each k-block's columns therefore meets every
// piece under the tile's rows exactly once, at the first k-block that needs it. Empty ranges visit
// nothing.
template <class Fn>
TF_HOST_DEVICE void for_each_piece(const PieceGrid& g, int64_t r_lo, int64_t r_hi, int64_t c_lo, int64_t c_hi,
                                   Fn&& fn) {
  // 32-bit arithmetic (m, k < 2^31 by validation): this runs in the GEMM's producer thread, which
  // has few registers.
  if (r_lo >= r_hi || c_lo >= c_hi) return;
  const int rl = int(r_lo), rh = int(r_hi), cl = int(c_lo), ch = int(c_hi);
  const int srows = int(g.shard_rows), scols = int(g.shard_cols), rc = int(g.row_chunk), cc = int(g.col_chunk);
  // Sources whose shard intersects the range along the gathered dimension.
  const bool by_rows = g.gather_dim == 0;
  const int extent = by_rows ? srows : scols, lo = by_rows ? rl : cl, hi = by_rows ? rh : ch;
  const int s_last = (hi - 1) / extent < g.world - 1 ? (hi - 1) / extent : g.world - 1;
  for (int s = lo / extent; s <= s_last; ++s) {
    const int r0 = by_rows ? s * srows : 0, c0 = by_rows ? 0 : s * scols;
    const int lr_lo = rl - r0 > 0 ? rl - r0 : 0, lr_hi = rh - r0 < srows ? rh - r0 : srows;
    const int lc_lo = cl - c0 > 0 ? cl - c0 : 0, lc_hi = ch - c0 < scols ? ch - c0 : scols;
    if (lr_lo >= lr_hi || lc_lo >= lc_hi) continue;
    for (int i = lr_lo / rc; i <= (lr_hi - 1) / rc; ++i)
      for (int j = lc_lo / cc; j <= (lc_hi - 1) / cc; ++j)
        if (c0 + j * cc >= cl) fn(s, g.flag_index(s, i, j));
  }
}

// The k-block at which a GEMM tile of rank `rank` starts its k-loop (wrapping to k-block 0 after
// the last): gather_dim 1 starts at this rank's own columns, so every CTA multiplies the shard it
// already holds while the peers' shards are still in flight, then rank+1's, rank+2's, ... The
// for_each_piece walk stays exact under the rotation (every piece is met at its first k-block,
// before any other k-block of it is loaded) only when every piece starts on a k-block boundary;
// otherwise, and for gather_dim 0, 0 (no rotation).
TF_HOST_DEVICE int first_k_block(const PieceGrid& g, int rank) {
  if (g.gather_dim != 1 || g.shard_cols % 64 != 0 || g.col_chunk % 64 != 0) return 0;
  return int(int64_t(rank) * g.shard_cols / 64);
}

// Work items of the push kernel on rank `rank`: every piece of its shard once for each target
// (this rank itself when the shard must be copied into its own gathered A, and every peer).
// Targets are indexed 0 = self (if copied), then rank-1, rank-2, ... Order:
//  gather_dim 0: rank q's GEMM takes shard q, then q+1, q+2, ...; so this shard is needed first by
//    this rank and by rank-1 (its first remote shard), later by rank-2, ... The local copy and
//    rank-1's pieces alternate (HBM and NVLink busy at once), then the other peers one by one.
//  gather_dim 1: every rank's GEMM walks K in order, so every target needs this shard's pieces at
//    the same time: piece by piece, each to every target.
struct PushItem {
  int target;   // rank whose gathered A receives the piece
  int64_t t;    // position in PieceGrid::piece_in_order
};
TF_HOST_DEVICE int64_t push_items(const PieceGrid& g, bool copy_local) {
  return (int64_t(g.world) - 1 + (copy_local ? 1 : 0)) * g.pieces();
}
TF_HOST_DEVICE PushItem push_item(const PieceGrid& g, int rank, bool copy_local, int64_t x) {
  const int64_t n = g.pieces(), self = copy_local ? 1 : 0, targets = int64_t(g.world) - 1 + self;
  int64_t index, t;  // target index as above, piece position
  if (g.gather_dim == 1) {
    index = x % targets, t = x / targets;
  } else {
    const int64_t first = self + (g.world > 1 ? 1 : 0);  // targets in the interleaved head
    if (x < first * n) index = x % first, t = x / first;
    else index = first + (x - first * n) / n, t = (x - first * n) % n;
  }
  if (index < self) return {rank, t};
  const int64_t back = index - self + 1;  // 1 = rank-1
  return {int((rank - back + 2 * int64_t(g.world)) % g.world), t};
}

// ksplit (gather_dim 1): every rank's fp32 partial P_r [m, ldp] (ldp = n rounded up to 8, so a row
// is whole 8-float groups) is cut into `ctas` slices of consecutive 8-float groups. CTA j of the
// exchange kernel owns slice j on every rank (the same cut everywhere: the shape is the same on
// every rank), so the flag (source, j) tells CTA j of a receiver that slice j of that source has
// landed.
// A receiver keeps world - 1 partial slots per parity, one per peer source (slot()).
constexpr int kKsplitMaxCtas = 1024;  // flags per source

struct KsplitSlices {
  int world = 1;
  int64_t m = 0, n = 0;
  int64_t ldp = 0;         // partial row stride in floats, n rounded up to 8
  int64_t shard_cols = 0;  // columns of A_shard (k / world)
  int ctas = 1;            // 1 .. kKsplitMaxCtas

  struct Range {
    int64_t begin, end;
  };
  TF_HOST_DEVICE int64_t groups() const { return m * (ldp / 8); }  // 8-float groups of one partial
  TF_HOST_DEVICE Range partial_groups(int j) const { return {groups() * j / ctas, groups() * (j + 1) / ctas}; }
  // Slot of `source`'s partial in `receiver`'s buffer (receiver's own partial has none).
  TF_HOST_DEVICE static int slot(int source, int receiver) { return source < receiver ? source : source - 1; }
  TF_HOST_DEVICE static int64_t flag_index(int source, int j) { return int64_t(source) * kKsplitMaxCtas + j; }
  // The rank that sums slice j under the reduce-scatter exchange (ksplit_owner_sums).
  TF_HOST_DEVICE int owner(int j) const { return j % world; }
};

// ksplit-skinny (M <= kSkinnyMaxM): one kernel per rank multiplies and exchanges
// (agmm_ksplit_skinny.cu). C is cut into `slices` column slices of kSkinnySliceCols columns (all M
// rows); CTA j computes slices j, j + ctas, ... of this rank's partial and sends each to every peer
// as LL lines (device/ll_line.cuh: 2 floats per 16-byte line, a slice row is kSkinnyLinesPerRow
// lines, columns >= n included so every slice has the same lines), and sends A_shard as lines too
// (4 elements per line, row-major over [m, shard_cols], CTA j the range a_range(j)). The same cut
// on every rank (the shape is), so CTA j of a receiver waits only for CTA j of its peers.
// A receiver's inbox holds, per parity and per peer source (KsplitSlices::slot), `partial_cap`
// partial lines (partial_line(slice, row) + column pair) followed by the A lines.
// ksplit takes the skinny path up to this M (2 MMA row tiles). Measured on 2x H200 (N = 3584,
// K = 8192): 14-15 us at M <= 16, 22 at 32 (the two-kernel path: 23-26); at M = 64 a 4-tile version
// took 31 us against the two-kernel path's 27 (every CTA re-reads all of A, 2 ring stages), so it
// was removed.
constexpr int64_t kSkinnyMaxM = 32;
// ksplit takes the band path (our GEMM's fp32 epilogue sends the partial band by band) from this M
// on, the two-kernel path between. Measured (r27, N = 3584, K = 8192): bands 65-66 / 108 us at
// M = 512 / 1024 against 69-72 / 123-129, a tie at 256, behind at 64-128 (27 / 35 vs 25 / 31: the
// begin barrier, a second launch and non-swap tiles cost more than the overlap saves there).
constexpr int64_t kBandsMinM = 512;
// The two-kernel path's exchange: all-to-all brings W - 1 partials into each rank; reduce-scatter
// then all-gather of C brings (W - 1) / W of a partial and (W - 1) / W of C in 16 bits, 1.5 (W - 1)
// / W partials, for one more flag latency. It takes the second where that saves at least
// kKsplitOwnerSumMinSavedBytes per rank: at two ranks (a quarter saved) from 3 MB of partial per
// rank, as measured (r41, 2x H200, N = 3584: M = 256, 3.7 MB, 36 vs 37.5-38 us; M = 128, 1.8 MB,
// 28-29 vs 27-28; M = 64 24.5-25 vs 23; r42, against all-to-all everywhere: M = 256 37.0 vs
// 37.3-38.0 us, M = 64-128 the same). At more ranks all-to-all's bytes grow with W: at eight, M =
// 128 N = 3584 (1.8 MB of partial) would bring 12.8 MB into each rank against 2.4 MB, ~28 µs more at
// NVLink's rate, so the switch falls to 135 KB (a prediction: nothing above two ranks is measured).
// One rank has nothing to exchange: all-to-all.
constexpr int64_t kKsplitOwnerSumMinSavedBytes = 768 << 10;
constexpr bool ksplit_owner_sums(int64_t partial_bytes, int world) {
  // saved = (W - 1) P - 1.5 (W - 1) P / W = (W - 1) (2 W - 3) P / (2 W)
  return world >= 2 && int64_t(world - 1) * (2 * world - 3) * partial_bytes >= 2 * world * kKsplitOwnerSumMinSavedBytes;
}
// auto takes nsplit instead of ksplit from this M on (r33, 2x H200, N = 3584, K = 8192: M = 512
// 61-62 vs 68 us, M = 1024 94-98 vs 110; r38: ksplit ahead at 256, 37-38 vs 43-44).
constexpr int64_t kNsplitMinM = 512;
// decomposed at gather_dim 0 starts this rank's GEMM before the begin barrier (the barrier on the
// side stream) when a shard has at most this many rows (r36, 2x H200, N = 4096, K = 8192: M =
// 1024-2048 107-109 / 197-198 us against 112-118 / 202-203; at M = 8192-16384 10-30 us slower,
// the barrier and copies then wait behind the GEMM's CTAs; M = 4096 mixed).
constexpr int64_t kDecEarlyGemmMaxRows = 1024;
// `auto` runs decomposed at gather_dim 0 only where a shard has at least this many rows: it runs one
// cuBLASLt GEMM per shard, one after another, and below 256 rows a shard's GEMM costs far more per
// row than the whole GEMM does (r286, 1x H200, K = 8192, N = 3584 / 4096 / 7168: W x t(M / W)
// against t(M) is 1.9-2.4x at 128 rows, 1.2-1.4x at 256, 0.96-1.07x at 512), more than the
// all-gather it hides costs (~0.04 µs a row of K = 8192 at W = 2 and, by NVLink rate, at W = 8).
// At two ranks the M x N rule below already keeps shards of fewer rows out; from four it matters
// (W = 8, M = 1024, N = 4096: 8 x 26.7 against 86.6 + ~45 µs).
constexpr int64_t kDecMinShardRows = 256;

// ksplit's launch-time environment knobs (all_gather_matmul.h): read at each launch, and part of
// what the launch check mode compares across ranks.
inline constexpr const char* kKsplitPathEnv = "TAXFREE_AGMM_KSPLIT_PATH";
inline constexpr const char* kKsplitExchangeEnv = "TAXFREE_AGMM_KSPLIT_EXCHANGE";
// Throws InvalidArgument naming the variable and its value where either knob is set to anything but
// its two values, as a launch would (for tools that refuse bad settings before any rank starts).
void check_ksplit_knobs();
// pull: the most ranks its GEMM reads A from (one tensor map each in the kernel's parameters).
constexpr int kPullMaxWorld = 8;
constexpr int kSkinnySliceCols = 32;
constexpr int kSkinnyLinesPerRow = kSkinnySliceCols / 2;

// 16-row MMA tiles covering m rows on the skinny path (m <= kSkinnyMaxM): 1 or 2.
TF_HOST_DEVICE int skinny_m_tiles(int64_t m) { return m <= 16 ? 1 : 2; }

struct KsplitSkinny {
  int world = 1;
  int64_t m = 0, n = 0;
  int64_t ldp = 0;         // this rank's own partial [m, ldp] (floats), n rounded up to 8
  int64_t shard_cols = 0;  // columns of A_shard (k / world), a multiple of 8
  int slices = 1;          // ceil(n / kSkinnySliceCols)
  int ctas = 1;            // min(slices, CTAs the GPU holds at once)
  int m_tiles = 1;         // skinny_m_tiles(m)

  TF_HOST_DEVICE int64_t partial_line(int slice, int64_t row) const {
    return (int64_t(slice) * m + row) * kSkinnyLinesPerRow;
  }
  TF_HOST_DEVICE int64_t partial_lines() const { return int64_t(slices) * m * kSkinnyLinesPerRow; }
  TF_HOST_DEVICE int64_t a_lines_per_row() const { return shard_cols / 4; }
  TF_HOST_DEVICE int64_t a_lines() const { return m * a_lines_per_row(); }
  TF_HOST_DEVICE KsplitSlices::Range a_range(int j) const { return {a_lines() * j / ctas, a_lines() * (j + 1) / ctas}; }
};

// nsplit: C's n columns in `world` blocks of `width` columns (a multiple of 8, so every block
// starts 16-byte aligned); block r = [begin(r), begin(r) + cols(r)), the last ones narrower or
// empty when n is small.
struct ColumnBlocks {
  int64_t n = 0, width = 0;
  TF_HOST_DEVICE int64_t begin(int r) const { return r * width < n ? r * width : n; }
  TF_HOST_DEVICE int64_t cols(int r) const { return ((r + 1) * width < n ? (r + 1) * width : n) - begin(r); }
};

// A block all-gather (agmm_block_gather.cu): rank r's block (all m rows, columns
// [blocks.begin(r), blocks.begin(r) + blocks.cols(r))) goes to every rank; CTA j of every rank
// moves rows [rows(j)) of its block and its flag (source, j) tells the peers that part arrived.
// nsplit's C blocks (make_nsplit_plan) and ksplit's A shards on its side stream (shard_gather_plan).
// ctas in [1, kKsplitMaxCtas]; the kernel's waits are on peers, never on CTAs of its own rank.
struct BlockGatherPlan {
  ColumnBlocks blocks;
  int64_t m = 0;
  int ctas = 1;
  TF_HOST_DEVICE KsplitSlices::Range rows(int j) const { return {m * j / ctas, m * (j + 1) / ctas}; }
};

// The A shards as a block all-gather: rank r's shard [m, shard_cols] at columns r * shard_cols of
// the gathered A, the rows cut among min(m, max_ctas) CTAs (max_ctas >= 1).
TF_HOST_DEVICE BlockGatherPlan shard_gather_plan(int64_t m, int64_t shard_cols, int world, int max_ctas) {
  BlockGatherPlan p;
  p.blocks = {int64_t(world) * shard_cols, shard_cols};
  p.m = m;
  p.ctas = int(m < max_ctas ? m : max_ctas);
  return p;
}

// ksplit's two-kernel path gathers the A shards on the op's side stream while its partial GEMM
// runs, with this many CTAs at most: enough SMs to keep NVLink busy (as the exchange kernel: 64 KB
// of stores in flight per SM), few enough to leave the GEMM the rest of the GPU. Not swept yet;
// a share of fewer SMs takes an eighth of them (side_gather_ctas()); AgmmConfig::side_gather_ctas
// overrides it.
constexpr int kSideGatherCtas = 16;

}  // namespace taxfree::agmm
