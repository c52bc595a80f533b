// The persistent, warp-specialised Hopper GEMM: C[M, N] = A[M, K] * B, fp32 accumulation.
//
// CTA = 1 producer warpgroup + BM/64 consumer warpgroups. One producer thread streams k-blocks of
// A (BM x 64) and B (64 x BN) with TMA into a ring of kStages shared-memory stages; each consumer
// warpgroup multiplies its 64 rows of A by B with m64nBNk16 wgmma into BN/2 fp32 registers per
// thread, then writes its 64 x BN part of C through a small staging buffer and the Epilogue policy.
// Per stage, "full" (1 arrival + TMA bytes) says the data landed and "empty" (one arrival per
// consumer warp) says every wgmma reading it has completed. Consumers keep one wgmma group in
// flight across k-blocks and release a stage once the group after it is issued. The producer runs
// ahead into the next tile while consumers do the epilogue.
//
// Contracts (checked on the host by ops/gemm_launch.cuh): A is [M, K] row-major, B is [N, K]
// (Major::K) or [K, N] (Major::MN) row-major, both described by 2-D tensor maps with 128 B swizzle
// (A box {64, BM}; B box {64, BN} for [N, K], {64, 64} for [K, N]). M, N, K tails need no
// padding: TMA fills out-of-bounds elements with zeros (exact in K), and the epilogue writes only
// rows < M and columns < N. C must not alias A or B.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "taxfree/kernels/gemm/pipeline.cuh"
#include "taxfree/kernels/gemm/policies.cuh"
#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/kernels/gemm/wgmma.cuh"

namespace taxfree::gemm {

// Compile-time tile configuration.
template <int BM_, int BN_, int kStages_>
struct TileShape {
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int BK = 64;  // one 128 B swizzle row of 16-bit elements
  static constexpr int kStages = kStages_;
  static constexpr int kConsumers = BM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static_assert(BM == 64 || BM == 128, "BM: one or two consumer warpgroups of 64 rows");
  static_assert(BN == 32 || BN == 64 || BN == 128 || BN == 256, "BN: a wgmma width");
};

// Shared memory: [stage 0: A | B] ... [stage S-1] [epilogue staging per consumer] [barriers].
template <class Shape>
struct SmemLayout {
  static constexpr uint32_t kABytes = Shape::BM * 128;
  static constexpr uint32_t kBBytes = Shape::BN * 128;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;  // also the TMA bytes per stage
  // The epilogue stages a 64 x kChunkN slice of C at a time; rows padded by 16 B so the 8 rows a
  // warp writes at once fall into distinct banks.
  static constexpr int kChunkN = Shape::BN < 64 ? Shape::BN : 64;
  static constexpr uint32_t kEpiPitch = kChunkN * 2 + 16;
  static constexpr uint32_t kEpiBytes = 64 * kEpiPitch;
  static constexpr uint32_t kEpiOffset = Shape::kStages * kStageBytes;
  static constexpr uint32_t kBarOffset = kEpiOffset + Shape::kConsumers * kEpiBytes;
  static constexpr uint32_t kBytes = kBarOffset + 2 * Shape::kStages * 8;
  static constexpr uint32_t kDynamicBytes = kBytes + 1024;  // slack to align the base to 1024 B
  static_assert(kStageBytes % 1024 == 0, "stage buffers must stay 1024-byte aligned (swizzle atoms)");
  static_assert(kDynamicBytes <= 232448, "exceeds the 227 KiB of shared memory per CTA on sm_90");
};

template <class Order, class Ready, class Epilogue>
struct GemmParams {
  CUtensorMap a;
  CUtensorMap b;
  int m, n, k;
  TileGrid grid;
  typename Order::Params order;
  typename Ready::Params ready;
  typename Epilogue::Params epi;
};

namespace device {

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<uint32_t&>(v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return reinterpret_cast<uint32_t&>(v);
  }
}

// Element i of 8 packed 16-bit values, without a trip through local memory.
template <class T>
__device__ __forceinline__ T element(const uint4& x, int i) {
  const uint32_t w = i < 2 ? x.x : i < 4 ? x.y : i < 6 ? x.z : x.w;
  const auto bits = static_cast<unsigned short>(w >> (16 * (i & 1)));
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __ushort_as_bfloat16(bits);
  else
    return __ushort_as_half(bits);
}

template <class Shape, Major kMajorB, class Order, class Ready, class Epi>
__device__ __forceinline__ void produce(const GemmParams<Order, Ready, Epi>& p, uint32_t base, int k_blocks) {
  using L = SmemLayout<Shape>;
  const uint32_t full0 = base + L::kBarOffset, empty0 = full0 + 8 * Shape::kStages;
  uint32_t stage = 0, phase = 0;
  for (int64_t t = blockIdx.x; t < p.grid.tiles(); t += gridDim.x) {
    const TileCoord tile = Order::at(p.order, p.grid, t);
    const int m0 = tile.m * Shape::BM, n0 = tile.n * Shape::BN;
    for (int kb = 0; kb < k_blocks; ++kb) {
      const uint32_t full = full0 + 8 * stage, a_dst = base + stage * L::kStageBytes, b_dst = a_dst + L::kABytes;
      mbar_wait<false>(empty0 + 8 * stage, phase ^ 1);  // consumers are done with this stage's last use
      mbar_arrive_expect_tx(full, L::kStageBytes);
      if constexpr (kMajorB == Major::K) {
        tma_load_2d(b_dst, &p.b, kb * 64, n0, full);
      } else {
#pragma unroll
        for (int j = 0; j < Shape::BN / 64; ++j) tma_load_2d(b_dst + j * 8192, &p.b, n0 + 64 * j, kb * 64, full);
      }
      Ready::wait(p.ready, tile, kb);  // B is already in flight while A's producer catches up
      tma_load_2d(a_dst, &p.a, kb * 64, m0, full);
      if (++stage == Shape::kStages) stage = 0, phase ^= 1;
    }
  }
}

template <class Shape, class T, Major kMajorB, class Order, class Ready, class Epi>
__device__ __forceinline__ void consume(const GemmParams<Order, Ready, Epi>& p, uint32_t base, uint8_t* smem,
                                        int consumer, int k_blocks) {
  using L = SmemLayout<Shape>;
  constexpr int BN = Shape::BN;
  const uint32_t full0 = base + L::kBarOffset, empty0 = full0 + 8 * Shape::kStages;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  uint8_t* staging = smem + L::kEpiOffset + consumer * L::kEpiBytes;
  float acc[BN / 2];
  uint32_t stage = 0, phase = 0;

  for (int64_t t = blockIdx.x; t < p.grid.tiles(); t += gridDim.x) {
    const TileCoord tile = Order::at(p.order, p.grid, t);
    uint32_t prev = 0;
    for (int kb = 0; kb < k_blocks; ++kb) {
      mbar_wait<false>(full0 + 8 * stage, phase, 2 * dev::kMbarTimeoutNs);  // no call in the wgmma window
      const uint32_t a_tile = base + stage * L::kStageBytes + consumer * 64 * 128;
      const uint32_t b_tile = base + stage * L::kStageBytes + L::kABytes;
      wgmma_fence();
      fence_accumulators(acc);
#pragma unroll
      for (int k16 = 0; k16 < 4; ++k16)
        wgmma_m64k16<BN, T, kMajorB>(acc, SwizzledOperand<Major::K>::desc(a_tile, k16),
                                     SwizzledOperand<kMajorB>::desc(b_tile, k16), (kb | k16) != 0);
      wgmma_commit();
      if (kb > 0) {
        wgmma_wait<1>();  // the previous k-block's group is complete: its stage can be refilled
        if (lane == 0) mbar_arrive(empty0 + 8 * prev);
      }
      prev = stage;
      if (++stage == Shape::kStages) stage = 0, phase ^= 1;
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (lane == 0) mbar_arrive(empty0 + 8 * prev);

    // Epilogue: per 64 x kChunkN slice, registers -> staging (fragment layout of m64nNk16: thread
    // holds rows 16 warp + lane/4 (+8), columns 8 j + 2 (lane % 4) (+1)), then 16-byte row-contiguous
    // reads from staging -> Epilogue, so global writes are full 128 B lines.
    constexpr int kChunkN = L::kChunkN, kVecPerRow = kChunkN / 8, kRowsPerPass = 128 / kVecPerRow;
    const int64_t row0 = int64_t(tile.m) * Shape::BM + consumer * 64;
    const int64_t col0 = int64_t(tile.n) * BN;
    const int frag_row = warp * 16 + lane / 4, frag_col = 2 * (lane % 4);
#pragma unroll
    for (int chunk = 0; chunk < BN / kChunkN; ++chunk) {
#pragma unroll
      for (int j = 0; j < kChunkN / 8; ++j) {
        const int f = (chunk * kChunkN / 8 + j) * 4;
        uint8_t* cell = staging + frag_row * L::kEpiPitch + (j * 8 + frag_col) * 2;
        *reinterpret_cast<uint32_t*>(cell) = pack2<T>(acc[f], acc[f + 1]);
        *reinterpret_cast<uint32_t*>(cell + 8 * L::kEpiPitch) = pack2<T>(acc[f + 2], acc[f + 3]);
      }
      named_barrier_sync(1 + consumer, 128);
#pragma unroll
      for (int pass = 0; pass < 64 / kRowsPerPass; ++pass) {
        const int r = pass * kRowsPerPass + tid / kVecPerRow, v = tid % kVecPerRow;
        const int64_t row = row0 + r, col = col0 + chunk * kChunkN + v * 8;
        if (row < p.m && col < p.n) {
          const uint4 x = *reinterpret_cast<const uint4*>(staging + r * L::kEpiPitch + v * 16);
          if (col + 8 <= p.n) {
            Epi::template put8<T>(p.epi, row, col, x);
          } else {
            for (int i = 0; i < p.n - col; ++i) Epi::template put1<T>(p.epi, row, col + i, element<T>(x, i));
          }
        }
      }
      named_barrier_sync(1 + consumer, 128);  // staging is free for the next slice
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
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t pad = ((raw + 1023) & ~1023u) - raw;
  const uint32_t base = raw + pad;

  if (threadIdx.x == 0) {
    for (int s = 0; s < Shape::kStages; ++s) {
      mbar_init(base + L::kBarOffset + 8 * s, 1);
      mbar_init(base + L::kBarOffset + 8 * (Shape::kStages + s), 4 * Shape::kConsumers);
    }
    fence_mbar_init();
    prefetch_tensor_map(&p.a);
    prefetch_tensor_map(&p.b);
  }
  __syncthreads();

  const int k_blocks = (p.k + Shape::BK - 1) / Shape::BK;
  const int warpgroup = threadIdx.x / 128;
  // Two consumers need 2 x 128 x 232 registers for 128 fp32 accumulators each plus addressing;
  // the producer gives up most of its share (ptxas assigns 168 = 65536 / 384 at launch).
  if (warpgroup == 0) {
    if constexpr (Shape::kConsumers > 1) setmaxnreg_dec<40>();
    if (threadIdx.x == 0) produce<Shape, kMajorB>(p, base, k_blocks);
  } else {
    if constexpr (Shape::kConsumers > 1) setmaxnreg_inc<232>();
    consume<Shape, T, kMajorB>(p, base, smem_raw + pad, warpgroup - 1, k_blocks);
  }
}

}  // namespace taxfree::gemm
