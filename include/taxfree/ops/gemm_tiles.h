// The tile configurations compiled into the library: the one list that validation, the heuristic
// and the kernel dispatch all read. Each entry costs up to 4 kernels (bf16/fp16 x B layouts) of
// compile time; add one only with a shape that needs it. Split-K is a run-time choice of every
// entry (no extra kernels); a cluster size (along M or along K) is a separate entry.
#pragma once

namespace taxfree::gemm {

struct CompiledTile {
  int bm, bn, stages;
  int cluster;        // CTAs along M sharing B by TMA multicast
  bool kn;            // B as [K, N] too (needs bn % 64 == 0: MN-major B is loaded in 64-column boxes)
  bool swap = false;  // swap-AB (gemm_kernel.cuh): C^T = B^T A^T, bm = wgmma N (16..64, 192), bn = 64 per consumer
  int cluster_k = 1;  // CTAs per cluster splitting each tile's K, summed in shared memory (gemm_kernel.cuh)
  // choose_gemm_config offers the tile only as whole tiles (no split-K) of two or more m-blocks,
  // all full or at most 12 with an overlapped last one: where it measured faster (heuristic.cc).
  bool whole_m_blocks = false;
};

// Whether fp32 epilogues (policies.cuh: kFloatOut) are compiled for a tile: they stage 32 columns
// at a time and run without swap-AB.
constexpr bool fp32_epilogue_compiled(bool swap, int bn) { return !swap && bn % 32 == 0; }
constexpr bool fp32_epilogue_compiled(const CompiledTile& t) { return fp32_epilogue_compiled(t.swap, t.bn); }

// Stages fill the 227 KiB of shared memory next to the epilogue staging buffers.
inline constexpr CompiledTile kCompiledTiles[] = {
    {128, 256, 4, 2, true},  // large M: 2 consumer warpgroups x m64n256, B multicast to a CTA pair
    {128, 256, 4, 1, true},  // the same without clusters (odd m-block counts, tuning baseline)
    // 224 columns: N = 3584 k in 16 k n-blocks, so 128 or 256 tiles fill whole waves of 132 SMs where
    // 256 columns leave 12-15% of them idle (M = 256-2048, r158). B [N, K] only (B [K, N] is loaded
    // in 64-column boxes).
    {128, 224, 4, 2, false},
    {128, 224, 4, 1, false},
    // 168 columns, 5 stages (cuBLASLt's tile at M = 768-1536, N = 3584, r295): N = 3584 in 22
    // n-blocks (21.3), so 132 tiles at M = 768 and 264 at M = 1536 where 224 and 256 columns leave
    // SMs idle. B [N, K] only; no fp32 epilogues (BN is not a multiple of 32).
    {128, 168, 5, 1, false, false, 1, true},
    {128, 128, 6, 1, true},  // mid M / narrow N: twice the tiles for better wave fill
    // The same with each tile's K split over a cluster of 2 or 4 CTAs: for too few tiles to fill
    // the GPU (M = 128-256), where split-K's serial reduction through L2 was 10-20% of the time.
    {128, 128, 6, 1, true, false, 2},
    {128, 128, 6, 1, true, false, 4},
    {64, 64, 13, 1, true},   // small M: B-streaming bound, many CTAs and deep pipelines
    // (64 x 32 was dropped: slower than 64 x 64 at every decode shape of the H200 sweep)
    // Swap-AB for M <= 64 (and a few m-blocks beyond): 16 KiB of B per stage whatever M is, so
    // 128-192 KiB of B in flight per SM; split-K / stream-K spread the few tiles over all SMs.
    {16, 128, 12, 1, true, true},  // M <= 16 (decode)
    // The same with each tile's K on a cluster of 2 or 4 CTAs, summed by CTA 0 through distributed
    // shared memory: split-K's spread over the SMs without its serial end through L2.
    {16, 128, 12, 1, true, true, 2},
    {16, 128, 12, 1, true, true, 4},
    {32, 128, 10, 1, true, true},  // M <= 32
    {64, 128, 8, 1, true, true},   // M <= 64, and M up to ~256 as m-blocks that share B through L2
    // Swap-AB over M = 129-192 in one m-block, where 128-row tiles compute a second, partial one's
    // zero rows: 0.933x the plain tiles' time on the 578 grid shapes it took (r335, 1x H100; 24
    // slower, worst 1.19). 128 and 256 rows lost to the plain tiles (r333).
    {192, 128, 4, 1, true, true},
};

}  // namespace taxfree::gemm
