// load_probe: how fast one kernel streams K/V-like tiles from HBM, by load method. The decode
// kernel's load pattern without its math (attend_chunk.h): 132 CTAs of 4 warps, each CTA a
// contiguous run of tiles, warp w taking tiles w, w + 4, ... through its own 3-stage ring; a tile
// is 4 KB of "K" and 4 KB of "V" from two buffers. Methods:
//   cp.async  16-byte copies by every lane (what the decode kernel does)
//   tiled     TMA tensor loads, two 2 KB boxes (16 rows x 128 B, 128-byte swizzle) per 4 KB
//   bulk      one 1-D cp.async.bulk of 4 KB per K or V tile (unswizzled)
//   bulk-ef   the same with the L2 evict_first policy cp.async carries
//   3d-rows   tiled, one 3-D TMA box per 4 KB: (64 columns, 2 row halves, 16 rows), read in memory
//             order; smem lines (row, half) swizzled by 2 * row + half (2-way ldmatrix conflicts)
//   3d-halves tiled, one 3-D TMA box per 4 KB: (64 columns, 16 rows, 2 halves), the decode's layout
//   pieces-P  the 4 KB of K (and of V) as 4096 / P 1-D cp.async.bulk copies of P bytes, one lane
//             each, piece i at i * (P + skew) bytes, evict_first. A 16-byte skew (the default)
//             would let ldmatrix read the rows of eight pieces without bank conflicts; P = 256 is
//             one copy per K/V row; "skew 0" and "skew 128" keep every piece 128-byte aligned
// plus an empty kernel of the same grid (the per-launch constant). Times are back to back (200
// launches, the buffers rotated through 3.6 GB so nothing is found in L2). Run on a GPU machine:
//   build/tools/load_probe
// docs/PERFORMANCE.md (twelfth session) and docs/notes/decode-latency.md (twelfth and
// twenty-sixth sessions) have what it measured and what followed from it: only unswizzled bulk
// copies into 128-byte-aligned shared memory beat cp.async's rate.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "taxfree/device/mbarrier.cuh"
#include "taxfree/device/tile_copy.cuh"
#include "taxfree/kernels/attention/impl/ptx.h"
#include "taxfree/kernels/gemm/pipeline.cuh"
#include "taxfree/ops/gemm_detail.h"
#include "taxfree/runtime/driver_api.h"
#include "taxfree/runtime/error.h"

namespace {

namespace ptx = taxfree::attention::ptx;
namespace dev = taxfree::dev;

constexpr int kWarps = 4, kStages = 3, kTile = 4096;
enum class Method { empty, cp_async, tiled, bulk, bulk_ef, pieces, tiled3d_rows, tiled3d_halves };
template <Method M, int kPiece>
constexpr int stage_bytes(int skew) { return M == Method::pieces ? 2 * (kTile / kPiece) * (kPiece + skew) : 2 * kTile; }

// cp.async.bulk (global -> shared) of `bytes` completing on `bar`, with an L2 cache policy.
__device__ __forceinline__ void bulk_load_policy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

struct Args {
  CUtensorMap k_map, v_map;  // tiled: [rows][128] bf16, boxes of 64 x 16; 3-D: see make_map3
  const char* k;
  const char* v;
  int64_t tiles;
  unsigned* sink;
};

// One 3-D box at row `row`: coordinates (0, 0, row) for 3d-rows, (0, row, 0) for 3d-halves.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int32_t row, uint32_t bar, bool rows_last) {
  const int32_t c1 = rows_last ? 0 : row, c2 = rows_last ? row : 0;
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// [rows][128] bf16 as a 3-D tensor of 64-column halves: rows last (dims 64, 2, rows) or halves last
// (dims 64, rows, 2); boxes of 16 rows, 128-byte swizzle.
CUtensorMap make_map3(const void* base, int64_t rows, bool rows_last) {
  using Encode = decltype(&cuTensorMapEncodeTiled);
  static const Encode encode = taxfree::driver::get<Encode>("cuTensorMapEncodeTiled");
  CUtensorMap map;
  const cuuint64_t dims[3] = {64, cuuint64_t(rows_last ? 2 : rows), cuuint64_t(rows_last ? rows : 2)};
  const cuuint64_t strides[2] = {cuuint64_t(rows_last ? 128 : 256), cuuint64_t(rows_last ? 256 : 128)};
  const cuuint32_t box[3] = {64, rows_last ? 2u : 16u, rows_last ? 16u : 2u};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  TF_CU(encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return map;
}

template <Method M, int kPiece = 0, int kSkew = 16>
__global__ void __launch_bounds__(kWarps * 32) stream_tiles(const __grid_constant__ Args a) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t bars[kWarps][kStages];
  if constexpr (M == Method::empty) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t per = (a.tiles + gridDim.x - 1) / gridDim.x, t0 = blockIdx.x * per;
  const int64_t t1 = t0 + per < a.tiles ? t0 + per : a.tiles;
  const int64_t n = t1 > t0 + warp ? (t1 - t0 - warp + kWarps - 1) / kWarps : 0;
  // smem starts 1024-aligned only if nothing static precedes it: align by hand (the swizzle needs it).
  constexpr uint32_t kStage = stage_bytes<M, kPiece>(kSkew);
  const uint32_t ring = (dev::smem_addr(smem) + 1023u) / 1024u * 1024u + warp * kStages * kStage;
  const uint64_t policy = ptx::l2_evict_first_policy();
  if (lane == 0)
    for (int s = 0; s < kStages; ++s) dev::mbar_init(dev::smem_addr(&bars[warp][s]), 1);
  dev::fence_mbar_init();
  __syncwarp();
  const auto issue = [&](int64_t i) {
    if (i >= n) return;
    const int64_t t = t0 + warp + i * kWarps;
    const uint32_t sk = ring + uint32_t(i % kStages) * kStage, sv = sk + kStage / 2;
    if constexpr (M == Method::cp_async) {
      for (int off = lane * 16; off < kTile; off += 512) {
        ptx::cp_async_16(sk + off, a.k + t * kTile + off, true, policy);
        ptx::cp_async_16(sv + off, a.v + t * kTile + off, true, policy);
      }
      ptx::cp_async_commit();
    } else if constexpr (M == Method::pieces) {
      constexpr int kPieces = kTile / kPiece;
      const uint32_t bar = dev::smem_addr(&bars[warp][i % kStages]);
      if (lane == 0) dev::mbar_arrive_expect_tx(bar, 2 * kTile);
      __syncwarp();
      const int r = lane % kPieces;
      if (lane < 2 * kPieces)
        bulk_load_policy((lane < kPieces ? sk : sv) + r * (kPiece + kSkew), (lane < kPieces ? a.k : a.v) + t * kTile + r * kPiece,
                         kPiece, bar, policy);
    } else if (lane == 0) {
      const uint32_t bar = dev::smem_addr(&bars[warp][i % kStages]);
      dev::mbar_arrive_expect_tx(bar, 2 * kTile);
      if constexpr (M == Method::bulk) {
        dev::bulk_load(sk, a.k + t * kTile, kTile, bar);
        dev::bulk_load(sv, a.v + t * kTile, kTile, bar);
      } else if constexpr (M == Method::bulk_ef) {
        bulk_load_policy(sk, a.k + t * kTile, kTile, bar, policy);
        bulk_load_policy(sv, a.v + t * kTile, kTile, bar, policy);
      } else if constexpr (M == Method::tiled3d_rows || M == Method::tiled3d_halves) {
        tma_load_3d(sk, &a.k_map, int32_t(t * 16), bar, M == Method::tiled3d_rows);
        tma_load_3d(sv, &a.v_map, int32_t(t * 16), bar, M == Method::tiled3d_rows);
      } else {
        for (int h = 0; h < 2; ++h) {
          taxfree::gemm::device::tma_load_2d(sk + h * 2048, &a.k_map, h * 64, int32_t(t * 16), bar);
          taxfree::gemm::device::tma_load_2d(sv + h * 2048, &a.v_map, h * 64, int32_t(t * 16), bar);
        }
      }
    }
  };
  unsigned acc = 0;
  for (int s = 0; s < kStages; ++s) issue(s);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (M == Method::cp_async) {
      if (i + kStages > n) ptx::cp_async_wait<0>();
      else ptx::cp_async_wait<kStages - 1>();
    } else {
      dev::mbar_wait(dev::smem_addr(&bars[warp][i % kStages]), uint32_t(i / kStages) & 1u);
    }
    __syncwarp();
    const uint32_t word = ring + uint32_t(i % kStages) * kStage + lane * 4;
    unsigned x;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(x) : "r"(word));
    acc ^= x;
    __syncwarp();
    issue(i + kStages);
  }
  if (acc == 0x9e3779b9u) a.sink[0] = acc;  // keeps the loads; never true for the memset bytes
}

template <Method M, int kPiece = 0, int kSkew = 16>
double time_us(Args a, const char* buf, int64_t half, int64_t span, int grid) {
  const int smem = kWarps * kStages * stage_bytes<M, kPiece>(kSkew) + 1024;
  TF_CUDA(cudaFuncSetAttribute(stream_tiles<M, kPiece, kSkew>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  constexpr int kWarm = 20, kRuns = 200;
  // Buffer positions the launches rotate through: as many as fit the span, at most one per launch.
  const int rot = int(std::min<int64_t>(span / (2 * half), kWarm + kRuns));
  cudaEvent_t e0, e1;
  TF_CUDA(cudaEventCreate(&e0));
  TF_CUDA(cudaEventCreate(&e1));
  std::vector<Args> slots(size_t(rot), a);  // one per rotated position, maps encoded before timing
  for (int r = 0; r < rot; ++r) {
    Args& x = slots[size_t(r)];
    x.k = buf + r * 2 * half, x.v = x.k + half;
    if constexpr (M == Method::tiled) {
      x.k_map = taxfree::gemm::detail::make_tensor_map(x.k, taxfree::gemm::DType::bf16, 128, half / 256, 128, 64, 16);
      x.v_map = taxfree::gemm::detail::make_tensor_map(x.v, taxfree::gemm::DType::bf16, 128, half / 256, 128, 64, 16);
    } else if constexpr (M == Method::tiled3d_rows || M == Method::tiled3d_halves) {
      x.k_map = make_map3(x.k, half / 256, M == Method::tiled3d_rows);
      x.v_map = make_map3(x.v, half / 256, M == Method::tiled3d_rows);
    }
  }
  const auto launch = [&](int i) { stream_tiles<M, kPiece, kSkew><<<grid, kWarps * 32, smem>>>(slots[size_t(i % rot)]); };
  for (int i = 0; i < kWarm; ++i) launch(i);
  TF_CUDA(cudaEventRecord(e0));
  for (int i = 0; i < kRuns; ++i) launch(i);
  TF_CUDA(cudaEventRecord(e1));
  TF_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  TF_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  TF_CUDA(cudaGetLastError());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1e3 / kRuns;
}

}  // namespace

int main() try {
  int sms = 0;
  TF_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t span = int64_t(3600) << 20;
  char* buf = nullptr;
  TF_CUDA(cudaMalloc(&buf, span));
  TF_CUDA(cudaMemset(buf, 1, span));
  Args a{};
  TF_CUDA(cudaMalloc(&a.sink, 16));
  std::printf("empty kernel, grid %d x %d, back to back: %.2f us\n", sms, kWarps * 32,
              time_us<Method::empty>(a, buf, kTile, span, sms));
  std::printf("%10s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s   (us back to back, GB/s)\n", "K+V MB",
              "cp.async", "tiled", "bulk", "bulk-ef", "pieces-256", "pieces-512", "pieces-1K", "pieces-2K", "2K,skew 0",
              "2K,skew 128", "1K,skew 0", "3d-rows", "3d-halves");
  for (const double mb : {16.8, 50.3, 201.0, 805.0}) {
    const int64_t half = int64_t(mb * 1e6 / 2) / kTile * kTile;
    a.tiles = half / kTile;
    std::printf("%10.1f", 2.0 * half / 1e6);
    const auto col = [&](double us) {
      std::printf("  %6.2f %5.0f", us, 2.0 * half / us / 1e3);
      std::fflush(stdout);
    };
    col(time_us<Method::cp_async>(a, buf, half, span, sms));
    col(time_us<Method::tiled>(a, buf, half, span, sms));
    col(time_us<Method::bulk>(a, buf, half, span, sms));
    col(time_us<Method::bulk_ef>(a, buf, half, span, sms));
    col(time_us<Method::pieces, 256>(a, buf, half, span, sms));
    col(time_us<Method::pieces, 512>(a, buf, half, span, sms));
    col(time_us<Method::pieces, 1024>(a, buf, half, span, sms));
    col(time_us<Method::pieces, 2048>(a, buf, half, span, sms));
    col(time_us<Method::pieces, 2048, 0>(a, buf, half, span, sms));
    col(time_us<Method::pieces, 2048, 128>(a, buf, half, span, sms));
    col(time_us<Method::pieces, 1024, 0>(a, buf, half, span, sms));
    col(time_us<Method::tiled3d_rows>(a, buf, half, span, sms));
    col(time_us<Method::tiled3d_halves>(a, buf, half, span, sms));
    std::printf("\n");
  }
  return 0;
} catch (const taxfree::Error& e) {
  std::fprintf(stderr, "load_probe: %s\n", e.what());
  return 1;
}
