// The persistent, warp-specialised Hopper GEMM: C[M, N] = A[M, K] * B, fp32 accumulation.
//
// CTA = 1 producer warpgroup + BM/64 consumer warpgroups. One producer thread streams k-blocks of
// A (BM x 64) and B (64 x BN) with TMA into a ring of kStages shared-memory stages; each consumer
// warpgroup multiplies its 64 rows of A by B with m64nBNk16 wgmma into BN/2 fp32 registers per
// thread, then writes its 64 x BN band of C (epilogue.cuh). Per stage, "full" (1 arrival + TMA
// bytes) says the data landed and "empty" (one arrival per consumer warp of every CTA that reads
// the stage) says every wgmma reading it has completed. Consumers keep one wgmma group in flight
// across k-blocks and release a stage once the group after it is issued. The producer runs ahead
// into the next unit while consumers do the epilogue.
//
// Clusters (kCluster = 2): the two CTAs of a cluster compute vertically adjacent tiles that need
// the same B tile. Each CTA loads half of B and multicasts it into both CTAs' shared memory, so B
// crosses L2 -> SM once per pair (per CTA-tile and k-block: 16 KiB A + 16 KiB B loaded instead of
// 16 + 32 at 128 x 256). A stage is therefore refilled only when the consumers of both CTAs
// released it, and consumers arrive on both CTAs' "empty" barriers.
//
// Swap-AB (kSwapAB, for skinny M): wgmma's M is at least 64, so with M <= 64 most of an A tile
// would be zero fill and the few B columns per CTA would starve the pipeline (and M = 129-192 would
// take two 128-row m-blocks, the second mostly the first's rows again). A swap-AB kernel computes
// C^T = B^T A^T instead: each consumer warpgroup owns 64 columns of C (64 rows of B as [N, K], or one 64-column
// box of B as [K, N], as wgmma's A operand, MN-major with the transpose bit for [K, N]) and
// multiplies them by the BM (16..64, or 192) rows of A as wgmma's K-major B operand: m64nBMk16. The
// producer, the stage layout ([A: BM x 64 | B: BN x 64]), the tensor maps, the work plan and the
// hooks are the same as without swap: a tile is still BM rows x BN columns of C, Ready::wait(tile,
// kb) still precedes the load of A's k-block kb of that tile's rows, and the Order still maps order
// indices to (m-block, n-block). Only the consumers' wgmma operands and the epilogue's orientation
// (store_band_transposed) differ. No clusters: A is what would be shared along N, and it is small.
//
// K clusters (kClusterK = 2 or 4; no M cluster): the kClusterK CTAs of a cluster compute the
// same whole tile, CTA r over k-blocks [kb r / S, kb (r + 1) / S) (S = kClusterK: the K ranges
// split-K S would cut), and sum their fp32 accumulators through distributed shared memory
// instead of split-K's workspace: CTA r sends columns [q BN / S, (q + 1) BN / S) of its
// accumulators into the stage ring of CTA q (send_k_slices), and CTA q adds the S slices in K order
// (the same additions as split-K's reduction, so the same bits) and writes those columns of C.
// Swap-AB bands are small (64 x BM fp32 per consumer): there the other CTAs send their whole
// accumulators to the cluster's CTA 0, which adds them in K order and writes the band. The
// cluster runs together, so no part waits for a slow last one to read everything back through L2
// (split-K's serial end: 4-5 us of 25.6 at M = 128 N = 3584; docs/notes/gemm-tuning.md). Per unit
// every thread of the cluster meets at two cluster barriers (every stage ring is idle; the slices
// have landed), and every thread of the CTA at one more (the ring is read: the producer may refill
// it). The barriers have no deadline of their own: every CTA reaches them unless one of its
// bounded waits traps, which ends the grid. The producer starts a unit's loads only after the
// previous unit's exchange, so the heuristic gives a K cluster no more tiles than clusters fit at
// once.
//
// Work units (tile_scheduler.cuh: WorkPlan) are whole tiles or K ranges over split tiles; a split
// tile's last segment to finish sums the fp32 partials and writes C (epilogue.cuh: reduce_splits).
// A Ready policy may rotate a whole tile's k-loop (policies.cuh: first_k_block); the consumers
// never see which k-block a stage holds, only that the tile's k-blocks arrive one per stage.
//
// Contracts (checked on the host by ops/gemm_launch.cuh): A is [M, K] row-major, B is [N, K]
// (Major::K) or [K, N] (Major::MN) row-major, both described by 2-D tensor maps with 128 B swizzle
// (A box {64, BM}; B box {64, BN / kCluster} for [N, K], {64, 64} for [K, N]). M, N, K tails need
// no padding: TMA fills out-of-bounds elements (even whole boxes) with zeros, exact in K, and the
// epilogue writes only rows < M and columns < N. An m-block reaching past M loads the last BM rows
// of A instead of zero fill (M >= BM, 16-bit epilogues; device::a_row0) and writes only its own
// rows. C must not alias A or B.
//
// Movers (policies.cuh, optional): a Ready policy may add CTAs at the front of the grid whose
// consumer warpgroups move data (e.g. all_gather_matmul's pieces) that the GEMM's producers wait
// for: SM specialization in one kernel.
//
// No printf anywhere in the kernel: a call makes ptxas serialise every wgmma (C7510). Its mbarrier
// waits trap after their deadline without a message; a Ready policy's cross-rank waits
// (dev::wait_geq, whose report on expiry is a call, off the wgmma path) give up as signal.cuh says.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "taxfree/device/dependent_launch.cuh"
#include "taxfree/device/thread_group.cuh"
#include "taxfree/kernels/gemm/epilogue.cuh"
#include "taxfree/kernels/gemm/pipeline.cuh"
#include "taxfree/kernels/gemm/policies.cuh"
#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/kernels/gemm/wgmma.cuh"

namespace taxfree::gemm {

// Compile-time tile configuration: BM rows x BN columns of C per tile.
template <int BM_, int BN_, int kStages_, int kCluster_ = 1, bool kSwapAB_ = false, int kClusterK_ = 1>
struct TileShape {
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int BK = 64;  // one 128 B swizzle row of 16-bit elements
  static constexpr int kStages = kStages_;
  static constexpr int kCluster = kCluster_;  // CTAs along M sharing B by multicast
  static constexpr bool kSwapAB = kSwapAB_;
  static constexpr int kClusterK = kClusterK_;  // CTAs per cluster splitting each tile's K
  static constexpr int kClusterSize = kCluster * kClusterK;
  // Consumer warpgroups each own 64 rows of C (64 columns with swap-AB); kAccN is their wgmma width.
  static constexpr int kConsumers = (kSwapAB ? BN : BM) / 64;
  static constexpr int kAccN = kSwapAB ? BM : BN;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static_assert(kSwapAB || BM == 64 || BM == 128, "BM: one or two consumer warpgroups of 64 rows");
  // 168 and 224 tile N = 3584 into 21.3 and 16 n-blocks (gemm_tiles.h).
  static_assert(kSwapAB || BN == 32 || BN == 64 || BN == 128 || BN == 168 || BN == 224 || BN == 256,
                "BN: a wgmma width");
  // fp32 epilogues stage 32 columns (128 B) per row: tiles whose BN is not a multiple of 32 do
  // without them. The host's copy of this rule: fp32_epilogue_compiled (ops/gemm_tiles.h), checked
  // equal where kernels are instantiated.
  static constexpr bool kFloatEpilogue = !kSwapAB && BN % 32 == 0;
  // 128 and 256 were built and measured (r333), not kept: gemm_tiles.h.
  static_assert(!kSwapAB || BM == 16 || BM == 32 || BM == 64 || BM == 192, "swap-AB BM: 16, 32, 64 or 192 rows");
  static_assert(!kSwapAB || BN == 64 || BN == 128, "swap-AB BN: one or two consumer warpgroups of 64 columns");
  static_assert(kCluster == 1 || (kCluster == 2 && !kSwapAB && BN % 16 == 0),
                "clusters of 2 without swap-AB; each CTA multicasts half of B (whole 8-row swizzle atoms)");
  static_assert(kClusterK == 1 || ((kClusterK == 2 || kClusterK == 4) && kCluster == 1 && (kSwapAB || BN / kClusterK >= 32)),
                "K clusters of 2 or 4 CTAs, without M clusters; each CTA writes at least 32 columns (swap-AB: CTA 0 all)");
};

// Shared memory: [stage 0: A | B] ... [stage S-1] [epilogue staging per consumer] [barriers]
// [split-K flag per consumer].
template <class Shape>
struct SmemLayout {
  static constexpr uint32_t kABytes = Shape::BM * 128;
  static constexpr uint32_t kBBytes = Shape::BN * 128;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;  // also the TMA bytes per stage
  // C columns staged at a time, and the staging row pitch: 16 B past a multiple of 128 B, so the 8
  // rows a warp writes at once fall into distinct banks.
  static constexpr int kChunkN = Shape::BN < 64 ? Shape::BN : Shape::BN % 64 == 0 ? 64 : 56;
  static constexpr uint32_t kEpiPitch = (kChunkN * 2 + 127) / 128 * 128 + 16;
  // Staged rows of C per consumer: 64, or with swap-AB the tile's BM (x its 64 columns).
  static constexpr uint32_t kEpiBytes = (Shape::kSwapAB ? Shape::BM : 64) * kEpiPitch;
  static constexpr uint32_t kEpiOffset = Shape::kStages * kStageBytes;
  static constexpr uint32_t kBarOffset = kEpiOffset + Shape::kConsumers * kEpiBytes;
  static constexpr uint32_t kFlagOffset = kBarOffset + 2 * Shape::kStages * 8;
  static constexpr uint32_t kBytes = kFlagOffset + 4 * Shape::kConsumers;
  static constexpr uint32_t kDynamicBytes = kBytes + 1024;  // slack to align the base to 1024 B
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0, "stage buffers must stay 1024-byte aligned (swizzle atoms)");
  static_assert(kBBytes / Shape::kCluster % 1024 == 0, "each multicast half of B must stay 1024-byte aligned");
  static_assert(kDynamicBytes <= 232448, "exceeds the 227 KiB of shared memory per CTA on sm_90");
  // K clusters: what a CTA receives fits in its stage ring: the slices of its columns (every
  // sender's, its own included), or with swap-AB (CTA 0) the other CTAs' whole accumulators.
  static constexpr uint32_t kExchangeBytes =
      Shape::kSwapAB ? (Shape::kClusterK - 1) * Shape::kConsumers * 128 * (Shape::kAccN / 2) * 4
                     : Shape::kClusterK * Shape::kConsumers * 128 * (Shape::BN / 2 / Shape::kClusterK) * 4;
  static_assert(Shape::kClusterK == 1 || kExchangeBytes <= kEpiOffset, "K-cluster exchange exceeds the ring");
};

template <class Order, class Ready, class Epilogue>
struct GemmParams {
  CUtensorMap a;
  CUtensorMap b;
  int m, n, k;
  WorkPlan plan;  // over cluster tiles
  device::SplitWorkspace ws;  // used only if plan.split_tiles() > 0
  typename Order::Params order;
  typename Ready::Params ready;
  typename Epilogue::Params epi;
  // A pipeline (mbarrier) wait traps after this long: kMbarTimeoutNs plus the Ready policy's own
  // deadline (policies.cuh: max_wait_ns), so a producer held by another rank's flag reports first.
  uint64_t stall_ns;
};

namespace device {

// This CTA's share of a K-cluster unit: K range krank of kClusterK (a whole tile's k-blocks).
template <class Shape>
__device__ __forceinline__ void k_cluster_range(WorkSegment& w, int krank) {
  if constexpr (Shape::kClusterK > 1) {
    const int n = w.kb_end - w.kb_begin;
    w.kb_end = w.kb_begin + n * (krank + 1) / Shape::kClusterK;
    w.kb_begin += n * krank / Shape::kClusterK;
  }
}

// A K cluster's meeting points of one unit, for the threads that neither send nor sum (the
// producer warpgroup): every ring is idle, the slices have landed, this CTA's ring is read.
__device__ __forceinline__ void k_cluster_pass() {
  cluster_sync();
  cluster_sync();
  cta_sync_unaligned();
}

// Slice q (columns [q BN / S, (q + 1) BN / S) of this consumer's 64 x BN accumulators) into the
// stage ring of CTA q of the K cluster, at [sender krank][consumer][column group][row half][thread]
// (float2; a warp's stores are 256 contiguous bytes). Every CTA's ring is idle (first meeting).
template <class Shape>
__device__ __forceinline__ void send_k_slices(const float (&acc)[Shape::BN / 2], uint32_t ring, int krank,
                                              int consumer) {
  constexpr int kS = Shape::kClusterK, kGroups = Shape::BN / 8 / kS;  // 8-column groups per slice
  const int tid = threadIdx.x % 128;
  const uint32_t offset = uint32_t((krank * Shape::kConsumers + consumer) * kGroups * 2 * 128 + tid) * 8;
#pragma unroll
  for (int q = 0; q < kS; ++q) {
    const uint32_t dst = map_to_cta(ring, uint32_t(q)) + offset;
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int f = 4 * (q * kGroups + g) + 2 * h;
        st_cluster_f32x2(dst + uint32_t((g * 2 + h) * 128 * 8), acc[f], acc[f + 1]);
      }
  }
}

// This CTA's slice of the tile: the kClusterK senders' slices in its ring added in K order (after
// the second meeting), in the fragment order of a 64 x BN / S accumulator.
template <class Shape>
__device__ __forceinline__ void sum_k_slices(float (&slice)[Shape::BN / 2 / Shape::kClusterK], uint32_t ring,
                                             int consumer) {
  constexpr int kS = Shape::kClusterK, kGroups = Shape::BN / 8 / kS;
  const int tid = threadIdx.x % 128;
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float2 sum{};
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const float2 x = ld_shared_f32x2(ring + uint32_t((((s * Shape::kConsumers + consumer) * kGroups + g) * 2 + h) * 128 + tid) * 8);
        sum = s == 0 ? x : make_float2(sum.x + x.x, sum.y + x.y);
      }
      slice[4 * g + 2 * h] = sum.x, slice[4 * g + 2 * h + 1] = sum.y;
    }
}

// Swap-AB: this CTA's (krank > 0) whole accumulator into CTA 0's ring at [krank - 1][consumer]
// [pair][thread] (float2), after the first meeting.
template <class Shape>
__device__ __forceinline__ void send_k_partial(const float (&acc)[Shape::kAccN / 2], uint32_t ring, int krank,
                                               int consumer) {
  constexpr int kPairs = Shape::kAccN / 4;
  const uint32_t dst = map_to_cta(ring, 0u) +
                       uint32_t((((krank - 1) * Shape::kConsumers + consumer) * kPairs) * 128 + threadIdx.x % 128) * 8;
#pragma unroll
  for (int f = 0; f < kPairs; ++f) st_cluster_f32x2(dst + uint32_t(f * 128 * 8), acc[2 * f], acc[2 * f + 1]);
}

// Swap-AB, CTA 0: the other CTAs' accumulators added to its own in K order (after the second
// meeting): the additions of split-K's reduction, so the same bits.
template <class Shape>
__device__ __forceinline__ void add_k_partials(float (&acc)[Shape::kAccN / 2], uint32_t ring, int consumer) {
  constexpr int kPairs = Shape::kAccN / 4;
#pragma unroll
  for (int s = 1; s < Shape::kClusterK; ++s)
#pragma unroll
    for (int f = 0; f < kPairs; ++f) {
      const float2 x =
          ld_shared_f32x2(ring + uint32_t((((s - 1) * Shape::kConsumers + consumer) * kPairs + f) * 128 + threadIdx.x % 128) * 8);
      acc[2 * f] += x.x, acc[2 * f + 1] += x.y;
    }
}

// The first row of A a CTA loads for m-block `m_block`: overlapped with the m-block before it
// where the m-block reaches past M (tile_scheduler.cuh: overlapped_row0). fp32 epilogues keep their
// 64-row bands aligned (band_done names a band by row0 / 64), so their last m-block loads zero fill.
template <class Shape, class Epi>
__device__ __forceinline__ int a_row0(int m_block, int m) {
  const int64_t first = int64_t(m_block) * Shape::BM;
  return int(float_out<Epi>() ? first : overlapped_row0(first, Shape::BM, m));
}

template <class Shape, Major kMajorB, class Order, class Ready, class Epi>
__device__ __forceinline__ void produce(const GemmParams<Order, Ready, Epi>& p, uint32_t base, int rank, int krank,
                                        int cluster, int clusters) {
  using L = SmemLayout<Shape>;
  constexpr int kBoxesB = Shape::BN / 64;  // [K, N] B: 64-column boxes per stage
  static_assert(kMajorB == Major::K || Shape::BN % (64 * Shape::kCluster) == 0,
                "B [K, N] is loaded in whole 64-column boxes (each CTA of a cluster multicasts whole boxes)");
  const uint32_t full0 = base + L::kBarOffset, empty0 = full0 + 8 * Shape::kStages;
  uint32_t stage = 0, phase = 0;
  for (SegmentWalk walk(p.plan, cluster, clusters); !walk.done();) {
    WorkSegment w = walk.get();
    walk.next(w);
    k_cluster_range<Shape>(w, krank);
    const TileCoord ct = Order::at(p.order, p.plan.grid, w.t);
    const TileCoord tile{ct.m * Shape::kCluster + rank, ct.n};
    const int m0 = a_row0<Shape, Epi>(tile.m, p.m), n0 = tile.n * Shape::BN;
    const int rot = first_k_block<Ready>(p.ready, tile), k_blocks = (p.k + 63) / 64;
    for (int i = w.kb_begin; i < w.kb_end; ++i) {
      const int kb = i + rot < k_blocks ? i + rot : i + rot - k_blocks;
      const uint32_t full = full0 + 8 * stage, a_dst = base + stage * L::kStageBytes, b_dst = a_dst + L::kABytes;
      // The consumers of every CTA this stage's B lands in are done with its last use.
      mbar_wait<false>(empty0 + 8 * stage, phase ^ 1, p.stall_ns);
      mbar_arrive_expect_tx(full, L::kStageBytes);  // A, and all of B (this CTA's half + the peer's)
      if constexpr (Shape::kCluster == 1) {
        if constexpr (kMajorB == Major::K) {
          tma_load_2d(b_dst, &p.b, kb * 64, n0, full);
        } else {
#pragma unroll
          for (int j = 0; j < kBoxesB; ++j) tma_load_2d(b_dst + j * 8192, &p.b, n0 + 64 * j, kb * 64, full);
        }
      } else {
        constexpr uint16_t kAll = (1u << Shape::kCluster) - 1;
        if constexpr (kMajorB == Major::K) {
          constexpr int kRows = Shape::BN / Shape::kCluster;
          tma_load_2d_multicast(b_dst + rank * kRows * 128, &p.b, kb * 64, n0 + rank * kRows, full, kAll);
        } else {
#pragma unroll
          for (int j = 0; j < kBoxesB; ++j)
            if (j % Shape::kCluster == rank)
              tma_load_2d_multicast(b_dst + j * 8192, &p.b, n0 + 64 * j, kb * 64, full, kAll);
        }
      }
      Ready::wait(p.ready, tile, kb);  // B is already in flight while A's producer catches up
      tma_load_2d(a_dst, a_map<Ready>(p.ready, &p.a, tile, kb), kb * 64, m0, full);
      if (++stage == Shape::kStages) stage = 0, phase ^= 1;
    }
    if constexpr (Shape::kClusterK > 1) k_cluster_pass();  // the ring is the exchange buffer until it is read
  }
}

// Releases a stage: one arrival per warp on the "empty" barrier of every CTA that holds its B.
template <class Shape>
__device__ __forceinline__ void release_stage(uint32_t empty) {
  if constexpr (Shape::kCluster == 1) {
    mbar_arrive(empty);
  } else {
#pragma unroll
    for (int r = 0; r < Shape::kCluster; ++r) mbar_arrive_cluster(map_to_cta(empty, r));
  }
}

template <class Shape, class T, Major kMajorB, class Order, class Ready, class Epi>
__device__ __forceinline__ void consume(const GemmParams<Order, Ready, Epi>& p, uint32_t base, uint8_t* smem,
                                        int consumer, int rank, int krank, int cluster, int clusters) {
  using L = SmemLayout<Shape>;
  constexpr int kAccN = Shape::kAccN;
  const uint32_t full0 = base + L::kBarOffset, empty0 = full0 + 8 * Shape::kStages;
  const uint32_t bar = 1 + consumer;  // this warpgroup's named barrier
  const int lane = threadIdx.x % 32;
  uint8_t* staging = smem + L::kEpiOffset + consumer * L::kEpiBytes;
  auto* flag = reinterpret_cast<volatile uint32_t*>(smem + L::kFlagOffset) + consumer;
  float acc[kAccN / 2];
  uint32_t stage = 0, phase = 0;

  for (SegmentWalk walk(p.plan, cluster, clusters); !walk.done();) {
    WorkSegment w = walk.get();
    walk.next(w);
    k_cluster_range<Shape>(w, krank);
    const TileCoord ct = Order::at(p.order, p.plan.grid, w.t);
    // Every segment has a k-block (the host keeps units <= k-blocks). Zeroing the accumulators
    // for an empty range instead would cost ptxas a copy of all of them (spills at 128 x 256).
    if (w.kb_begin >= w.kb_end) __trap();
    uint32_t prev = 0;
    for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
      mbar_wait<false>(full0 + 8 * stage, phase, p.stall_ns);
      // This consumer's 64 rows of A (64 columns of B with swap-AB: 64 rows of [N, K] or one
      // 64-column box of [K, N], 8 KiB either way) and the operand all consumers share.
      const uint32_t a_tile = base + stage * L::kStageBytes, b_tile = a_tile + L::kABytes;
      wgmma_fence();
      fence_accumulators(acc);
#pragma unroll
      for (int k16 = 0; k16 < 4; ++k16) {
        const uint32_t scale_d = kb != w.kb_begin || k16 != 0;
        if constexpr (Shape::kSwapAB)
          wgmma_m64k16<kAccN, T, kMajorB, Major::K>(acc, SwizzledOperand<kMajorB>::desc(b_tile + consumer * 8192, k16),
                                                    SwizzledOperand<Major::K>::desc(a_tile, k16), scale_d);
        else
          wgmma_m64k16<kAccN, T, Major::K, kMajorB>(acc, SwizzledOperand<Major::K>::desc(a_tile + consumer * 8192, k16),
                                                    SwizzledOperand<kMajorB>::desc(b_tile, k16), scale_d);
      }
      wgmma_commit();
      if (kb > w.kb_begin) {
        wgmma_wait<1>();  // the previous k-block's group is complete: its stage can be refilled
        if (lane == 0) release_stage<Shape>(empty0 + 8 * prev);
      }
      prev = stage;
      if (++stage == Shape::kStages) stage = 0, phase ^= 1;
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (lane == 0) release_stage<Shape>(empty0 + 8 * prev);

    // This consumer's band of C: 64 rows from row0 x BN columns from col0, or with swap-AB BM rows
    // x 64 columns, of which rows from row_lo (the m-block's first; an overlapped last m-block
    // computed rows of the one before it) are this tile's. A band wholly past M (the M tail of a
    // cluster tile) or before row_lo, or past N with swap-AB, has nothing to write; a split tile's
    // segment that is not the last to finish only parks its partial.
    const int m_block = ct.m * Shape::kCluster + rank;
    const int64_t row_lo = int64_t(m_block) * Shape::BM;
    const int64_t row0 = a_row0<Shape, Epi>(m_block, p.m) + (Shape::kSwapAB ? 0 : consumer * 64);
    const int64_t col0 = int64_t(ct.n) * Shape::BN + (Shape::kSwapAB ? consumer * 64 : 0);
    // Fragment rows: rows of C, or columns of C with swap-AB.
    const int64_t frag_rows_left = Shape::kSwapAB ? p.n - col0 : p.m - row0;
    bool write = frag_rows_left > 0 && row0 + (Shape::kSwapAB ? Shape::BM : 64) > row_lo;
    if (write && w.parts > 1) {
      const int64_t band = ((w.slot * p.plan.max_parts) * Shape::kCluster + rank) * Shape::kConsumers + consumer;
      const int64_t part_stride = int64_t(Shape::kCluster) * Shape::kConsumers * 64 * kAccN / 2;
      const int64_t counter = (w.slot * Shape::kCluster + rank) * Shape::kConsumers + consumer;
      const int valid_rows = frag_rows_left < 64 ? int(frag_rows_left) : 64;
      write = reduce_splits<kAccN>(acc, p.ws.partials + band * (64 * kAccN / 2), part_stride, w.part, w.parts,
                                   p.ws.counters + counter, flag, bar, valid_rows);
    }
    if constexpr (Shape::kClusterK > 1 && Shape::kSwapAB) {
      static_assert(!float_out<Epi>(), "fp32 epilogues run without swap-AB");
      cluster_sync();  // every CTA's k-loop is done: the rings are idle
      if (krank != 0) send_k_partial<Shape>(acc, base, krank, consumer);
      cluster_sync();  // release / acquire: every accumulator sent to CTA 0 has landed
      if (krank == 0) add_k_partials<Shape>(acc, base, consumer);
      cta_sync_unaligned();  // the ring is read: the producer may refill it
      if (write && krank == 0)
        store_band_transposed<Shape::BM, L::kEpiPitch, T, Epi>(p.epi, row_lo, p.m, p.n, acc, staging, bar, row0, col0);
    } else if constexpr (Shape::kClusterK > 1) {
      static_assert(!float_out<Epi>(), "fp32 epilogues count 64 x BN bands; K clusters write 64 x BN / S slices");
      constexpr int kSliceN = Shape::BN / Shape::kClusterK;
      float slice[kSliceN / 2];
      cluster_sync();  // every CTA's k-loop is done: the rings are idle
      send_k_slices<Shape>(acc, base, krank, consumer);
      cluster_sync();  // release / acquire: every slice sent to this CTA has landed
      sum_k_slices<Shape>(slice, base, consumer);
      cta_sync_unaligned();  // the ring is read: the producer may refill it
      if (write)
        store_band<kSliceN, (kSliceN < L::kChunkN ? kSliceN : L::kChunkN), L::kEpiPitch, T, Epi>(
            p.epi, row_lo, p.m, p.n, slice, staging, bar, row0, col0 + krank * kSliceN);
    } else if (write) {
      if constexpr (Shape::kSwapAB) {
        static_assert(!float_out<Epi>(), "fp32 epilogues run without swap-AB");
        store_band_transposed<Shape::BM, L::kEpiPitch, T, Epi>(p.epi, row_lo, p.m, p.n, acc, staging, bar, row0, col0);
      } else if constexpr (float_out<Epi>()) {
        static_assert(Shape::kFloatEpilogue, "fp32 epilogues stage 32-column chunks");
        store_band_f32<Shape::BN, L::kEpiPitch, Epi>(p.epi, p.m, p.n, acc, staging, bar, row0, col0);
      } else {
        store_band<Shape::BN, L::kChunkN, L::kEpiPitch, T, Epi>(p.epi, row_lo, p.m, p.n, acc, staging, bar, row0, col0);
      }
    }
  }
}

}  // namespace device

template <class Shape, class T, device::Major kMajorB, class Order, class Ready, class Epi>
__global__ void __launch_bounds__(Shape::kThreads, 1)
    gemm_kernel(const __grid_constant__ GemmParams<Order, Ready, Epi> p) {
  using namespace device;
  using L = SmemLayout<Shape>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Mover CTAs (policies.cuh) come first, whole clusters of them. They go through the same set-up
  // and register split as GEMM CTAs and then move data on their consumer warpgroups (a mover path
  // before the split made ptxas spill the consumers' registers).
  constexpr bool kMovers = requires { Ready::move(p.ready, 0, 1, dev::ThreadGroup{}); };
  const int movers = kMovers ? mover_ctas<Ready>(p.ready) : 0;
  const bool mover = kMovers && int(blockIdx.x) < movers;
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t pad = ((raw + 1023) & ~1023u) - raw;  // the same in every CTA of a cluster
  const uint32_t base = raw + pad;
  // 1-D grid of 1-D clusters after the movers: CTA rank r of GEMM cluster c is block
  // movers + c * kCluster + r (movers is a multiple of kCluster, so r is also the hardware rank).
  // With K clusters, CTA krank of cluster c is block movers + c * kClusterK + krank instead.
  const int block = int(blockIdx.x) - movers;
  const int rank = block % Shape::kCluster, krank = block % Shape::kClusterK;
  const int cluster = block / Shape::kClusterSize, clusters = (int(gridDim.x) - movers) / Shape::kClusterSize;
  static_assert(Shape::kClusterK == 1 || !kMovers, "K clusters run without mover CTAs");

  if (threadIdx.x == 0) {
    for (int s = 0; s < Shape::kStages; ++s) {
      mbar_init(base + L::kBarOffset + 8 * s, 1);
      mbar_init(base + L::kBarOffset + 8 * (Shape::kStages + s), 4 * Shape::kConsumers * Shape::kCluster);
    }
    fence_mbar_init();
    prefetch_tensor_map(&p.a);
    prefetch_tensor_map(&p.b);
  }
  // The peer CTA multicasts into this CTA's barriers and arrives on them: they must be initialised
  // cluster-wide before anyone issues a load.
  if constexpr (Shape::kCluster > 1) cluster_sync();
  else __syncthreads();
  // A dependent launch (launch_gemm): the set-up above overlapped the tail of the grid ahead
  // on the stream; A, B, C, the split-K workspace and the Ready flags are touched only after it.
  dev::wait_prior_grid();

  const int warpgroup = threadIdx.x / 128;
  // Two consumers need 2 x 128 x 232 registers for 128 fp32 accumulators each plus addressing;
  // the producer gives up most of its share (ptxas assigns 168 = 65536 / 384 at launch). Swap-AB
  // consumers of up to 64 rows hold at most 32 accumulators: everyone keeps 168, and the producer's
  // Ready policy (e.g. the all-gather piece waits) does not spill under a 40-register cap; wider
  // swap-AB tiles (64-128 accumulators) rebalance like the plain ones. setmaxnreg.inc waits
  // until the CTA's own pool (168 per thread at launch) has the registers, so the consumers may
  // take exactly what the producer gives back (a 64 / 224 split deadlocked).
  // A Ready policy that waits spills about 210 B under 40 registers, reloaded on the producer's
  // path: it keeps 64 and the consumers 216 (of the 168 x 384 the CTA launched with).
  constexpr bool kRebalance = Shape::kConsumers > 1 && (!Shape::kSwapAB || Shape::kAccN > 64);
  constexpr bool kPlainProducer = light_producer<Ready>();
  constexpr int kProducerRegs = kPlainProducer ? 40 : 64, kConsumerRegs = kPlainProducer ? 232 : 216;
  static_assert(!kRebalance || 128 * kProducerRegs + 128 * Shape::kConsumers * kConsumerRegs <= 168 * Shape::kThreads,
                "the consumers would wait forever for registers the producer does not give back");
  if (warpgroup == 0) {
    if constexpr (kRebalance) setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0 && !mover) {
      produce<Shape, kMajorB>(p, base, rank, krank, cluster, clusters);
    } else if constexpr (Shape::kClusterK > 1) {
      for (SegmentWalk walk(p.plan, cluster, clusters); !walk.done(); walk.next(walk.get())) k_cluster_pass();
    }
  } else {
    if constexpr (kRebalance) setmaxnreg_inc<kConsumerRegs>();
    if (!mover)
      consume<Shape, T, kMajorB>(p, base, smem_raw + pad, warpgroup - 1, rank, krank, cluster, clusters);
    else if constexpr (kMovers)
      // Named barrier 1: a mover CTA runs no consumer, so none of theirs (1 + consumer) is in use.
      Ready::move(p.ready, int(blockIdx.x), movers, dev::ThreadGroup{threadIdx.x - 128, 128u * Shape::kConsumers, 1});
  }
  // Peers may still arrive on this CTA's barriers (their last stage releases): stay until all are done.
  if constexpr (Shape::kCluster > 1) cluster_sync();
}

}  // namespace taxfree::gemm
