// The tile configurations compiled into the library: the one list that validation, the heuristic
// and the kernel dispatch all read. Each entry costs up to 4 kernels (bf16/fp16 x B layouts) of
// compile time; add one only with a shape that needs it. Split-K is a run-time choice of every
// entry (no extra kernels); a cluster size is a separate entry.
#pragma once

namespace taxfree::gemm {

struct CompiledTile {
  int bm, bn, stages;
  int cluster;  // CTAs along M sharing B by TMA multicast
  bool kn;      // B as [K, N] too (needs bn % 64 == 0: MN-major B is loaded in 64-column boxes)
};

// Stages fill the 227 KiB of shared memory next to the epilogue staging buffers.
inline constexpr CompiledTile kCompiledTiles[] = {
    {128, 256, 4, 2, true},  // large M: 2 consumer warpgroups x m64n256, B multicast to a CTA pair
    {128, 256, 4, 1, true},  // the same without clusters (odd m-block counts, tuning baseline)
    {128, 128, 6, 1, true},  // mid M / narrow N: twice the tiles for better wave fill
    {64, 64, 13, 1, true},   // small M: B-streaming bound, many CTAs and deep pipelines
    // (64 x 32 was dropped: slower than 64 x 64 at every decode shape of the H200 sweep)
};

}  // namespace taxfree::gemm
