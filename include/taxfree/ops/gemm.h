// GEMM op: C[M, N] = A[M, K] * B with fp32 accumulation on Hopper (sm_90a), bf16 or fp16 in and out.
//
// Layouts (all row-major, row strides in elements):
//   A  [M, K], stride lda >= K
//   B  [N, K], stride ldb >= K   (BLayout::nk, the PyTorch Linear weight: C = A * B^T)
//      [K, N], stride ldb >= N   (BLayout::kn: C = A * B)
//   C  [M, N], stride ldc >= N
// Requirements (TMA): A, B, C 16-byte aligned; every row stride a multiple of 16 bytes (8 elements).
// M, N, K < 2^31 and row strides < 2^40 bytes are otherwise free (M = 1, N = 3592, K = 8200 are
// fine). C must not overlap A or B.
// launch() validates everything before its first CUDA call and throws taxfree::Error
// (InvalidArgument for a bad value, NotSupported for a config this build does not have).
// launch() is asynchronous on `stream`; it blocks on nothing. Split-K configs (splits_k()) use a
// workspace the library keeps per device and stream (fp32 partial sums and arrival counters that
// the kernel leaves zeroed): a launch that needs more than its stream has grows it with
// stream-ordered cudaMallocAsync / cudaFreeAsync / cudaMemsetAsync on `stream` (no host wait);
// warm up before capturing a CUDA graph. Launches on one stream may share the workspace; never run
// split-K launches of one stream handle from two threads at once. Split-K results do not depend on
// timing: partials are summed in a fixed order. The kernel goes as a programmatic dependent launch:
// its CTAs may be placed and set up while the kernel ahead on `stream` finishes, and it touches no
// memory before that kernel has completed (stream order holds). It does not trigger the kernel
// behind it early.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "taxfree/runtime/dtype.h"

namespace taxfree::gemm {

using taxfree::DType;  // runtime/dtype.h: the library's one element type
using taxfree::dtype_name;
enum class BLayout { nk, kn };

const char* layout_name(BLayout l);  // "nk" / "kn"; "unknown" for a value outside the enum
// "nk" -> nk, "kn" -> kn; any other name: InvalidArgument naming `what` and the name.
BLayout parse_layout(std::string_view name, std::string_view what);

// The most K ranges a split tile is cut into (GemmConfig::splits).
inline constexpr int kMaxSplits = 64;

// How a config cuts K (GemmConfig::splits, split_scope). Tiles that are cut have their fp32
// partial sums reduced by the last CTA to finish a part of them.
enum class SplitScope {
  all,     // splits > 1: every tile in `splits` K ranges: classic split-K, for too few tiles to
           // fill the GPU (small M x N, decode)
  tail,    // splits > 1: only the tiles of the last, partial wave of the persistent grid; the
           // other tiles run whole
  stream,  // stream-K (splits unused): the last partial wave plus one full wave (all tiles when
           // under one wave) share out their k-blocks equally, one contiguous range per cluster
};

// Launch geometry. Only the tile shapes listed by compiled_configs() exist; the heuristic returns
// one of them.
//
// Swap-AB (swap_ab, for skinny M): the kernel computes C^T = B^T A^T so that N fills wgmma's 64-row
// M dimension and M sits in its narrow N dimension (16, 32, 64, or 192: M up to 192 in one m-block,
// choose_gemm_config below). bm is then the rows of C per tile (any M works: as without swap, an m-block reaching
// past M loads the last bm rows of A and writes only its own rows, kernels/gemm/gemm_kernel.cuh;
// with M < bm the rows past M are zero fill), bn = 128 columns (two consumer warpgroups of 64),
// cluster_m = 1. Same inputs, layouts, alignment rules,
// hooks and split-K as without swap; C is written row by row through shared memory (16-byte
// vectors). Ready policies see the same (tile, k_block) calls: tile.m counts m-blocks of bm rows of
// A, and the wait comes before the TMA load of A's k-block k_block for those rows. Tile orders map
// to the same (m-block, n-block) tiles; with M <= bm there is one m-block, so rotating it changes
// nothing.
//
// K clusters (cluster_k = 2 or 4; compiled for the 128 x 128 tile and the 16 x 128 swap-AB tile):
// each tile is computed by a cluster of cluster_k CTAs, one K range each (the ranges split-K
// cluster_k would cut), whose fp32 sums are added in shared memory across the cluster (K order, so
// the same bits as split-K cluster_k) instead of through a global workspace. No workspace; the
// plain epilogue only (not fp32 epilogues); needs ceil(K / 64) >= cluster_k and no split-K on top
// (splits = 1, scope all). A unit's loads wait for the previous unit's exchange, so it pays when
// every tile's cluster is resident at once.
struct GemmConfig {
  int bm = 128;      // rows of C per tile: 64 (one consumer warpgroup) or 128 (two); 16/32/64/192 with swap_ab
  int bn = 256;      // columns of C per tile: 64, 128, 256, or 224 / 168 (B [N, K] only: N = 3584 k in whole waves)
  int bk = 64;       // K per pipeline stage (fixed: one 128-byte swizzle row)
  int stages = 4;    // depth of the TMA -> wgmma ring
  int cluster_m = 1; // CTAs per cluster along M sharing B by TMA multicast: 1 or 2 (compiled tiles)
  int group_m = 8;   // m-blocks per rasterisation group (L2 reuse), >= 1; counted in cluster tiles
  int splits = 1;    // K ranges per split tile (all, tail), 1..kMaxSplits (1: no split-K); capped at ceil(K / 64)
  SplitScope split_scope = SplitScope::all;
  bool splits_k() const { return splits > 1 || split_scope == SplitScope::stream; }
  int max_ctas = 0;  // persistent CTAs; 0 = as many as fit (one per SM), else at least one cluster (cluster_m x cluster_k).
                     // Fewer leaves SMs to concurrent kernels; rounded down to whole clusters
  bool swap_ab = false;  // swap-AB kernel (see above)
  int cluster_k = 1;     // CTAs per cluster splitting each tile's K (see above): 1, 2 or 4 (compiled tiles)
  // Consumer warpgroups per CTA: each owns 64 rows of C (64 columns with swap_ab).
  int consumers() const { return (swap_ab ? bn : bm) / 64; }
  // e.g. "128x256x64 s4 g8 c2 sk3t" (sk3: split-K 3, t: tail, stk: stream-K), "16x128x64 s12 g1 swap stk",
  // "128x128x64 s6 g1 ck4" (K clusters of 4)
  std::string name() const;
};

struct GemmArgs {
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::bf16;
  BLayout b_layout = BLayout::nk;
};

// Tile configurations compiled into the library (group_m and max_ctas at their defaults).
std::vector<GemmConfig> compiled_configs();

// Whether choose_gemm_config may, must, or must not return a swap-AB config.
enum class SwapAB { choose, always, never };

// How a config choose_gemm_config returns may cut K: not at all (whole tiles: A-ready policies that
// wait for their tile's A), split-K (a Ready policy or fp32 epilogue that allows split-K but counts
// whole 64 x bn bands), or split-K and K clusters (the plain GEMM).
enum class KCuts { none, split, split_or_cluster };

// What the caller's epilogue writes: 16-bit C (every tile), or fp32 (policies.cuh: kFloatOut; only
// tiles with fp32 epilogues compiled, gemm_tiles.h).
enum class EpilogueOutput { bits16, fp32 };

// Everything about A, B, sizes and the config; no CUDA call. Throws taxfree::Error.
void validate_inputs(const GemmArgs& args, const GemmConfig& cfg);
// validate_inputs plus C (pointer, alignment, ldc, no overlap with A or B).
void validate(const GemmArgs& args, const GemmConfig& cfg);

// Tile configuration for a shape: the compiled config with the least estimated time on a GPU with
// `num_sms` SMs (H200/H100 SXM: 132), and a group_m that keeps one wave's A and B panels small.
// `cuts` limits how K may be cut (KCuts above). Swap-AB configs are candidates for small M (up to
// 192 rows, on the narrowest swap-AB tile that covers M) unless `swap` says never; `always` returns
// the best swap-AB config for any M (beyond 192 rows on the 192-row tile). `out`
// limits the tiles to those compiled for the caller's epilogue (fp32: no swap-AB, so with `always`
// there is none: NotSupported). Thread-safe; answers are kept per argument set (ranking costs tens of
// microseconds of host time, a lookup well under one).
GemmConfig choose_gemm_config(int64_t m, int64_t n, int64_t k, DType dtype, BLayout b_layout, int num_sms = 132,
                              KCuts cuts = KCuts::split_or_cluster, SwapAB swap = SwapAB::choose,
                              EpilogueOutput out = EpilogueOutput::bits16);

// The ranking behind choose_gemm_config, for tools and tests: every candidate it weighs for these
// arguments, in the order it weighs them (simplest first: a later one replaces the incumbent only
// below kSwitchMargin = 0.97 of its estimate), each with the group_m choose_gemm_config would give it
// and its estimate in seconds (a figure to rank by, not a prediction of the time), and the index of
// the choice. Ranks again on every call (nothing kept). Throws NotSupported where no tile fits.
struct GemmCandidate {
  GemmConfig config;
  double estimate_s = 0;
};
struct GemmRanking {
  std::vector<GemmCandidate> candidates;
  size_t chosen = 0;  // choose_gemm_config returns candidates[chosen].config
};
GemmRanking rank_gemm_configs(int64_t m, int64_t n, int64_t k, DType dtype, BLayout b_layout, int num_sms = 132,
                              KCuts cuts = KCuts::split_or_cluster, SwapAB swap = SwapAB::choose,
                              EpilogueOutput out = EpilogueOutput::bits16);

// Validates (InvalidArgument, NotSupported), then enqueues on `stream`. A split-K config uses the
// stream's workspace, grown (stream-ordered) on first need: that can throw OutOfMemory.
void launch(const GemmArgs& args, const GemmConfig& cfg, cudaStream_t stream);
// With choose_gemm_config for this device.
void launch(const GemmArgs& args, cudaStream_t stream);

// What a launch does before it enqueues (GemmStep::prepare: validation, tensor maps, the stream's
// workspace grown to the plan's need), for callers that enqueue other work first and must not fail
// half-way: a later launch of the same arguments and config on the same stream needs no memory.
enum class GemmStep { prepare, launch };
void prepare(const GemmArgs& args, const GemmConfig& cfg, cudaStream_t stream);
// With choose_gemm_config for this device (what launch(args, stream) will run).
void prepare(const GemmArgs& args, cudaStream_t stream);

// Frees `stream`'s GEMM workspace on the current device (our split-K partials and counters,
// cuBLASLt's; gemm_detail.h), stream-ordered after the work already queued on it; the next GEMM on
// the stream allocates again. Call it before destroying a stream that ran GEMMs: the workspace is
// otherwise kept for the life of the process (and a stream created later with the same handle
// would inherit it). No-op for a stream without one. Team's own stream needs no call: a Team that
// finished cleanly releases it before destroying the stream (runtime/stream_release.h); after a
// failure it does not (its kernels may still run), and the process ends (team.h).
void release_stream_workspace(cudaStream_t stream);

// SMs of the current device (cached per device).
int device_sm_count();

}  // namespace taxfree::gemm
