// Partial decode attention of one GQA group over one chunk of a sequence: the CTA-level building
// block of the split-KV decode kernel and of the fused multi-rank decode.
//
// Work: one query token per sequence. The CTA serves the `group` (1..16) query heads that share
// KV head `kvh` of sequence `b`, so every K/V row is loaded once for the whole group. The chunk is
// a run of 16-token tiles (absolute tile index = token position / 16), clipped to the slice
// [slice.begin, slice.end); tokens outside the slice are never read (zero-filled, masked to -inf).
//
// How (why it is memory-bound-fast on Hopper):
//  * Each of the kWarps warps owns every kWarps-th tile of the chunk and streams it through its own
//    kStages-deep cp.async ring in shared memory (16-byte copies, L1 bypassed, one warp-wide
//    instruction = 512 contiguous bytes). No CTA barrier in the main loop: a warp waits only for its
//    own copies (cp.async.wait_group + __syncwarp).
//  * The copies carry an L2 evict_first policy: K/V are read once per step, and streaming them
//    would otherwise push out of L2 what the rest of the step reuses (the merge's partials, the
//    exchange lines, the collective's state): -2 to -5 us at batch 1-8 with a cold L2 (r62).
//  * Tensor cores do the math: S = Q K^T with Q as the 16-row A operand (rows >= group are zero)
//    and K rows as the B operand (ldmatrix), then O += P V with P taken straight from the S
//    accumulators (the FlashAttention-2 register layout identity) and V via ldmatrix.trans. A 16-row
//    MMA is ~8x more math than GQA 8 needs, yet tensor cores have >10x headroom over HBM here;
//    CUDA-core FMAs would need ~40% of fp32 peak at GQA 8 and shuffle reductions on top.
//  * Online softmax in the exp2 domain, fp32 statistics per warp: row max m, row sum l of the
//    rounded P values actually fed to the MMA (normalises o: numerator and denominator use
//    identical weights) and row sum le of the unrounded P (gives the LSE, so the cross-partial
//    weights carry no bf16 rounding). The kWarps warp states are merged through shared memory.
//  * Shared-memory rows are XOR-swizzled in 16-byte chunks (chunk ^ row % 8) so the cp.async
//    writes and every ldmatrix phase are bank-conflict free.
//
// Result (in smem.post.tile, after a trailing CTA barrier): for rows r < group,
//   lse[r] = log(sum_j exp(s_j)) in natural log of scaled scores s_j = softmax_scale * q_r . k_j
//   o[r][:] = sum_j exp(s_j - lse[r]) v_j   (normalised, fp32)
// An empty chunk gives lse = -inf, o = 0. Rows >= group are unspecified.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "taxfree/kernels/attention/combine.h"
#include "taxfree/kernels/attention/config.h"
#include "taxfree/kernels/attention/impl/ptx.h"
#include "taxfree/kernels/attention/kv_view.h"

namespace taxfree::attention {

// Shared memory of one attending CTA. The cp.async ring and the post-loop state alias (union):
// cta_attend_chunk separates the phases with CTA barriers. post.tile and post.scratch are free for
// the caller between calls (storing and combining partials); a caller that loops over chunks
// (persistent CTA) must __syncthreads() after its last read of post.* before the next call.
template <int D, int kStages>
struct AttendSmem {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static constexpr int kRowBytes = D * 2;  // bf16/fp16 K/V row
  static constexpr int kTileBytes = kTileTokens * kRowBytes;
  struct Stage {
    alignas(128) unsigned char k[kTileBytes];
    alignas(128) unsigned char v[kTileBytes];
  };
  struct Merge {
    float o[kWarps][kMaxRows][D];  // un-normalised per-warp accumulators
    float m[kWarps][kMaxRows];     // per-warp running max (log2 domain)
    float l[kWarps][kMaxRows];     // per-warp sum of rounded P relative to m
    float le[kWarps][kMaxRows];    // per-warp sum of unrounded P relative to m
  };
  struct Post {
    Merge merge;
    PartialTile<D> tile;     // the CTA's result
    CombineScratch scratch;  // for cta_combine_partials by the caller
    uint64_t word;           // free for the caller: one value to share with the CTA
  };
  union {
    Stage pipe[kWarps][kStages];
    Post post;
  };
  static_assert(sizeof(Post) <= sizeof(pipe), "the post-loop state must not grow the CTA's shared memory");
};

namespace detail {

// (x, y) of a packed pair of T, as the MMA sees them.
template <class T>
__device__ inline float2 unpack2(uint32_t u);
template <>
__device__ inline float2 unpack2<__nv_bfloat16>(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
template <>
__device__ inline float2 unpack2<__half>(uint32_t u) {
  return __half22float2(*reinterpret_cast<__half2*>(&u));
}

// Byte offset of 16-byte chunk `ch` of row `row` inside a swizzled tile.
template <int kRowBytes>
__device__ inline uint32_t swz(int row, int ch) {
  return uint32_t(row * kRowBytes + ((ch ^ (row & 7)) << 4));
}

}  // namespace detail

// Attend tiles [tile_begin, tile_end) of sequence b, KV head kvh, for query rows q[0..group) (q
// points at the group's first query row; rows are D elements apart, 16-byte aligned). scale_log2 =
// softmax_scale * log2(e). Every thread of a kThreads-thread CTA must call it with the same
// arguments. Tiles must lie within the slice's tiles (split_range guarantees it).
template <class T, int D, int kStages, bool kPaged>
__device__ void cta_attend_chunk(const KvView& kv, const T* __restrict__ q, int group, int b, int kvh,
                                 int tile_begin, int tile_end, TokenRange slice, float scale_log2,
                                 AttendSmem<D, kStages>& smem) {
  using Smem = AttendSmem<D, kStages>;
  constexpr int kRowBytes = Smem::kRowBytes;
  constexpr int kChunks = D / 8;                   // 16-byte chunks per row
  constexpr int kRowsPerIter = 32 / kChunks;       // rows one warp-wide copy instruction covers
  constexpr int kIters = kTileTokens / kRowsPerIter;
  constexpr int kKSteps = D / 16;                  // k-steps of S = Q K^T
  constexpr int kNTiles = D / 8;                   // n-tiles of O = P V
  constexpr float kNegInf = -INFINITY;
  static_assert(kStages >= 2, "need a ring of at least two stages");

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int qr = lane >> 2;        // accumulator row of c0/c1 (query head); c2/c3: row qr + 8
  const int qc = (lane & 3) * 2;   // accumulator column pair

  // Q as the A operand, kept in registers for the whole chunk; rows >= group are zero.
  uint32_t qf[kKSteps][4];
  {
    const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q);
    const bool r0 = qr < group, r1 = qr + 8 < group;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const int c = (kk * 16 + qc) / 2;
      qf[kk][0] = r0 ? __ldg(q32 + qr * (D / 2) + c) : 0u;
      qf[kk][1] = r1 ? __ldg(q32 + (qr + 8) * (D / 2) + c) : 0u;
      qf[kk][2] = r0 ? __ldg(q32 + qr * (D / 2) + c + 4) : 0u;
      qf[kk][3] = r1 ? __ldg(q32 + (qr + 8) * (D / 2) + c + 4) : 0u;
    }
  }

  const int n_tiles = tile_end - tile_begin;
  const int my_tiles = n_tiles > warp ? (n_tiles - warp + kWarps - 1) / kWarps : 0;
  const auto tile_pos = [&](int i) { return (tile_begin + warp + i * kWarps) << kTileShift; };

  const unsigned char* kbase = static_cast<const unsigned char*>(kv.k);
  const unsigned char* vbase = static_cast<const unsigned char*>(kv.v);
  int page_reg = 0;  // paged: lane j holds the page of this warp's tile (32*k + j)
  const uint64_t kv_policy = ptx::l2_evict_first_policy();  // K/V are read once per launch

  // Issue the copies of this warp's tile i into its ring slot and commit one group (an empty group
  // past the last tile keeps the wait_group arithmetic uniform).
  const auto issue = [&](int i) {
    if (i < my_tiles) {
      const int pos0 = tile_pos(i);
      int page = 0;
      if constexpr (kPaged) {
        // One coalesced block-table load per 32 tiles instead of a dependent load per tile.
        if ((i & 31) == 0) page_reg = i + lane < my_tiles ? page_of(kv, b, tile_pos(i + lane)) : 0;
        page = __shfl_sync(0xffffffffu, page_reg, i & 31);
      }
      const int64_t base = row_offset<kPaged>(kv, b, kvh, pos0, page);
      auto& st = smem.pipe[warp][i % kStages];
      const uint32_t sk = ptx::smem_u32(st.k), sv = ptx::smem_u32(st.v);
      const int ch = lane % kChunks;
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int row = it * kRowsPerIter + lane / kChunks;
        const int pos = pos0 + row;
        const bool valid = pos >= slice.begin && pos < slice.end;
        const int64_t off = (base + row * kv.stride_token + ch * 8) * 2;
        const uint32_t so = detail::swz<kRowBytes>(row, ch);
        ptx::cp_async_16(sk + so, valid ? kbase + off : kbase, valid, kv_policy);
        ptx::cp_async_16(sv + so, valid ? vbase + off : vbase, valid, kv_policy);
      }
    }
    ptx::cp_async_commit();
  };

  float o[kNTiles][4];
#pragma unroll
  for (int c = 0; c < kNTiles; ++c) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.f;
  float m[2] = {kNegInf, kNegInf};  // running row max of scaled log2 scores
  float l[2] = {0.f, 0.f};          // this thread's part of the row sum of rounded P (rel. to m)
  float le[2] = {0.f, 0.f};         // ... and of the unrounded P (for the LSE)

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  for (int i = 0; i < my_tiles; ++i) {
    // Groups committed so far: kStages - 1 + i; tile i's is complete once at most kStages - 2 are
    // pending. The __syncwarp publishes all lanes' copies to the warp and also retires the reads
    // of slot (i - 1) % kStages (iteration i - 1), which issue() below overwrites.
    ptx::cp_async_wait<kStages - 2>();
    __syncwarp();
    issue(i + kStages - 1);

    const auto& st = smem.pipe[warp][i % kStages];
    const uint32_t sk = ptx::smem_u32(st.k), sv = ptx::smem_u32(st.v);

    // S = Q K^T: two n-tiles of 8 tokens. ldmatrix matrix j of lane i: token row (i % 8),
    // 16-byte chunk 4cc + i/8, i.e. two k-steps per x4.
    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      const int row = j * 8 + (lane & 7);
#pragma unroll
      for (int cc = 0; cc < D / 32; ++cc) {
        uint32_t kb[4];
        ptx::ldmatrix_x4(kb, sk + detail::swz<kRowBytes>(row, cc * 4 + (lane >> 3)));
        ptx::mma_16816<T>(s[j], qf[2 * cc], kb[0], kb[1]);
        ptx::mma_16816<T>(s[j], qf[2 * cc + 1], kb[2], kb[3]);
      }
    }

    // Scale into the log2 domain; tokens outside the slice (first/last tile) get -inf.
    const int pos0 = tile_pos(i);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int pos = pos0 + j * 8 + qc + e;
        const bool ok = pos >= slice.begin && pos < slice.end;
        s[j][e] = ok ? s[j][e] * scale_log2 : kNegInf;
        s[j][2 + e] = ok ? s[j][2 + e] * scale_log2 : kNegInf;
      }

    // Online softmax. The 4 lanes of a quad hold one row's 16 scores.
    float mx[2] = {fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1])),
                   fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]))};
    float mu[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(m[r], mx[r]);
      // All scores so far masked: subtract 0 instead of -inf (no -inf - -inf = NaN); every p and
      // alpha is then exp2(-inf) = 0 and the state stays (m = -inf, l = 0, o = 0).
      mu[r] = mn == kNegInf ? 0.f : mn;
      alpha[r] = ptx::ex2(m[r] - mu[r]);
      m[r] = mn;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[j][0] = ptx::ex2(s[j][0] - mu[0]);
      s[j][1] = ptx::ex2(s[j][1] - mu[0]);
      s[j][2] = ptx::ex2(s[j][2] - mu[1]);
      s[j][3] = ptx::ex2(s[j][3] - mu[1]);
    }
    le[0] = le[0] * alpha[0] + ((s[0][0] + s[0][1]) + (s[1][0] + s[1][1]));
    le[1] = le[1] * alpha[1] + ((s[0][2] + s[0][3]) + (s[1][2] + s[1][3]));
    uint32_t pa[4];  // P as the A operand: (row qr, tok 0-7), (qr+8, 0-7), (qr, 8-15), (qr+8, 8-15)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      pa[2 * j] = ptx::pack2<T>(s[j][0], s[j][1]);
      pa[2 * j + 1] = ptx::pack2<T>(s[j][2], s[j][3]);
    }
    // Sum the rounded P the MMA consumes, so o / l uses the same weights on both sides.
    const float2 p00 = detail::unpack2<T>(pa[0]), p01 = detail::unpack2<T>(pa[1]);
    const float2 p10 = detail::unpack2<T>(pa[2]), p11 = detail::unpack2<T>(pa[3]);
    l[0] = l[0] * alpha[0] + ((p00.x + p00.y) + (p10.x + p10.y));
    l[1] = l[1] * alpha[1] + ((p01.x + p01.y) + (p11.x + p11.y));
#pragma unroll
    for (int c = 0; c < kNTiles; ++c) {
      o[c][0] *= alpha[0];
      o[c][1] *= alpha[0];
      o[c][2] *= alpha[1];
      o[c][3] *= alpha[1];
    }

    // O += P V. ldmatrix.trans matrices: (tok 0-7, chunk 2cv), (tok 8-15, 2cv), (tok 0-7, 2cv+1),
    // (tok 8-15, 2cv+1) -> B fragments of d n-tiles 2cv and 2cv+1.
#pragma unroll
    for (int cv = 0; cv < D / 16; ++cv) {
      uint32_t vb[4];
      const int row = ((lane >> 3) & 1) * 8 + (lane & 7);
      ptx::ldmatrix_x4_trans(vb, sv + detail::swz<kRowBytes>(row, cv * 2 + (lane >> 4)));
      ptx::mma_16816<T>(o[2 * cv], pa, vb[0], vb[1]);
      ptx::mma_16816<T>(o[2 * cv + 1], pa, vb[2], vb[3]);
    }
  }
  ptx::cp_async_wait<0>();  // only empty groups can remain; drain before the ring is reused

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    le[r] += __shfl_xor_sync(0xffffffffu, le[r], 1);
    le[r] += __shfl_xor_sync(0xffffffffu, le[r], 2);
  }

  // Merge the warps' states: (M, L) = max and rescaled sum over warps, o = sum_w f_w o_w / L.
  __syncthreads();  // every warp is done with the ring, which `merge` aliases
  auto& mg = smem.post.merge;
#pragma unroll
  for (int c = 0; c < kNTiles; ++c) {
    *reinterpret_cast<float2*>(&mg.o[warp][qr][c * 8 + qc]) = make_float2(o[c][0], o[c][1]);
    *reinterpret_cast<float2*>(&mg.o[warp][qr + 8][c * 8 + qc]) = make_float2(o[c][2], o[c][3]);
  }
  if ((lane & 3) == 0) {
    mg.m[warp][qr] = m[0];
    mg.m[warp][qr + 8] = m[1];
    mg.l[warp][qr] = l[0];
    mg.l[warp][qr + 8] = l[1];
    mg.le[warp][qr] = le[0];
    mg.le[warp][qr + 8] = le[1];
  }
  __syncthreads();

  auto& out = smem.post.tile;
  constexpr int kVec = D / 4;
  constexpr float kLn2 = 0.693147180559945309f;
  for (int idx = threadIdx.x; idx < group * kVec; idx += kThreads) {
    const int r = idx / kVec, c = idx % kVec;
    float mmax = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mmax = fmaxf(mmax, mg.m[w][r]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float lsum = 0.f, lexact = 0.f;
    if (mmax != kNegInf) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float mw = mg.m[w][r];
        if (mw == kNegInf) continue;  // warp saw no token: l = 0, o = 0
        const float f = ptx::ex2(mw - mmax);
        lsum += f * mg.l[w][r];
        lexact += f * mg.le[w][r];
        const float4 x = reinterpret_cast<const float4*>(mg.o[w][r])[c];
        acc.x += f * x.x;
        acc.y += f * x.y;
        acc.z += f * x.z;
        acc.w += f * x.w;
      }
      // lsum, lexact >= 1: the warp holding the max has a P of exactly 1 (exp2(0)) in its sums.
      const float inv = 1.f / lsum;
      acc.x *= inv;
      acc.y *= inv;
      acc.z *= inv;
      acc.w *= inv;
    }
    reinterpret_cast<float4*>(out.o[r])[c] = acc;
    if (c == 0) out.lse[r] = mmax == kNegInf ? kNegInf : (mmax + log2f(lexact)) * kLn2;
  }
  __syncthreads();
}

}  // namespace taxfree::attention
