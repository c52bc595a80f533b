// all_gather_matmul `ksplit`, GEMM-epilogue path (M above the skinny path's rows): our GEMM
// multiplies A_shard by B's K rows of this rank and its epilogue stores each fp32 64-row band of the
// partial both into this rank's partial and straight into every peer's partial slot (NVLink stores
// while the other bands are still being computed), then raises the band's flag on every peer. A
// sum kernel then takes the bands in turn, waits for every peer's flag of each and writes
// C = P_0 + P_1 + ... in rank order in fp32, rounded once (the same bits on every rank). The A
// shard travels by copy engine on the op's side stream (after the begin barrier, as decomposed),
// concurrently with the GEMM.
//
// Why: the two-kernel path (cuBLASLt, then an exchange kernel) moves the partials only after the
// whole GEMM and then sums them from HBM: at M = 1024 the exchange alone (15 MB of partials each way)
// costs about as much as the GEMM. Here the partial leaves band by band during the GEMM.
//
// Epochs, buffers, reuse (no host reset between launches, CUDA-graph safe):
//  * e = the op's ksplit sequence + 1 (dev::sequence_begin: the epilogue reads it once per band,
//    the sum kernel once); the sum kernel's CTAs end the sequence. Shared with the other ksplit
//    paths, one launch at a time on the stream.
//  * Partials of launch e go to slot parity e & 1 (agmm_ksplit.cu's argument: a sender's GEMM of
//    e + 2 starts after its sum kernel of e + 1 saw the receiver's band flags of e + 1, raised by
//    the receiver's GEMM of e + 1, which follows its sum kernel of e, the last reader of parity e).
//  * Band flags only grow (epochs); the gathered A is written by the peers only after the begin
//    barrier of this launch (decomposed's rule), and the side stream waits for their arrival flags
//    (agmm_op_split.cc): the sum kernel, whose CTAs wait, waits for no copy, so it can never hold
//    the SMs a copy would need (copies may run as kernels: in a graph, between ranks on one GPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "agmm_internal.h"
#include "partial_sum.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/ops/gemm_launch.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

namespace {

// The GEMM's fp32 epilogue (kernels/gemm/policies.cuh): band (row0, col0) of this rank's partial
// into `own` and into slot (e & 1, slot(rank, q)) of every peer q's `recv`, then (P2: the engine's
// named barrier, then this thread's release) flag rank * band_capacity + band on every peer.
struct KsplitBands {
  static constexpr bool kFloatOut = true;
  struct Params {
    dev::SymmetricView view;
    float* own = nullptr;
    float* recv = nullptr;
    int64_t ldp = 0, slot_floats = 0;
    uint64_t* flags = nullptr;
    int64_t band_capacity = 0;
    int bands_n = 1, bn = 64;
    const uint64_t* counter = nullptr;  // the ksplit sequence's
    bool skip_signal = false;
  };
  static void check(const Params& p, int64_t m, int64_t n, int) {
    TF_REQUIRE(p.own != nullptr && p.ldp >= n && p.ldp % 8 == 0, Status::Internal,
               "ksplit bands: partial buffer / ldp=" << p.ldp << " for N=" << n);
    TF_REQUIRE(int64_t((m + 63) / 64) * p.bands_n <= p.band_capacity, Status::Internal,
               "ksplit bands: " << (m + 63) / 64 << " x " << p.bands_n << " bands exceed " << p.band_capacity);
  }
#ifdef __CUDACC__
  __device__ static uint64_t band_begin(const Params& p) {
    return dev::load<dev::Sem::relaxed, dev::Scope::gpu>(p.counter) + 1;
  }
  __device__ static void put4(const Params& p, uint64_t e, int64_t row, int64_t col, float4 v, int count) {
    const dev::SymmetricView& w = p.view;
    const int64_t at = row * p.ldp + col;  // ldp % 8 == 0, col % 4 == 0: 16-byte aligned
    const auto put = [&](float* dst) {
      if (count == 4) {
        *reinterpret_cast<float4*>(dst) = v;
      } else {  // the row's last 1-3 columns
        dst[0] = v.x;
        if (count > 1) dst[1] = v.y;
        if (count > 2) dst[2] = v.z;
      }
    };
    put(p.own + at);
    float* const parity = p.recv + int64_t(e & 1) * (w.world - 1) * p.slot_floats + at;
    for (int k = 1; k < w.world; ++k) {
      const int q = (w.rank + k) % w.world;
      put(w.peer(parity + KsplitSlices::slot(w.rank, q) * p.slot_floats, q));
    }
  }
  __device__ static void band_done(const Params& p, uint64_t e, int64_t row0, int64_t col0) {
    if (p.skip_signal) return;
    const dev::SymmetricView& w = p.view;
    uint64_t* const flag = p.flags + w.rank * p.band_capacity + (row0 / 64) * p.bands_n + col0 / p.bn;
    for (int k = 1; k < w.world; ++k) {
      const int q = (w.rank + k) % w.world;
      dev::signal_set(w.peer(flag, q), e);  // P2
    }
  }
#endif
};

constexpr int kSumThreads = 512;
constexpr int kSumUnroll = 4;  // 8-column groups per thread at a time: a 64 x 256 band in one step

// CTA b sums bands b, b + grid, ... (grid <= the share's SMs: its CTAs wait for peers' GEMMs, which
// need SMs too where ranks share a GPU): for each band it waits for every peer's flag of the band,
// then writes rows [row0, +64) x columns [col0, +bn) of C = the world partials summed in rank
// order, kSumUnroll 8-column groups per thread at a time (all their loads before their stores).
// Every CTA ends the launch sequence.
template <class T>
__global__ void __launch_bounds__(kSumThreads) ksplit_band_sum_kernel(const __grid_constant__ KsplitGemmLaunch l) {
  const dev::SymmetricView& v = l.view;
  const uint64_t e = dev::sequence_begin(l.seq);
  const int t = threadIdx.x;
  const float* const parity = l.recv + int64_t(e & 1) * (v.world - 1) * l.slot_floats;
  const int groups = l.bn / 8;  // 8-float groups per band row
  const int bands = int((l.m + 63) / 64) * l.bands_n;
  for (int band = int(blockIdx.x); band < bands; band += int(gridDim.x)) {
    bool ok = true;
    if (t < v.world && t != v.rank)  // thread p: rank p's flag of the band (bounded wait)
      ok = dev::wait_geq(l.flags + t * l.band_capacity + band, e, l.fault, dev::WaitSite::ksplit_partial, t);
    if (!__syncthreads_and(ok)) break;
    const int64_t row0 = int64_t(band / l.bands_n) * 64, col0 = int64_t(band % l.bands_n) * l.bn;
    const int units = int(l.m - row0 < 64 ? l.m - row0 : 64) * groups;
    for (int x0 = t; x0 < units; x0 += kSumUnroll * kSumThreads) {
      int64_t at[kSumUnroll];  // row * ldp + col, or -1 past the band
      float4 lo[kSumUnroll], hi[kSumUnroll];
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) {
        const int x = x0 + u * kSumThreads;
        const int64_t col = col0 + (x % groups) * 8;
        at[u] = x < units && col < l.n ? (row0 + x / groups) * l.ldp + col : -1;
      }
      // Plain loads: the peers' stores are ordered before their flags (acquired above).
      for (int r = 0; r < v.world; ++r) {
        const float* const p = r == v.rank ? l.own : parity + KsplitSlices::slot(r, v.rank) * l.slot_floats;
#pragma unroll
        for (int u = 0; u < kSumUnroll; ++u)
          if (at[u] >= 0) add_partial8(lo[u], hi[u], p + at[u], r == 0);
      }
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) {
        if (at[u] < 0) continue;
        const int x = x0 + u * kSumThreads;
        const int64_t row = row0 + x / groups, col = col0 + (x % groups) * 8;
        store8<T>(static_cast<T*>(l.c) + row * l.ldc + col, round8<T>(lo[u], hi[u]), l.n - col);
      }
    }
  }
  dev::sequence_end(l.seq, e);
}

}  // namespace

void enqueue_ksplit_gemm(const KsplitGemmLaunch& l, cudaStream_t s, gemm::GemmStep step) {
  if (step == gemm::GemmStep::prepare)  // the band sum's limits too, before anything of the launch is enqueued
    TF_REQUIRE(l.sum_ctas >= 1 && l.bn <= 256 && l.bn % 8 == 0 && (l.m + 63) / 64 * l.bands_n <= INT32_MAX,
               Status::Internal, "ksplit band sum: " << l.bn << "-column bands, " << l.sum_ctas << " CTAs");
  KsplitBands::Params epi;
  epi.view = l.view;
  epi.own = l.own, epi.recv = l.recv;
  epi.ldp = l.ldp, epi.slot_floats = l.slot_floats;
  epi.flags = l.flags, epi.band_capacity = l.band_capacity;
  epi.bands_n = l.bands_n, epi.bn = l.bn;
  epi.counter = l.seq.counter;
  epi.skip_signal = l.skip_signal;
  gemm::launch_gemm<gemm::GroupedOrder, gemm::AlwaysReady, KsplitBands>(l.gemm, l.config, {}, {}, epi, s, step);
}

void enqueue_ksplit_band_sum(const KsplitGemmLaunch& l, cudaStream_t s) {
  const int64_t ctas = std::min<int64_t>((l.m + 63) / 64 * l.bands_n, l.sum_ctas);  // checked by enqueue_ksplit_gemm
  if (l.dtype == gemm::DType::bf16)
    ksplit_band_sum_kernel<__nv_bfloat16><<<unsigned(ctas), kSumThreads, 0, s>>>(l);
  else
    ksplit_band_sum_kernel<__half><<<unsigned(ctas), kSumThreads, 0, s>>>(l);
  TF_CUDA(cudaGetLastError());
}

void preload_ksplit_gemm_kernels() {
  cudaFuncAttributes attr;
  TF_CUDA(cudaFuncGetAttributes(&attr, ksplit_band_sum_kernel<__nv_bfloat16>));
  TF_CUDA(cudaFuncGetAttributes(&attr, ksplit_band_sum_kernel<__half>));
}

}  // namespace taxfree::agmm
