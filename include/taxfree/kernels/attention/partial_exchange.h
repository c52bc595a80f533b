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
//   line j < D/2 of a row holds o[2j], o[2j+1]; line D/2 holds the LSE (twice).
// A rank never sends to itself: its own partial stays in shared memory.
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

// Store rows [0, rows) of `t` as LL lines of epoch `flag` into every peer's inbox: `slot` is the
// local address of this rank's lines for row 0 ([me][row0] of the launch's parity); peers get the
// same offset in their heap. Peers in the order rank+1, rank+2, ... No waiting, no fence.
template <int D>
__device__ inline void cta_push_partial_ll(const PartialTile<D>& t, int rows, uint4* slot, const dev::SymmetricView& v,
                                           uint32_t flag) {
  constexpr int kRow = ll_lines_per_row(D);
  for (int i = threadIdx.x; i < rows * kRow; i += blockDim.x) {
    const int r = i / kRow, j = i % kRow;
    const float2 d = j < D / 2 ? reinterpret_cast<const float2*>(t.o[r])[j] : make_float2(t.lse[r], t.lse[r]);
    for (int k = 1; k < v.world; ++k)
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

// Merge the `world` partials of rows [0, rows) of one group, in rank order, and store the result
// converted to T at out[r*D + d] (8-byte stores). Partial `rank` is `mine` (shared memory); partial
// p != rank is read from the LL lines at inbox[p*sender_lines + r*ll_lines_per_row(D) + j] once
// they carry `flag` (call cta_wait_ll first: then they normally do); a line not yet current is
// polled (bounded: deadline and abort flag, WaitSite::decode_partial naming p).
// Returns false (uniformly across the CTA) when a wait gave up; the caller must leave the kernel.
// Same weights (segment_lse_weights) and accumulation order (accumulate_weighted) as
// cta_combine_partials, so the output has the same bits as the bsp combine of the same partials.
// Preconditions: 1 <= world <= kMaxParts <= blockDim.x, 1 <= rows <= kMaxRows, `mine` and `scratch` not written
// concurrently; every thread of the CTA calls it. Ends with a CTA barrier.
template <class T, int D>
__device__ inline bool cta_combine_ll(const PartialTile<D>& mine, int rows, const uint4* inbox, int64_t sender_lines,
                                      int rank, int world, uint32_t flag, const dev::FaultContext& fc,
                                      CombineScratch& scratch, T* out) {
  constexpr int kRow = ll_lines_per_row(D);
  constexpr int kLanes = D / 4;              // lanes per row: one float4 column (two lines) each
  constexpr int kRowsPerWarp = 32 / kLanes;  // 1 (D = 128) or 2 (D = 64)
  constexpr int kLse = kMaxParts / kLanes;   // LSEs per lane
  constexpr int kBatch = 8;                  // partials whose lines a lane reads before checking any
  constexpr float kNegInf = -INFINITY;
  const int n = world;
  const int lane = threadIdx.x & 31, col = lane % kLanes;
  const int warps = int(blockDim.x) >> 5;
  bool ok = true;
  for (int r0 = (int(threadIdx.x) >> 5) * kRowsPerWarp; r0 < rows; r0 += warps * kRowsPerWarp) {
    // Warp-uniform trip count; a half-warp past the last row redoes that row and stores nothing.
    const int r = r0 + lane / kLanes < rows ? r0 + lane / kLanes : rows - 1;
    const bool owner = r0 + lane / kLanes < rows;
    const uint4* const src = inbox + int64_t(r) * kRow;
    // The data of a line read by ll_peek, once it carries `flag` (polling again if it did not). After
    // a wait gave up, no more waiting: zeros, and the CTA leaves after the final barrier.
    const auto settle = [&](uint4 x, int p, int j) {
      if (dev::ll_current(x, flag)) return make_uint2(x.x, x.z);
      uint2 d = make_uint2(0u, 0u);
      if (ok) ok = dev::ll_load(src + p * sender_lines + j, flag, d, fc, dev::WaitSite::decode_partial, p);
      return d;
    };
    // Reads of every line this lane needs first, checks after: one memory round trip once the data
    // is there. Unconditional, index clamped into [0, n): the lines of partial `rank` and past n
    // are read (valid memory) and ignored.
    uint4 lo[kBatch], hi[kBatch];
    const auto peek_batch = [&](int p0) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const uint4* line = src + (p0 + u < n ? p0 + u : n - 1) * sender_lines + 2 * col;
        lo[u] = dev::ll_peek(line);
        hi[u] = dev::ll_peek(line + 1);
      }
    };
    uint4 lx[kLse];
#pragma unroll
    for (int k = 0; k < kLse; ++k) lx[k] = dev::ll_peek(src + (col + k * kLanes < n ? col + k * kLanes : n - 1) * sender_lines + D / 2);
    peek_batch(0);

    float l[kLse];
#pragma unroll
    for (int k = 0; k < kLse; ++k) {
      const int p = col + k * kLanes;
      l[k] = p >= n ? kNegInf : p == rank ? mine.lse[r] : __uint_as_float(settle(lx[k], p, D / 2).x);
    }
    float* const w = scratch.w[r];
    segment_lse_weights<kLanes>(l, n, col, owner, w);

    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int p0 = 0;;) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int p = p0 + u;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (p == rank) {
          x = reinterpret_cast<const float4*>(mine.o[r])[col];
        } else if (p < n) {
          const uint2 a = settle(lo[u], p, 2 * col), b = settle(hi[u], p, 2 * col + 1);
          x = make_float4(__uint_as_float(a.x), __uint_as_float(a.y), __uint_as_float(b.x), __uint_as_float(b.y));
        }
        accumulate_weighted(acc, p < n ? w[p] : 0.f, x);
      }
      p0 += kBatch;
      if (p0 >= n) break;
      peek_batch(p0);
    }
    if (owner) {
      const uint2 u = make_uint2(ptx::pack2<T>(acc.x, acc.y), ptx::pack2<T>(acc.z, acc.w));
      reinterpret_cast<uint2*>(out + int64_t(r) * D)[col] = u;
    }
  }
  return __syncthreads_and(ok) != 0;
}

}  // namespace taxfree::attention
