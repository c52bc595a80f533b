// The single-GPU split-KV decode kernel and the cross-rank combine kernel, assembled from the
// building blocks (attend_chunk.h, combine.h). Templates only; src/ops/flash_decode instantiates
// them (one .cu per dtype x head_dim) and launches them after validation.
//
// decode_partial_kernel<T, D, kPaged> — grid (num_splits, kv_heads, batch), kThreads threads,
// decode_smem_bytes<D>() dynamic shared memory (96 KB, two CTAs per SM; config.h).
//   CTA (s, h, z) attends split s of sequence b = batch_at(p, z)'s slice (params.h) for the query
//   heads of KV head h. With one effective split it writes the outputs directly; otherwise it
//   stores its partial in the workspace, and the last of the sequence's splits to finish (atomic
//   arrival counter) merges them and writes the outputs: one kernel, no separate combine launch.
//
// combine_kernel — grid ceil(rows / kCombineRows), kThreads threads, static shared memory.
//   Merges `world` rank partials per row (the BSP combine after the all-gather).
//
// The fused multi-rank kernel (fused_decode_kernel.h) reuses these pieces the same way per work
// item: cta_attend_chunk, the workspace store + cta_arrive_last + cta_combine_partials of the
// splits, then the group's partial sent to every peer and combined across ranks as the peers'
// partials arrive (partial_exchange.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "taxfree/device/dependent_launch.cuh"
#include "taxfree/kernels/attention/attend_chunk.h"
#include "taxfree/kernels/attention/combine.h"
#include "taxfree/kernels/attention/params.h"

namespace taxfree::attention {

template <int D>
constexpr int decode_smem_bytes() {
  return int(sizeof(AttendSmem<D, stages_for(D)>));
}

template <class T, int D, bool kPaged>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) decode_partial_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int kStages = stages_for(D);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<AttendSmem<D, kStages>*>(smem_raw);
  // Launched as a dependent launch: nothing is read before the grid ahead is done. No
  // allow_dependent_grid, as in the fused kernel: without it decode-only ran 0.978-0.995 of its
  // time at batch <= 2 and the same at batch 4-32 (r155, world 1).
  dev::wait_prior_grid();

  const int split = blockIdx.x, kvh = blockIdx.y, b = batch_at(p, blockIdx.z);
  const TokenRange slice = slice_of(p.kv, b);
  const SplitRange sr = split_range(slice, p.num_splits, split);
  if (split >= sr.splits) return;  // beyond this sequence's splits: no work, not counted

  const int group = p.group;
  const int64_t row0 = int64_t(b) * p.q_heads + int64_t(kvh) * group;  // first query row
  const T* q = static_cast<const T*>(p.q) + row0 * D;
  cta_attend_chunk<T, D, kStages, kPaged>(p.kv, q, group, b, kvh, sr.tile_begin, sr.tile_end, slice,
                                          p.scale_log2, smem);
  PartialTile<D>& tile = smem.post.tile;

  if (sr.splits > 1) {
    const int64_t bh = int64_t(b) * p.kv_heads + kvh;
    const int64_t part0 = bh * p.num_splits;  // first split partial of (b, kvh)
    cta_store_tile<D>(tile, group, p.ws_o + (part0 + split) * group * D,
                      p.ws_lse + (part0 + split) * group);
    if (!cta_arrive_last(p.ws_count + bh, sr.splits)) return;
    cta_combine_partials<D>(p.ws_o + part0 * group * D, int64_t(group) * D, p.ws_lse + part0 * group,
                            group, sr.splits, group, smem.post.scratch, tile);
  }

  if (p.o_part != nullptr) cta_store_tile<D>(tile, group, p.o_part + row0 * D, nullptr);
  if (p.lse_part != nullptr)
    for (int r = threadIdx.x; r < group; r += kThreads) p.lse_part[row0 + r] = tile.lse[r];
  if (p.out != nullptr) cta_store_tile_as<T, D>(tile, group, static_cast<T*>(p.out) + row0 * D);
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads) combine_kernel(const __grid_constant__ CombineParams p) {
  __shared__ PartialTile<D> tile;
  __shared__ CombineScratch scratch;
  const int64_t r0 = int64_t(blockIdx.x) * kCombineRows;
  const int rows = int(p.rows - r0 < kCombineRows ? p.rows - r0 : kCombineRows);
  cta_combine_partials<D>(p.o_parts + r0 * D, p.o_rank_stride, p.lse_parts + r0, p.lse_rank_stride,
                          p.world, rows, scratch, tile);
  if (p.out != nullptr) cta_store_tile_as<T, D>(tile, rows, static_cast<T*>(p.out) + r0 * D);
  if (p.o_out != nullptr) cta_store_tile<D>(tile, rows, p.o_out + r0 * D, nullptr);
  if (p.lse_out != nullptr)
    for (int r = threadIdx.x; r < rows; r += kThreads) p.lse_out[r0 + r] = tile.lse[r];
}

}  // namespace taxfree::attention
