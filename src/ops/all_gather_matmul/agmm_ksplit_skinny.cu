// all_gather_matmul `ksplit`, skinny path (M <= kSkinnyMaxM): the whole op in one kernel per rank.
// CTA j of every rank owns column slices j, j + ctas, ... of C (KsplitSkinny) and range j of the
// A_shard lines. Per CTA:
//  1. its A_shard lines into this rank's gathered A (unless in place) and, as LL lines, into every
//     peer's inbox (first: they travel while the GEMM runs);
//  2. per slice, P_rank[:, slice] = A_shard x B[this rank's K rows, slice] in fp32 on tensor cores,
//     sent to every peer as LL lines (ll_line.cuh: data and epoch in one 16-byte store, no fence,
//     no flag) and kept in `own`;
//  3. per slice, one thread per peer waits for the peer's last line of the slice, then
//     C = P_0 + P_1 + ... + P_{world-1} in rank order in fp32, rounded once: the same operations
//     on the same bits on every rank, so C is the same bits everywhere (the two-kernel path's rule);
//  4. the peers' A lines of range j into this rank's gathered A.
// CTA j waits only for CTA j of its peers: all CTAs of the grid (<= resident CTAs, the host checks
// with the occupancy API) are running, so the waits cannot deadlock when no other kernel holds the
// SMs (the header's ksplit caveat).
//
// GEMM: warps split K, not columns. A slice is 32 columns (4 MMA n-tiles), fewer than one n-tile per
// warp if split by columns; K / world is thousands. Warp w takes K chunks of 64 w, w + 8, ... and
// streams each (B: 32 x 64, A: m x 64) through its own cp.async ring (16-byte copies, L1 bypassed,
// zero-filled past N and past K / world), so no CTA barrier sits in the main loop; the 8 warps'
// fp32 sums meet once per slice in shared memory (aliasing the ring), added in warp order. With 192
// KiB of ring per CTA (one CTA per SM) 96-144 KiB are in flight per SM at m <= 16, which HBM needs
// to stream half of B near its bandwidth. A rows >= m are zero in shared memory (MMA row padding).
// Shared memory rows are 128-byte lines of 8 16-byte chunks, XOR-swizzled (chunk ^ line % 8): an A
// or NK B row per line, two KN B rows (64 bytes each) per line; every ldmatrix phase reads 8
// distinct bank groups. NK B tiles give the MMA's col B operand through ldmatrix, KN through
// ldmatrix.trans.
//
// Epochs, buffers, reuse (no host reset between launches, CUDA-graph safe):
//  * epoch e = dev::sequence_begin(seq), the op's ksplit sequence (+1 per ksplit launch, either
//    path); lines carry dev::ll_flag(e) and a receiver accepts a line only when it carries e's.
//  * Launch e uses inbox parity e & 1. A sender at e + 2 overwrites what a receiver R reads at e.
//    It got there only after its launch e + 1 ended, which waited for something R sends in R's
//    launch e + 1 (skinny: partial lines; two-kernel path: flags), which starts after R's launch e
//    ended (stream order). So no "buffer free" handshake (fused_decode_kernel.h's argument: every
//    rank receives from every rank in every launch, whatever the shapes of e, e + 1, e + 2).
//  * The gathered A: only this rank writes it (its own shard and the peers' lines), during launch
//    e; the caller's uses of launch e - 1's gathered A precede launch e on the stream, and a peer's
//    two-kernel launch e - 1 finished its stores into it before this rank's e - 1 saw its flags. So
//    it needs no parity and no "ready" handshake, and stays valid until the next launch.
//  * Flags repeat every 2^32 - 1 launches (a line unwritten for a multiple of that would pass).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "agmm_internal.h"
#include "taxfree/device/ll_line.cuh"
#include "taxfree/kernels/attention/impl/ptx.h"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

namespace {

namespace ptx = attention::ptx;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kChunkK = 64;                     // K per ring stage: one 128-byte line per A / NK B row
constexpr int kCols = kSkinnySliceCols;         // 32
constexpr int kNTiles = kCols / 8;              // MMA n-tiles per slice
constexpr int kRedLd = kCols + 8;               // reduce-buffer row stride (floats): fewer bank conflicts
constexpr int kBatch = 8;                       // peers whose lines a thread reads before checking any
constexpr uint32_t kBackoffNs = 32;             // per miss of the one-thread wait: << a one-way trip
static_assert(kCols == 32, "the KN tile puts two 64-byte B rows in one 128-byte line");

// One warp's ring: kStages stages of [B tile | A tile]; 192 KiB per CTA for every m_tiles.
template <int MT>
struct Ring {
  static constexpr int kBBytes = kCols * kChunkK * 2;
  static constexpr int kABytes = MT * 16 * kChunkK * 2;
  static constexpr int kStageBytes = kBBytes + kABytes;
  static constexpr int kStages = MT == 1 ? 4 : 3;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kBytes = kWarps * kWarpBytes;
  static_assert(kWarps * MT * 16 * kRedLd * 4 <= kBytes, "the reduce buffer aliases the rings");
};

// Byte offset of 16-byte chunk `chunk` (0..7) of 128-byte line `line`.
__device__ __forceinline__ uint32_t swz(int line, int chunk) {
  return uint32_t(line * 128 + ((chunk ^ (line & 7)) << 4));
}

// The data of a line read by ll_peek, once it carries `flag` (polling it alone, bounded, if it did
// not; a timeout names `site` and `peer`). After a wait gave up (`ok` false) no more waiting: zeros.
__device__ __forceinline__ uint2 settle(uint4 x, const uint4* line, uint32_t flag, const dev::FaultContext& fc,
                                        dev::WaitSite site, int peer, bool& ok) {
  if (dev::ll_current(x, flag)) return make_uint2(x.x, x.z);
  uint2 d = make_uint2(0u, 0u);
  if (ok) ok = dev::ll_load(line, flag, d, fc, site, peer);
  return d;
}

// This warp's partial of slice columns [n0, n0 + 32) over its K chunks, into acc.
template <class T, bool kKN, int MT>
__device__ __forceinline__ void warp_partial(const KsplitSkinnyLaunch& a, int64_t n0, unsigned char* ring,
                                             float (&acc)[MT][kNTiles][4]) {
  using R = Ring<MT>;
  const KsplitSkinny& p = a.plan;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int chunks = int((p.shard_cols + kChunkK - 1) / kChunkK);
  const int mine = chunks > warp ? (chunks - warp + kWarps - 1) / kWarps : 0;
  const uint32_t base = ptx::smem_u32(ring);

  // Rows >= m of every A tile are MMA padding: zero (the copies below never write them). The
  // reduce buffer of the previous slice aliased them.
  const int pad = MT * 16 - int(p.m);
  for (int x = lane; x < R::kStages * pad * 8; x += 32) {
    const int st = x / (pad * 8), row = int(p.m) + x % (pad * 8) / 8;
    *reinterpret_cast<uint4*>(ring + st * R::kStageBytes + R::kBBytes + swz(row, x % 8)) = make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;

  // Copies of this warp's chunk i into its stage, then one commit (an empty group past the last
  // chunk keeps the wait_group arithmetic uniform).
  const auto issue = [&](int i) {
    if (i < mine) {
      const int64_t kb = int64_t(warp + i * kWarps) * kChunkK;  // shard-local first K
      const uint32_t sb = base + (i % R::kStages) * R::kStageBytes, sa = sb + R::kBBytes;
#pragma unroll
      for (int it = 0; it < kCols * kChunkK / (8 * 32); ++it) {
        if constexpr (kKN) {  // 64 K rows of 4 chunks: 8 rows per instruction
          const int row = it * 8 + (lane >> 2), ch = lane & 3;
          const int64_t k = kb + row, n = n0 + ch * 8;
          const bool valid = k < p.shard_cols && n < p.n;
          ptx::cp_async_16(sb + swz(row >> 1, (row & 1) * 4 + ch), valid ? a.b + (k * a.ldb + n) * 2 : a.b, valid);
        } else {  // 32 N rows of 8 chunks: 4 rows per instruction
          const int row = it * 4 + (lane >> 3), ch = lane & 7;
          const int64_t n = n0 + row, k = kb + ch * 8;
          const bool valid = n < p.n && k < p.shard_cols;
          ptx::cp_async_16(sb + swz(row, ch), valid ? a.b + (n * a.ldb + k) * 2 : a.b, valid);
        }
      }
      for (int x = lane; x < int(p.m) * 8; x += 32) {
        const int row = x >> 3, ch = x & 7;
        const int64_t k = kb + ch * 8;
        const bool valid = k < p.shard_cols;  // shard_cols % 8 == 0: a chunk is all in or all out
        ptx::cp_async_16(sa + swz(row, ch), valid ? a.a + (row * a.lda + k) * 2 : a.a, valid);
      }
    }
    ptx::cp_async_commit();
  };

#pragma unroll
  for (int s = 0; s < R::kStages - 1; ++s) issue(s);
  for (int i = 0; i < mine; ++i) {
    // Committed groups: kStages - 1 + i; chunk i's is complete once at most kStages - 2 are
    // pending. The __syncwarp publishes every lane's copies (and the padding zeros) to the warp and
    // retires the reads of stage (i - 1) % kStages, which issue() overwrites.
    ptx::cp_async_wait<R::kStages - 2>();
    __syncwarp();
    issue(i + R::kStages - 1);
    const uint32_t sb = base + (i % R::kStages) * R::kStageBytes, sa = sb + R::kBBytes;
#pragma unroll
    for (int kk = 0; kk < kChunkK / 16; ++kk) {
      uint32_t bf[kNTiles][2];
#pragma unroll
      for (int jp = 0; jp < kNTiles / 2; ++jp) {  // matrices: (n-tile 2jp | 2jp + 1) x (k 0-7 | 8-15)
        uint32_t r[4];
        if constexpr (kKN) {
          const int k = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
          ptx::ldmatrix_x4_trans(r, sb + swz(k >> 1, (k & 1) * 4 + jp * 2 + (lane >> 4)));
        } else {
          ptx::ldmatrix_x4(r, sb + swz((jp * 2 + (lane >> 4)) * 8 + (lane & 7), kk * 2 + ((lane >> 3) & 1)));
        }
        bf[2 * jp][0] = r[0], bf[2 * jp][1] = r[1], bf[2 * jp + 1][0] = r[2], bf[2 * jp + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t af[4];  // matrices: (rows 0-7 | 8-15) x (k 0-7 | 8-15)
        ptx::ldmatrix_x4(af, sa + swz(mt * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), kk * 2 + (lane >> 4)));
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) ptx::mma_16816<T>(acc[mt][j], af, bf[j][0], bf[j][1]);
      }
    }
  }
  ptx::cp_async_wait<0>();  // only empty groups remain; drained before the ring is reused
}

template <class T, bool kKN, int MT>
__global__ void __launch_bounds__(kThreads, 1) ksplit_skinny_kernel(const __grid_constant__ KsplitSkinnyLaunch a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const dev::SymmetricView& v = a.view;
  const KsplitSkinny& p = a.plan;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const uint64_t epoch = dev::sequence_begin(a.seq);
  const uint32_t flag = dev::ll_flag(epoch);
  uint4* const inbox = a.inbox + int64_t(epoch & 1) * (v.world - 1) * a.slot_lines;  // this launch's parity
  // Where this rank's lines go in rank q's inbox (a local address; v.peer translates it).
  const auto out_slot = [&](int q) { return inbox + KsplitSlices::slot(v.rank, q) * a.slot_lines; };
  const auto in_slot = [&](int src) { return inbox + KsplitSlices::slot(src, v.rank) * a.slot_lines; };
  const bool send = !a.skip_signal;

  // 1. A_shard lines of range j: this rank's gathered A, then every peer, rank+1, rank+2, ...
  const KsplitSlices::Range ar = p.a_range(blockIdx.x);
  const int64_t row_lines = p.a_lines_per_row();
  for (int64_t u = ar.begin + t; u < ar.end; u += kThreads) {
    const int64_t r = u / row_lines, c = u % row_lines * 4;
    const uint2 d = __ldg(reinterpret_cast<const uint2*>(a.a + (r * a.lda + c) * 2));
    if (a.copy_local) *reinterpret_cast<uint2*>(a.gathered + r * a.ld + (v.rank * p.shard_cols + c) * 2) = d;
    for (int i = 1; send && i < v.world; ++i) {
      const int q = (v.rank + i) % v.world;
      dev::ll_store(v.peer(out_slot(q) + a.partial_cap + u, q), d.x, d.y, flag);
    }
  }

  // 2. This rank's partial of each slice: every warp's K chunks, summed in warp order, into `own`
  //    and into every peer's inbox.
  float(*red)[MT * 16][kRedLd] = reinterpret_cast<float(*)[MT * 16][kRedLd]>(smem);
  const int lines = int(p.m) * kSkinnyLinesPerRow;  // per slice
  for (int s = blockIdx.x; s < p.slices; s += gridDim.x) {
    const int64_t n0 = int64_t(s) * kCols;
    float acc[MT][kNTiles][4];
    warp_partial<T, kKN, MT>(a, n0, smem + warp * Ring<MT>::kWarpBytes, acc);
    __syncthreads();  // every warp is done with its ring, which `red` aliases
    const int g = lane >> 2, c2 = (lane & 3) * 2;  // accumulator row, column pair
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        *reinterpret_cast<float2*>(&red[warp][mt * 16 + g][j * 8 + c2]) = make_float2(acc[mt][j][0], acc[mt][j][1]);
        *reinterpret_cast<float2*>(&red[warp][mt * 16 + g + 8][j * 8 + c2]) = make_float2(acc[mt][j][2], acc[mt][j][3]);
      }
    __syncthreads();
    for (int x = t; x < lines; x += kThreads) {
      const int row = x / kSkinnyLinesPerRow, pair = x % kSkinnyLinesPerRow;
      float2 sum = *reinterpret_cast<const float2*>(&red[0][row][2 * pair]);
#pragma unroll
      for (int w = 1; w < kWarps; ++w) {
        const float2 y = *reinterpret_cast<const float2*>(&red[w][row][2 * pair]);
        sum.x += y.x, sum.y += y.y;
      }
      const int64_t col = n0 + 2 * pair;
      if (col < p.n) *reinterpret_cast<float2*>(a.own + row * p.ldp + col) = sum;  // ldp >= col + 2
      const int64_t line = p.partial_line(s, row) + pair;
      for (int i = 1; send && i < v.world; ++i) {
        const int q = (v.rank + i) % v.world;
        dev::ll_store(v.peer(out_slot(q) + line, q), __float_as_uint(sum.x), __float_as_uint(sum.y), flag);
      }
    }
    __syncthreads();  // the reads of `red` end before the next slice's copies
  }

  // 3. C of each slice from every rank's partial, in rank order. Thread x handles the same (row,
  //    pair) as in step 2, so it reads back its own stores of `own`.
  bool ok = true;
  for (int s = blockIdx.x; s < p.slices; s += gridDim.x) {
    if (ok && t < v.world && t != v.rank) {  // the highest line of the slice: stored in the sender's last round
      uint2 last;
      ok = dev::ll_load(in_slot(t) + p.partial_line(s, p.m - 1) + kSkinnyLinesPerRow - 1, flag, last, a.fault,
                        dev::WaitSite::ksplit_partial, t, kBackoffNs);
    }
    if (__syncthreads_and(ok) == 0) break;
    const int64_t n0 = int64_t(s) * kCols;
    for (int x = t; x < lines; x += kThreads) {
      const int row = x / kSkinnyLinesPerRow, pair = x % kSkinnyLinesPerRow;
      const int64_t col = n0 + 2 * pair, line = p.partial_line(s, row) + pair;
      if (col >= p.n) continue;
      float2 sum = make_float2(0.f, 0.f);
      for (int s0 = 0; s0 < v.world; s0 += kBatch) {
        // Reads of the batch's lines first, checks after: one memory round trip once they are there.
        uint4 got[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int src = s0 + u < v.world ? s0 + u : v.world - 1;
          got[u] = src == v.rank ? make_uint4(0, 0, 0, 0) : dev::ll_peek(in_slot(src) + line);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int src = s0 + u;
          if (src >= v.world) break;
          float2 y;
          if (src == v.rank) {
            y = *reinterpret_cast<const float2*>(a.own + row * p.ldp + col);
          } else {
            const uint2 d = settle(got[u], in_slot(src) + line, flag, a.fault, dev::WaitSite::ksplit_partial, src, ok);
            y = make_float2(__uint_as_float(d.x), __uint_as_float(d.y));
          }
          if (src == 0) sum = y;
          else sum.x += y.x, sum.y += y.y;
        }
      }
      T* dst = static_cast<T*>(a.c) + row * a.ldc + col;
      const uint32_t packed = ptx::pack2<T>(sum.x, sum.y);
      if (col + 1 < p.n) *reinterpret_cast<uint32_t*>(dst) = packed;  // ldc % 8 == 0, col even: aligned
      else *reinterpret_cast<uint16_t*>(dst) = uint16_t(packed & 0xffffu);
    }
  }
  ok = __syncthreads_and(ok) != 0;

  // 4. The peers' A lines of range j into this rank's gathered A (sent first; all but certainly
  //    there by now, each still checked).
  for (int64_t u = ar.begin + t; ok && u < ar.end; u += kThreads) {
    const int64_t r = u / row_lines, c = u % row_lines * 4;
    for (int src = 0; src < v.world; ++src) {
      if (src == v.rank) continue;
      const uint4* line = in_slot(src) + a.partial_cap + u;
      const uint2 d = settle(dev::ll_peek(line), line, flag, a.fault, dev::WaitSite::ksplit_a_lines, src, ok);
      *reinterpret_cast<uint2*>(a.gathered + r * a.ld + (src * p.shard_cols + c) * 2) = d;
    }
  }
  dev::sequence_end(a.seq, epoch);
}

using Kernel = void (*)(KsplitSkinnyLaunch);

template <class T, bool kKN>
Kernel kernel_for(int m_tiles) {
  return m_tiles == 1 ? ksplit_skinny_kernel<T, kKN, 1> : ksplit_skinny_kernel<T, kKN, 2>;
}

Kernel kernel_for(gemm::DType d, gemm::BLayout l, int m_tiles) {
  const bool kn = l == gemm::BLayout::kn;
  if (d == gemm::DType::bf16) return kn ? kernel_for<__nv_bfloat16, true>(m_tiles) : kernel_for<__nv_bfloat16, false>(m_tiles);
  return kn ? kernel_for<__half, true>(m_tiles) : kernel_for<__half, false>(m_tiles);
}

int smem_bytes(int m_tiles) {
  return m_tiles == 1 ? Ring<1>::kBytes : Ring<2>::kBytes;
}

// Per kernel, once (thread-safe static init, from the op's constructor: loads the module before
// any launch, sets the opt-in above 48 KiB of dynamic shared memory, and asks the occupancy API how
// many CTAs one SM holds), index [dtype][layout][m_tiles 1, 2].
struct Resident {
  int per_sm[2][2][2];
};
const Resident& resident() {
  static const Resident r = [] {
    Resident x{};
    for (int d = 0; d < 2; ++d)
      for (int l = 0; l < 2; ++l)
        for (int i = 0; i < 2; ++i) {
          const int mt = 1 << i;
          const Kernel k = kernel_for(d == 0 ? gemm::DType::bf16 : gemm::DType::fp16,
                                      l == 0 ? gemm::BLayout::nk : gemm::BLayout::kn, mt);
          TF_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(mt)));
          TF_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&x.per_sm[d][l][i], k, kThreads,
                                                                size_t(smem_bytes(mt))));
        }
    return x;
  }();
  return r;
}

}  // namespace

void preload_ksplit_skinny() { (void)resident(); }

int ksplit_skinny_ctas_per_sm(gemm::DType dtype, gemm::BLayout layout, int m_tiles) {
  return resident().per_sm[dtype == gemm::DType::bf16 ? 0 : 1][layout == gemm::BLayout::nk ? 0 : 1]
                          [m_tiles == 1 ? 0 : 1];
}

void enqueue_ksplit_skinny(const KsplitSkinnyLaunch& l, cudaStream_t s) {
  const KsplitSkinny& p = l.plan;
  TF_REQUIRE(p.m_tiles == 1 || p.m_tiles == 2, Status::Internal,
             "ksplit-skinny with m_tiles=" << p.m_tiles);
  TF_REQUIRE(p.m >= 1 && p.m <= 16 * p.m_tiles && p.ctas >= 1 && p.ctas <= p.slices, Status::Internal,
             "ksplit-skinny plan M=" << p.m << " m_tiles=" << p.m_tiles << " ctas=" << p.ctas << " slices=" << p.slices);
  TF_REQUIRE(p.partial_lines() <= l.partial_cap && l.partial_cap + p.a_lines() <= l.slot_lines, Status::Internal,
             "ksplit-skinny: " << p.partial_lines() << " partial and " << p.a_lines() << " A lines exceed the inbox ("
                               << l.partial_cap << ", " << l.slot_lines << ")");
  (void)resident();
  kernel_for(l.dtype, l.b_layout, p.m_tiles)<<<p.ctas, kThreads, smem_bytes(p.m_tiles), s>>>(l);
  TF_CUDA(cudaGetLastError());
}

}  // namespace taxfree::agmm
