// Compile-time geometry shared by the split-KV decode building blocks, host code and tests.
//
// Header-only, includable from plain C++ (no device code): the host picks split counts and sizes
// workspaces from the same constants the kernels use.
#pragma once

#if defined(__CUDACC__)
#define TF_HD __host__ __device__
#else
#define TF_HD
#endif

namespace taxfree::attention {

// Tokens per K/V tile. A tile is the unit one warp loads and processes (16 = the k extent of one
// m16n8k16 MMA). Tiles are aligned to absolute token positions (tile t = tokens [16t, 16t+16)),
// so a tile never straddles a page (pages are powers of two >= 16) and contiguous and paged caches
// see exactly the same tiles, hence bitwise identical results.
inline constexpr int kTileTokens = 16;
inline constexpr int kTileShift = 4;

// Warps per decode CTA; each warp runs its own cp.async pipeline over every kWarps-th tile.
inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;

// Query heads per KV head that one CTA serves: the 16 rows of the MMA. GQA ratios 1..16.
inline constexpr int kMaxRows = 16;

// Batches up to this size may carry an order (DecodeParams::batch_order, one byte per sequence in
// the kernel arguments).
inline constexpr int kMaxOrderedBatch = 256;

// Most partials one combine merges: splits of one (batch, kv_head), or ranks of a team.
inline constexpr int kMaxParts = 64;

// Most CTAs per thread-block cluster on sm_90 (16 needs the non-portable cluster size opt-in): the
// most splits the fused decode merges inside a cluster (cluster_merge.h).
inline constexpr int kMaxClusterCtas = 16;
// Partial rows one CTA of a cluster receives for its merge: ctas * ceil(group / ctas) <= group +
// ctas - 1 (cluster_merge.h).
inline constexpr int kClusterSlots = kMaxRows + kMaxClusterCtas - 1;

// Rows (query heads) per CTA of the cross-rank combine kernel: 4 x D/4 float4 = one per thread.
inline constexpr int kCombineRows = 4;

// Fewest tiles a split gets on the device (one per warp); shorter sequences get fewer splits.
inline constexpr int kMinTilesPerSplit = kWarps;

// Direct split merge (direct_merge.h): the most splits per (sequence, KV head) a rank sends raw
// (one waiting thread per (rank, split) of a 128-thread CTA: kDirectMaxWorld x kMaxDirectSplits),
// and the most ranks.
inline constexpr int kMaxDirectSplits = 16;
inline constexpr int kDirectMaxWorld = 8;
// Rows (query heads) of one launch up to which a FlashDecode configured for the direct merge sizes
// its inbox for it: the split partials of small batches only (their lines grow with the splits).
inline constexpr int kDirectMaxRows = 128;
// Per-rank merged rows (D + 1 fp32 each) the direct merge stages in the decode CTA's shared memory,
// in the attention's per-warp accumulators and result tile, idle by then (AttendSmem::Post before
// `scratch`): ranks x the rows a CTA merges must not exceed it (direct_merge_applies checks the
// bound on the host before a launch takes the direct merge).
TF_HD constexpr int direct_stage_rows(int head_dim) {
  return (kWarps * kMaxRows * (head_dim + 3) + kMaxRows * (head_dim + 1)) / (head_dim + 1);
}

// 16-byte low-latency lines per partial row in the fused kernel's exchange (partial_exchange.h):
// D/2 lines of two fp32 o values, one line for the LSE.
TF_HD constexpr int ll_lines_per_row(int head_dim) { return head_dim / 2 + 1; }

// Pipeline depth per warp (K+V tiles of 16 rows): 3 stages of 8 KB (head_dim 128) or 6 of 4 KB
// (head_dim 64) = 96 KB per CTA, so two CTAs fit an SM and even one keeps 4 warps x 2-5 tiles
// (>= 64 KB) of loads in flight: above HBM latency x per-SM bandwidth (~32 KB). A ring twice as
// deep at one CTA per SM measured never faster (docs/notes/decode-latency.md).
TF_HD constexpr int stages_for(int head_dim) { return head_dim == 64 ? 6 : 3; }

// Resident CTAs per SM the decode-family kernels are built for (register budget, and the 96 KB
// ring above); the split heuristic counts waves in these slots.
inline constexpr int kCtasPerSm = 2;

}  // namespace taxfree::attention
