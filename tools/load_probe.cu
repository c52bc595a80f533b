// load_probe: how fast one kernel streams K/V-like tiles from HBM, by load method. The decode
// kernel's load pattern without its math (attend_chunk.h): 132 CTAs of 4 warps, each CTA a
// contiguous run of tiles, warp w taking tiles w, w + 4, ... through its own 3-stage ring; a tile
// is 4 KB of "K" and 4 KB of "V" from two buffers. Methods:
//   cp.async  16-byte copies by every lane (what the decode kernel does)
//   tiled     TMA tensor loads, two 2 KB boxes (16 rows x 128 B, 128-byte swizzle) per 4 KB
//   bulk      one 1-D cp.async.bulk of 4 KB per K or V tile (unswizzled)
// plus an empty kernel of the same grid (the per-launch constant). Times are back to back (200
// launches, the buffers rotated through 3.6 GB so nothing is found in L2). Run on a GPU machine:
//   build/tools/load_probe
// docs/PERFORMANCE.md (twelfth session) has what it measured and what followed from it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "taxfree/device/mbarrier.cuh"
#include "taxfree/device/tile_copy.cuh"
#include "taxfree/kernels/attention/impl/ptx.h"
#include "taxfree/kernels/gemm/pipeline.cuh"
#include "taxfree/ops/gemm_detail.h"
#include "taxfree/runtime/error.h"

namespace {

namespace ptx = taxfree::attention::ptx;
namespace dev = taxfree::dev;

constexpr int kWarps = 4, kStages = 3, kTile = 4096;
enum class Method { empty, cp_async, tiled, bulk };

struct Args {
  CUtensorMap k_map, v_map;  // tiled: [rows][128] bf16, boxes of 64 x 16
  const char* k;
  const char* v;
  int64_t tiles;
  unsigned* sink;
};

template <Method M>
__global__ void __launch_bounds__(kWarps * 32) stream_tiles(const __grid_constant__ Args a) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t bars[kWarps][kStages];
  if constexpr (M == Method::empty) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t per = (a.tiles + gridDim.x - 1) / gridDim.x, t0 = blockIdx.x * per;
  const int64_t t1 = t0 + per < a.tiles ? t0 + per : a.tiles;
  const int64_t n = t1 > t0 + warp ? (t1 - t0 - warp + kWarps - 1) / kWarps : 0;
  // smem starts 1024-aligned only if nothing static precedes it: align by hand (the swizzle needs it).
  const uint32_t ring = (dev::smem_addr(smem) + 1023u) / 1024u * 1024u + warp * kStages * 2 * kTile;
  const uint64_t policy = ptx::l2_evict_first_policy();
  if (lane == 0)
    for (int s = 0; s < kStages; ++s) dev::mbar_init(dev::smem_addr(&bars[warp][s]), 1);
  dev::fence_mbar_init();
  __syncwarp();
  const auto issue = [&](int64_t i) {
    if (i >= n) return;
    const int64_t t = t0 + warp + i * kWarps;
    const uint32_t sk = ring + uint32_t(i % kStages) * 2 * kTile, sv = sk + kTile;
    if constexpr (M == Method::cp_async) {
      for (int off = lane * 16; off < kTile; off += 512) {
        ptx::cp_async_16(sk + off, a.k + t * kTile + off, true, policy);
        ptx::cp_async_16(sv + off, a.v + t * kTile + off, true, policy);
      }
      ptx::cp_async_commit();
    } else if (lane == 0) {
      const uint32_t bar = dev::smem_addr(&bars[warp][i % kStages]);
      dev::mbar_arrive_expect_tx(bar, 2 * kTile);
      if constexpr (M == Method::bulk) {
        dev::bulk_load(sk, a.k + t * kTile, kTile, bar);
        dev::bulk_load(sv, a.v + t * kTile, kTile, bar);
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
    const uint32_t word = ring + uint32_t(i % kStages) * 2 * kTile + lane * 4;
    unsigned x;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(x) : "r"(word));
    acc ^= x;
    __syncwarp();
    issue(i + kStages);
  }
  if (acc == 0x9e3779b9u) a.sink[0] = acc;  // keeps the loads; never true for the memset bytes
}

template <Method M>
double time_us(Args a, const char* buf, int64_t half, int64_t span, int grid) {
  const int smem = kWarps * kStages * 2 * kTile + 1024;
  TF_CUDA(cudaFuncSetAttribute(stream_tiles<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
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
    }
  }
  const auto launch = [&](int i) { stream_tiles<M><<<grid, kWarps * 32, smem>>>(slots[size_t(i % rot)]); };
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
  std::printf("%10s %12s %12s %12s   (us back to back, GB/s)\n", "K+V MB", "cp.async", "tiled", "bulk");
  for (const double mb : {16.8, 50.3, 201.0, 805.0}) {
    const int64_t half = int64_t(mb * 1e6 / 2) / kTile * kTile;
    a.tiles = half / kTile;
    const double t[3] = {time_us<Method::cp_async>(a, buf, half, span, sms), time_us<Method::tiled>(a, buf, half, span, sms),
                         time_us<Method::bulk>(a, buf, half, span, sms)};
    std::printf("%10.1f", 2.0 * half / 1e6);
    for (const double x : t) std::printf("  %6.2f %5.0f", x, 2.0 * half / x / 1e3);
    std::printf("\n");
  }
  return 0;
} catch (const taxfree::Error& e) {
  std::fprintf(stderr, "load_probe: %s\n", e.what());
  return 1;
}
