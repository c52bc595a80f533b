// Cross-rank exchange of attention partials as low-latency lines (device/ll_line.cuh), and the
// combine that reads them straight from the lines: the communication step of the fused
// multi-rank decode (fused_decode_kernel.h).
//
// Why LL lines: with data stores plus a release flag, the sender's st.release.sys waits until the
// peer has acknowledged the data (an NVLink round trip) and only then sends the flag (one more
// one-way trip). An LL line carries 8 data bytes and the epoch in one 16-byte store, so the
// receiver reads the data itself: one one-way trip, no fence, no flag. The lines double the bytes
// (a group of 8 heads x D = 128 is 8.3 KB per peer), which NVLink carries in well under 0.1 us.
//
// Why one polling thread per peer: a CTA that polled all its lines (128 threads spinning on 16-byte
// loads, each also reading the host-memory abort flag every 128 polls) while its peer was still
// decoding slowed the CTA streaming KV beside it on the SM, and at large batch (up to 256 CTAs
// polling) the whole kernel by 12-85% (docs/notes/decode-latency.md). The receiver now waits for
// the line its sender stores last, by one thread per peer with backoff, then reads every line
// once; lines land in any order, so each is still checked, and one still missing is polled alone.
//
// Line layout of one rank's inbox (symmetric heap), for one parity:
//   [sender][row][ll_lines_per_row(D)] lines, row = b*q_heads + h (all rows of the launch);
//   line j < D/2 of a row holds o[2j], o[2j+1]; line D/2 holds the LSE and the number of partials
//   the sender sends for that row (1 here; a split count in the direct merge's layout,
//   direct_merge.h, which reuses these functions). A rank sends itself nothing here: its own
//   partial stays in shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "taxfree/device/ll_line.cuh"
#include "taxfree/device/symmetric_view.cuh"
#include "taxfree/kernels/attention/combine.h"
#include "taxfree/kernels/attention/config.h"
#include "taxfree/kernels/attention/impl/ptx.h"

namespace taxfree::attention {

// Store rows [0, rows) of `t` as LL lines of epoch `flag` into every peer's inbox (unless
// !to_peers), and into this rank's own when `to_self`: `slot` is the local address of this rank's
// lines for row 0; every rank gets the same offset in its heap. The LSE lines carry `count` (the
// partials the sender sends per row). Ranks in the order rank+1, rank+2, ..., this rank last. No
// waiting, no fence.
template <int D>
__device__ inline void cta_push_partial_ll(const PartialTile<D>& t, int rows, uint4* slot, const dev::SymmetricView& v,
                                           uint32_t flag, bool to_self = false, uint32_t count = 1,
                                           bool to_peers = true) {
  constexpr int kRow = ll_lines_per_row(D);
  const int first = to_peers ? 1 : v.world, last = v.world - (to_self ? 0 : 1);  // k: rank + k
  for (int i = threadIdx.x; i < rows * kRow; i += blockDim.x) {
    const int r = i / kRow, j = i % kRow;
    const float2 d = j < D / 2 ? reinterpret_cast<const float2*>(t.o[r])[j] : make_float2(t.lse[r], __uint_as_float(count));
    for (int k = first; k <= last; ++k)
      dev::ll_store(v.peer(slot, (v.rank + k) % v.world) + i, __float_as_uint(d.x), __float_as_uint(d.y), flag);
  }
}

// Wait until every peer's lines of one group [0, rows) carry `flag`, as far as the line each
// sender stores last (cta_push_partial_ll's last round): thread p < world, p != rank, polls peer
// p's highest line with a short backoff (one thread per peer, so a waiting CTA leaves its SM's
// issue slots and L2 bandwidth to the CTA beside it that still decodes). Lines land in any order:
// cta_combine_ll still checks every line it reads. Returns false (uniformly across the CTA) when a
// wait gave up (deadline, abort: WaitSite::decode_partial naming the peer). Every thread of the
// CTA calls it; ends with a CTA barrier.
template <int D>
__device__ inline bool cta_wait_ll(const uint4* inbox, int64_t sender_lines, int rows, int rank, int world,
                                   uint32_t flag, const dev::FaultContext& fc) {
  constexpr uint32_t kBackoffNs = 32;  // per miss: << the ~1 us one-way trip
  static_assert(kThreads >= kMaxParts, "one thread per peer");
  const int t = threadIdx.x;
  bool ok = true;
  if (t < world && t != rank) {
    uint2 last;
    ok = dev::ll_load(inbox + t * sender_lines + int64_t(rows) * ll_lines_per_row(D) - 1, flag, last, fc,
                      dev::WaitSite::decode_partial, t, kBackoffNs);
  }
  return __syncthreads_and(ok) != 0;
}

// LL-line partials for warp_merge_rows: the `world` partials of the warp's rows, in rank order.
// Partial p of row r[i] is at lines inbox + p*stride + r[i]*ll_lines_per_row(D) + j, or, for p ==
// own (this rank), row r[i] of *mine (shared memory). Lane `col` of a row's segment reads lines col
// and col + kLanes (o values 2col, 2col+1 and 2col + D/2, 2col + D/2 + 1: each load instruction
// covers 512 contiguous bytes) and the first half of the LSE line (lanes col < world). kLines o lines
// per lane in flight (64 registers): kLines / (2 kR) partials of every one of a warp's kR rows per
// round trip (2 at 4 rows, 4 at 2 rows, 8 at one; this rank's own comes from `mine`). A line still stale at the deadline is reported as waited for from its rank.
template <int D, int kR>
struct LlPartials {
  static constexpr int kLines = 16;
  static constexpr int kParts = kLines / (2 * kR);
  static constexpr bool kStepped = true;  // combine.h's terms_end
  using L = MergeLayout<D>;
  const PartialTile<D>& mine;
  const int (&r)[kR];
  int own;
  const uint4* inbox;
  int64_t stride;
  int world;  // partials per row, and the n warp_merge_rows is called with: fetches cover its steps
  uint32_t flag;
  const dev::FaultContext& fc;
  int col;
  int p0 = 0;
  uint2 l[kR][L::kLse];
  uint4 lo[kR][kParts], hi[kR][kParts];

  __device__ bool needs(int p) const { return p < world && p != own; }
  __device__ const uint4* line(int i, int p, int j) const {
    return inbox + p * stride + int64_t(r[i]) * ll_lines_per_row(D) + j;
  }

  // Every line of the batch starts stale, so the first pass reads all of them before checking any
  // (one round trip); a later pass re-reads only the lines still stale (in flight: lines land in
  // any order, so after a wait for the last line this is rare and short), bounded by
  // ll_poll_expired.
  __device__ bool fetch(int first) {
    p0 = first;
    const bool with_lse = first == 0;
    const uint4 stale4 = make_uint4(0u, ~flag, 0u, ~flag);
#pragma unroll
    for (int i = 0; i < kR; ++i) {
#pragma unroll
      for (int k = 0; k < L::kLse; ++k) l[i][k] = make_uint2(0u, ~flag);
    }
#pragma unroll
    for (int u = 0; u < kParts; ++u) {
      if (terms_end<kStepped>(p0, u, world)) break;
#pragma unroll
      for (int i = 0; i < kR; ++i) lo[i][u] = hi[i][u] = stale4;
    }
    uint64_t start = 0, waited = 0;
    for (uint32_t it = 0;; ++it) {
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        if (with_lse)
#pragma unroll
          for (int k = 0; k < L::kLse; ++k) {
            const int p = col + k * L::kLanes;
            if (needs(p) && !dev::ll_half_current(l[i][k], flag)) l[i][k] = dev::ll_peek_half(line(i, p, D / 2));
          }
#pragma unroll
        for (int u = 0; u < kParts; ++u) {
          if (terms_end<kStepped>(p0, u, world)) break;
          const int p = p0 + u;
          if (!needs(p)) continue;
          if (!dev::ll_current(lo[i][u], flag)) lo[i][u] = dev::ll_peek(line(i, p, col));
          if (!dev::ll_current(hi[i][u], flag)) hi[i][u] = dev::ll_peek(line(i, p, col + L::kLanes));
        }
      }
      // The checks wait for the reads; remember one stale line for the timeout report.
      const uint4* stale = nullptr;
      int stale_peer = 0;
      uint32_t seen = 0;
      const auto check = [&](bool current, int p, const uint4* at, uint32_t got) {
        if (!current && stale == nullptr) stale = at, stale_peer = p, seen = got;
      };
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        if (with_lse)
#pragma unroll
          for (int k = 0; k < L::kLse; ++k) {
            const int p = col + k * L::kLanes;
            if (needs(p)) check(dev::ll_half_current(l[i][k], flag), p, line(i, p, D / 2), l[i][k].y);
          }
#pragma unroll
        for (int u = 0; u < kParts; ++u) {
          if (terms_end<kStepped>(p0, u, world)) break;
          const int p = p0 + u;
          if (!needs(p)) continue;
          check(dev::ll_current(lo[i][u], flag), p, line(i, p, col), lo[i][u].y != flag ? lo[i][u].y : lo[i][u].w);
          check(dev::ll_current(hi[i][u], flag), p, line(i, p, col + L::kLanes),
                hi[i][u].y != flag ? hi[i][u].y : hi[i][u].w);
        }
      }
      if (stale == nullptr) return true;
      if (dev::ll_poll_expired(it, start, fc, waited)) {
        if (waited != 0) dev::report_wait_timeout(fc, dev::WaitSite::decode_partial, stale_peer, stale, flag, seen, waited);
        return false;
      }
    }
  }
  __device__ float lse_of(int i, int k) const {
    const int p = col + k * L::kLanes;
    return p == own ? mine.lse[r[i]] : p < world ? __uint_as_float(l[i][k].x) : -INFINITY;
  }
  __device__ float4 o_of(int i, int u) const {
    if (p0 + u == own) {
      const float2 a = reinterpret_cast<const float2*>(mine.o[r[i]])[col];
      const float2 b = reinterpret_cast<const float2*>(mine.o[r[i]])[col + L::kLanes];
      return make_float4(a.x, a.y, b.x, b.y);
    }
    return make_float4(__uint_as_float(lo[i][u].x), __uint_as_float(lo[i][u].z), __uint_as_float(hi[i][u].x),
                       __uint_as_float(hi[i][u].z));
  }
};

// Lane `col`'s 4 values of a merged row, converted to T, into `row` (D values; 4-byte stores).
template <class T, int D>
__device__ inline void store_row_as(T* row, int col, float4 acc) {
  uint32_t* const w = reinterpret_cast<uint32_t*>(row);
  w[col] = ptx::pack2<T>(acc.x, acc.y);
  w[col + MergeLayout<D>::kLanes] = ptx::pack2<T>(acc.z, acc.w);
}

// Merge the `world` partials of rows [0, rows) of one group, in rank order, and store the result
// converted to T at out[r*D + d] (4-byte stores). Partial `rank` is `mine` (shared memory); partial
// p != rank is read from the LL lines at inbox[p*sender_lines + r*ll_lines_per_row(D) + j] once
// they carry `flag` (call cta_wait_ll first: then they normally do); a line not yet current is
// polled (bounded: deadline and abort flag, WaitSite::decode_partial naming p).
// Returns false (uniformly across the CTA) when a wait gave up; the caller must leave the kernel
// (rows of a lane whose wait gave up are not stored).
// Same weights (segment_lse_weights) and accumulation order (accumulate_weighted, through
// warp_merge_rows) as cta_combine_partials, so the output has the same bits as the bsp combine of
// the same partials. Latency: all lines of a warp's rows (LlPartials::kLines per lane) are read
// before any is checked, so the merge is one round trip where world <= LlPartials::kParts (two ranks
// at 4 rows per warp, four at 2) and one per kParts partials beyond.
// Preconditions: 1 <= world <= kMaxParts, 1 <= rows <= kMaxRows, blockDim.x == kThreads, `mine` and
// `scratch` not written concurrently; every thread of the CTA calls it. Ends with a CTA barrier.
template <class T, int D>
__device__ inline bool cta_combine_ll(const PartialTile<D>& mine, int rows, const uint4* inbox, int64_t sender_lines,
                                      int rank, int world, uint32_t flag, const dev::FaultContext& fc,
                                      CombineScratch& scratch, T* out) {
  bool ok = true;
  for_warp_rows<D>(rows, [&]<int kR>(std::integral_constant<int, kR>, const int (&r)[kR], const bool (&owner)[kR]) {
    const int col = (threadIdx.x & 31) % MergeLayout<D>::kLanes;
    LlPartials<D, kR> src{mine, r, rank, inbox, sender_lines, world, flag, fc, col};
    float4 acc[kR];
    float lse[kR];
    ok = warp_merge_rows<D>(src, world, r, owner, scratch, acc, lse);
    if (ok)
#pragma unroll
      for (int i = 0; i < kR; ++i)
        if (owner[i]) store_row_as<T, D>(out + int64_t(r[i]) * D, col, acc[i]);
  });
  return __syncthreads_and(ok) != 0;
}

// A team of one: the cross-rank combine of rows [0, rows) over its one partial `mine`, without the
// merge's code: cta_combine_ll at world 1 gives a non-empty row weight exactly 1 (exp(0) / 1) and
// an empty row 0, which cta_store_tile_as<kAsMerged> reproduces, so the same bits as
// cta_combine_ll and the bsp combine. Every thread of the CTA calls it; ends with a CTA barrier.
template <class T, int D>
__device__ inline void cta_store_one_rank(const PartialTile<D>& mine, int rows, T* out) {
  cta_store_tile_as<T, D, true>(mine, rows, out);
  __syncthreads();
}

}  // namespace taxfree::attention
