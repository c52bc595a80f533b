// GPU tests of the GEMM engine: every compiled kernel against a double-precision host reference
// on fresh random inputs, odd shapes, both B layouts, bf16 and fp16, guard bands and padding around
// C, repeated launches, and every hook (rotated tile order, A-ready flags set by another kernel,
// store into a second buffer, add into a buffer, fp32 out), with and without clusters. Split-K, stream-K and
// cluster tails: gemm_split_test.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "gemm_test_util.h"
#include "gpu_env.h"
#include "taxfree/device/signal.cuh"
#include "taxfree/ops/cublaslt_gemm.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_launch.cuh"

namespace taxfree::gemm {
namespace {

using device::Major;
using namespace test;

// Odd sizes (M = 1, 127, 1000; N = 3592 and N not a multiple of 8; K = 8200 and odd K), plus a
// problem with several tiles per CTA so the pipeline's phases wrap across tiles.
const ShapeCase kShapes[] = {{1, 3592, 8200}, {127, 3590, 1001}, {1000, 3592, 8200}, {4096, 4096, 512}};

class GemmAllConfigs : public ::testing::TestWithParam<ShapeParam> {};

TEST_P(GemmAllConfigs, MatchesReference) {
  TF_REQUIRE_GPUS(1);
  const auto [shape_index, dtype, layout] = GetParam();
  const ShapeCase s = kShapes[shape_index];
  const Problem p = make_problem(s.m, s.n, s.k, dtype, layout, 1234 + shape_index * 17 + int(dtype) * 5 + int(layout));
  Output out(p);
  StreamGuard st;
  std::vector<GemmConfig> configs = compiled_configs();
  configs.push_back(choose_gemm_config(s.m, s.n, s.k, dtype, layout, device_sm_count()));
  for (GemmConfig cfg : configs) {
    if (layout == BLayout::kn && cfg.bn % 64 != 0) continue;
    cfg.group_m = 3;  // groups that do not divide the m-blocks
    const std::string what = label(s, dtype, layout) + " " + cfg.name();
    expect_repeatable(p, out, cfg, st.s, what);  // each launch into poisoned C, the same bits
  }
  // The heuristic entry point and the cuBLASLt baseline on the same problem.
  out.poison(st.s);
  launch(p.args(out.c()), st.s);
  TF_CUDA(cudaStreamSynchronize(st.s));
  expect_matches(p, out.read(), label(s, dtype, layout) + " heuristic");
  out.poison(st.s);
  cublaslt_launch(p.args(out.c()), st.s);
  TF_CUDA(cudaStreamSynchronize(st.s));
  expect_matches(p, out.read(), label(s, dtype, layout) + " cuBLASLt");
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmAllConfigs,
                         ::testing::Combine(::testing::Range(0, int(std::size(kShapes))),
                                            ::testing::Values(DType::bf16, DType::fp16),
                                            ::testing::Values(BLayout::nk, BLayout::kn)),
                         shape_param_name(kShapes));

using Big = TileShape<128, 256, 4>;
template <class Shape>
GemmConfig config_of() {
  GemmConfig cfg;
  cfg.bm = Shape::BM, cfg.bn = Shape::BN, cfg.stages = Shape::kStages, cfg.cluster_m = Shape::kCluster;
  cfg.swap_ab = Shape::kSwapAB;
  return cfg;
}
GemmConfig big_config() { return config_of<Big>(); }

template <class Shape>
void expect_rotated_order_for_every_rank() {
  const Problem p = make_problem(1000, 2056, 704, DType::bf16, BLayout::nk, 77);
  Output out(p);
  StreamGuard st;
  GemmConfig cfg = big_config();
  cfg.cluster_m = Shape::kCluster;
  for (int world : {2, 3, 8})
    for (int rank = 0; rank < world; ++rank) {
      // The order counts cluster tiles of BM * kCluster rows.
      const RotatedOrder::Params order{rank_first_m_block(p.m, Shape::BM * Shape::kCluster, rank, world)};
      out.poison(st.s);
      launch_gemm<Shape, __nv_bfloat16, Major::K, RotatedOrder, AlwaysReady, StoreTo>(p.args(nullptr), cfg, order, {},
                                                                                     {out.c(), p.ldc}, st.s);
      TF_CUDA(cudaStreamSynchronize(st.s));
      expect_matches(p, out.read(), "rotated order " + cfg.name() + " world " + std::to_string(world) + " rank " +
                                        std::to_string(rank));
    }
}

TEST(GemmHooks, RotatedTileOrderForEveryRank) {
  TF_REQUIRE_GPUS(1);
  expect_rotated_order_for_every_rank<Big>();
  expect_rotated_order_for_every_rank<TileShape<128, 256, 4, 2>>();
}

// --- A-ready hook: the producer waits for per-m-block flags that another kernel sets ------------

// Test policy: before loading a tile's first A k-block, wait for flags[tile.m] >= epoch with the
// library's bounded wait (deadline + abort flag + wait record), then make A visible to TMA (P4).
struct FlagWait {
  struct Params {
    const uint64_t* flags;
    uint64_t epoch;
    dev::FaultContext fault;
  };
  TF_HOST_DEVICE static uint64_t max_wait_ns(const Params& p) { return p.fault.timeout_ns; }
  __device__ static void wait(const Params& p, TileCoord tile, int k_block) {
    if (k_block != 0) return;
    dev::wait_geq(p.flags + tile.m, p.epoch, p.fault, dev::WaitSite::gemm_a_ready, -1);
    dev::fence_proxy_async_global();
  }
};

// Publishes A one 128-row block at a time, last block first, `delay_ns` apart: copies the rows
// from `src`, then sets flags[block] = epoch (pattern P2: block stores, bar.sync, one release).
__global__ void publish_a(const uint16_t* src, uint16_t* dst, int64_t m, int64_t lda, int bm, uint64_t* flags,
                          uint64_t epoch, uint64_t delay_ns) {
  const int m_blocks = int((m + bm - 1) / bm);
  for (int blk = m_blocks - 1; blk >= 0; --blk) {
    if (threadIdx.x == 0) {
      const uint64_t start = dev::global_timer_ns();
      while (dev::global_timer_ns() - start < delay_ns) __nanosleep(1000);
    }
    __syncthreads();
    const int64_t begin = int64_t(blk) * bm * lda, end = std::min<int64_t>(m, int64_t(blk + 1) * bm) * lda;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) dst[i] = src[i];
    __syncthreads();
    if (threadIdx.x == 0) dev::signal_set(flags + blk, epoch);
  }
}

template <class Shape>
void expect_a_ready_waits() {
  const Problem p = make_problem(1000, 1536, 1024, DType::bf16, BLayout::nk, 99);
  Output out(p);
  DevBuf a(p.a.size() * 2), flags(64 * sizeof(uint64_t));
  TF_CUDA(cudaMemset(flags.p, 0, 64 * sizeof(uint64_t)));
  // Abort flag and wait record in host-mapped memory, as the Team provides them.
  uint32_t* abort = nullptr;
  dev::WaitRecord* record = nullptr;
  TF_CUDA(cudaHostAlloc(&abort, sizeof(uint32_t), cudaHostAllocMapped));
  TF_CUDA(cudaHostAlloc(&record, sizeof(dev::WaitRecord), cudaHostAllocMapped));
  *abort = 0;
  std::memset(record, 0, sizeof(*record));
  dev::FaultContext fault;
  fault.abort = abort;
  fault.record = record;
  fault.timeout_ns = 5'000'000'000ull;
  StreamGuard gemm_stream, writer_stream;
  // Load the writer's code before the GEMM runs: with lazy module loading (the CUDA default) the
  // first launch of a kernel waits for the device to idle, which would wait for the GEMM, which
  // waits for the writer.
  cudaFuncAttributes attr;
  TF_CUDA(cudaFuncGetAttributes(&attr, publish_a));
  for (uint64_t epoch = 1; epoch <= 2; ++epoch) {  // epochs, not resets: flags keep their values
    TF_CUDA(cudaMemset(a.p, 0xFF, p.a.size() * 2));  // A starts as NaN: reading it early poisons C
    out.poison(gemm_stream.s);
    TF_CUDA(cudaDeviceSynchronize());
    GemmArgs args = p.args(nullptr);
    args.a = a.p;
    GemmConfig cfg = config_of<Shape>();
    cfg.max_ctas = device_sm_count() - 8;  // a GEMM CTA fills its SM: leave some for the writer
    launch_gemm<Shape, __nv_bfloat16, Major::K, GroupedOrder, FlagWait, StoreTo>(
        args, cfg, {}, {static_cast<const uint64_t*>(flags.p), epoch, fault}, {out.c(), p.ldc}, gemm_stream.s);
    publish_a<<<1, 256, 0, writer_stream.s>>>(static_cast<const uint16_t*>(p.da->p), static_cast<uint16_t*>(a.p), p.m,
                                               p.lda, Shape::BM, static_cast<uint64_t*>(flags.p), epoch, 300'000);
    TF_CUDA(cudaGetLastError());
    TF_CUDA(cudaDeviceSynchronize());
    ASSERT_EQ(record->complete, 0u) << "an A-ready wait gave up: m-block " << record->flag_offset << " observed "
                                    << record->observed << " expected " << record->expected;
    ASSERT_EQ(*abort, 0u);
    expect_matches(p, out.read(), "A-ready flags, " + cfg.name() + ", epoch " + std::to_string(epoch));
  }
  cudaFreeHost(record);
  cudaFreeHost(abort);
}

TEST(GemmHooks, AReadyWaitsForFlagsSetByAnotherKernel) {
  TF_REQUIRE_GPUS(1);
  expect_a_ready_waits<Big>();
  expect_a_ready_waits<TileShape<128, 256, 4, 2>>();  // the peer CTA's producer waits on its own flags
  // Swap-AB: tile.m still counts m-blocks of BM rows of A (16 of them here), waited for before
  // the load of A's k-block.
  expect_a_ready_waits<TileShape<64, 128, 8, 1, true>>();
  // The 192-row swap-AB tile: a waiting producer with the consumers' registers rebalanced (6 m-blocks).
  expect_a_ready_waits<TileShape<192, 128, 4, 1, true>>();
}

// --- Epilogue destinations -------------------------------------------------------------------------

TEST(GemmHooks, StoreIntoASecondBuffer) {
  TF_REQUIRE_GPUS(1);
  const Problem p = make_problem(300, 1000, 520, DType::fp16, BLayout::kn, 5);
  Output c(p), c2(p);
  StreamGuard st;
  c.poison(st.s);
  c2.poison(st.s);
  launch_gemm<Big, __half, Major::MN, GroupedOrder, AlwaysReady, StoreTo>(p.args(c.c()), big_config(), {}, {},
                                                                         {c2.c(), p.ldc}, st.s);
  TF_CUDA(cudaStreamSynchronize(st.s));
  expect_matches(p, c2.read(), "store into C2");
  for (uint16_t v : c.read()) ASSERT_EQ(v, kPoison) << "C was written although the epilogue targets C2";
}

template <class Shape, class T, Major kMajorB>
void expect_add_into(DType dtype, BLayout layout) {
  const Problem p = make_problem(257, 1030, 777, dtype, layout, 11);
  Output c2(p);
  StreamGuard st;
  const std::vector<uint16_t> init = fill_random(p, c2, 3);  // C2 += A * B on top of these
  GemmConfig cfg;
  cfg.bm = Shape::BM, cfg.bn = Shape::BN, cfg.stages = Shape::kStages;
  launch_gemm<Shape, T, kMajorB, GroupedOrder, AlwaysReady, AddTo>(p.args(nullptr), cfg, {}, {}, {c2.c(), p.ldc}, st.s);
  TF_CUDA(cudaStreamSynchronize(st.s));
  expect_matches(p, c2.read(), std::string("add into C2 ") + dtype_name(dtype) + " " + layout_name(layout), &init);
}

TEST(GemmHooks, AddIntoABuffer) {
  TF_REQUIRE_GPUS(1);
  expect_add_into<Big, __nv_bfloat16, Major::K>(DType::bf16, BLayout::nk);
  expect_add_into<TileShape<64, 64, 13>, __half, Major::MN>(DType::fp16, BLayout::kn);
}

// fp32 C (row stride ld, NaN-poisoned before) against the reference: every element of every row
// written, nothing past N, the reference rows within fp32 accumulation noise.
void expect_fp32_matches(const Problem& p, const std::vector<float>& got, int64_t ld, const std::string& what) {
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j)
      ASSERT_FALSE(std::isnan(got[i * ld + j])) << what << ": C[" << i << ", " << j << "] not written";
    for (int64_t j = p.n; j < ld; ++j) ASSERT_TRUE(std::isnan(got[i * ld + j])) << what << ": padding written";
  }
  int64_t bad = 0;
  for (size_t r = 0; r < p.rows.size(); ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      const double want = p.ref[r * p.n + j], x = got[p.rows[r] * ld + j];
      if (!(std::fabs(x - want) <= 1e-4 * std::sqrt(double(p.k))) && bad++ < 5)
        ADD_FAILURE() << what << ": C[" << p.rows[r] << ", " << j << "] = " << x << ", want " << want;
    }
  EXPECT_EQ(bad, 0) << what;
}

// An fp32 epilogue (policies.cuh: kFloatOut, what ksplit's bands use) under every compiled tile
// it runs with (no swap-AB, no K clusters), N past every tile width and not a multiple of 4 (the
// last put4 of a row is short): every element once against the reference, nothing past N written,
// and band_done called exactly once per 64-row band inside M, after its puts.
struct StoreF32 {
  static constexpr bool kFloatOut = true;
  struct Params {
    float* c = nullptr;
    int64_t ldc = 0;
    unsigned* done = nullptr;  // per (64-row band, BN-column block)
    int bn = 0, blocks_n = 0;
  };
  static void check(const Params& p, int64_t, int64_t n, int) {
    TF_REQUIRE(p.c != nullptr && p.ldc >= n && p.ldc % 4 == 0, Status::InvalidArgument, "StoreF32: ldc " << p.ldc);
  }
#ifdef __CUDACC__
  __device__ static uint64_t band_begin(const Params&) { return 0; }
  __device__ static void put4(const Params& p, uint64_t, int64_t row, int64_t col, float4 v, int count) {
    float* dst = p.c + row * p.ldc + col;
    if (count == 4) {
      *reinterpret_cast<float4*>(dst) = v;
    } else {
      dst[0] = v.x;
      if (count > 1) dst[1] = v.y;
      if (count > 2) dst[2] = v.z;
    }
  }
  __device__ static void band_done(const Params& p, uint64_t, int64_t row0, int64_t col0) {
    atomicAdd(p.done + (row0 / 64) * p.blocks_n + col0 / p.bn, 1u);
  }
#endif
};

TEST(GemmHooks, Fp32EpilogueUnderEveryTile) {
  TF_REQUIRE_GPUS(1);
  for (BLayout layout : {BLayout::nk, BLayout::kn}) {
    const Problem p = make_problem(200, 1003, 777, DType::bf16, layout, 77 + int(layout));
    const int64_t ldc = 1012;  // 9 floats of padding per row
    DevBuf c(size_t(p.m * ldc) * 4);
    StreamGuard st;
    for (GemmConfig cfg : compiled_configs()) {
      if (cfg.swap_ab || cfg.cluster_k > 1 || (layout == BLayout::kn && cfg.bn % 64 != 0)) continue;
      const std::string what = "fp32 epilogue " + std::string(layout_name(layout)) + " " + cfg.name();
      const int bands = int((p.m + 63) / 64), blocks_n = int((p.n + cfg.bn - 1) / cfg.bn);
      if (cfg.bn % 32 != 0) {  // not compiled for these tiles: refused before anything is enqueued
        StoreF32::Params epi{static_cast<float*>(c.p), ldc, nullptr, cfg.bn, blocks_n};
        try {
          launch_gemm<GroupedOrder, AlwaysReady, StoreF32>(p.args(nullptr), cfg, {}, {}, epi, st.s);
          ADD_FAILURE() << what << ": launched";
        } catch (const Error& e) {
          EXPECT_EQ(e.status(), Status::NotSupported) << what << ": " << e.what();
        }
        continue;
      }
      DevBuf done(size_t(bands) * blocks_n * 4);
      TF_CUDA(cudaMemsetAsync(done.p, 0, size_t(bands) * blocks_n * 4, st.s));
      TF_CUDA(cudaMemsetAsync(c.p, 0xFF, size_t(p.m * ldc) * 4, st.s));  // NaN
      StoreF32::Params epi{static_cast<float*>(c.p), ldc, static_cast<unsigned*>(done.p), cfg.bn, blocks_n};
      launch_gemm<GroupedOrder, AlwaysReady, StoreF32>(p.args(nullptr), cfg, {}, {}, epi, st.s);
      std::vector<float> got(size_t(p.m * ldc));
      std::vector<unsigned> calls(size_t(bands) * blocks_n);
      TF_CUDA(cudaMemcpyAsync(got.data(), c.p, got.size() * 4, cudaMemcpyDeviceToHost, st.s));
      TF_CUDA(cudaMemcpyAsync(calls.data(), done.p, calls.size() * 4, cudaMemcpyDeviceToHost, st.s));
      TF_CUDA(cudaStreamSynchronize(st.s));
      for (size_t b = 0; b < calls.size(); ++b) EXPECT_EQ(calls[b], 1u) << what << ": band_done calls of band " << b;
      expect_fp32_matches(p, got, ldc, what);
    }
  }
}

// cuBLASLt's fp32 outputs: a product over K in three calls (fp32, then fp32_accumulate twice; the
// slices start at multiples of 8, the operands' alignment rule, but not of 64, and the last is
// odd) equals the whole product in fp32, and nothing beyond each row's N columns is written. Two
// shapes: one cuBLASLt tiles, and a skinny one with long slices (M = 3) where it splits K.
TEST(CublasLt, Fp32SumsOverKSlicesEqualTheProduct) {
  TF_REQUIRE_GPUS(1);
  struct Case {
    ShapeCase shape;
    int64_t cuts[4];
  };
  const Case cases[] = {{{127, 1003, 1001}, {0, 336, 664, 1001}}, {{3, 1003, 8200}, {0, 4104, 6152, 8200}}};
  for (const Case& cs : cases)
    for (BLayout layout : {BLayout::nk, BLayout::kn})
      for (DType dtype : {DType::bf16, DType::fp16}) {
        const Problem p = make_problem(cs.shape.m, cs.shape.n, cs.shape.k, dtype, layout,
                                       4242 + int(layout) * 3 + int(dtype) + cs.shape.m);
        const int64_t ldp = (p.n + 7) / 8 * 8 + 8;
        const std::string what = "fp32 sums " + label(cs.shape, dtype, layout);
        DevBuf c(size_t(p.m * ldp) * 4);
        StreamGuard st;
        TF_CUDA(cudaMemsetAsync(c.p, 0xFF, size_t(p.m * ldp) * 4, st.s));  // NaN
        for (int i = 0; i < 3; ++i) {
          GemmArgs g = p.args(c.p);
          g.ldc = ldp;
          g.k = cs.cuts[i + 1] - cs.cuts[i];
          g.a = static_cast<const uint16_t*>(p.da->p) + cs.cuts[i];
          g.b = static_cast<const uint16_t*>(p.db->p) + (layout == BLayout::nk ? cs.cuts[i] : cs.cuts[i] * p.ldb);
          cublaslt_launch(g, st.s, i == 0 ? OutType::fp32 : OutType::fp32_accumulate);
        }
        std::vector<float> got(size_t(p.m * ldp));
        TF_CUDA(cudaMemcpyAsync(got.data(), c.p, got.size() * 4, cudaMemcpyDeviceToHost, st.s));
        TF_CUDA(cudaStreamSynchronize(st.s));
        expect_fp32_matches(p, got, ldp, what);
      }
}

// Holds an SM each (1024 threads and the whole shared memory) until *release or 5 s, whichever is
// first; counts its resident CTAs in *resident.
__global__ void hold_sms_kernel(const volatile int* release, int* resident) {
  extern __shared__ char smem[];
  if (threadIdx.x == 0) {
    smem[0] = 1;
    atomicAdd(resident, 1);
    for (const uint64_t end = dev::global_timer_ns() + 5'000'000'000ull; *release == 0 && dev::global_timer_ns() < end;)
      __nanosleep(1000);
  }
  __syncthreads();
}

// Clusters::small beside a grid that holds all but 32 SMs and waits, as the ranks simulated on one
// GPU do (tests/gpu/simulated_ranks.h): the GEMM runs while the SMs are held and matches the
// reference. r279: the heuristic's 8-CTA clusters, and a kernel launched after them, stalled with 90
// of 132 SMs held. An nsplit-sized product into fp32, and a large one into 16-bit C.
TEST(CublasLt, SmallClustersRunBesideAGridHoldingMostSms) {
  TF_REQUIRE_GPUS(1);
  constexpr int kSmem = 227 << 10;
  TF_CUDA(cudaFuncSetAttribute(hold_sms_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  int* host = nullptr;  // [0]: release, [1]: resident CTAs
  TF_CUDA(cudaHostAlloc(&host, 2 * sizeof(int), cudaHostAllocMapped));
  int* flags = nullptr;
  TF_CUDA(cudaHostGetDevicePointer(&flags, host, 0));
  const int held = device_sm_count() - 32;
  if (held < 32) GTEST_SKIP() << device_sm_count() << " SMs: too few to hold most of them and leave 32";
  // Enqueues the GEMM on `s` while `held` SMs are held and expects it to finish within 2 s.
  auto runs_beside_held = [&](const GemmArgs& g, OutType out, cudaStream_t s, const std::string& what) {
    StreamGuard holder;
    cublaslt_prepare(g, s, out, Clusters::small);  // the plan and the workspace, before the SMs are held
    TF_CUDA(cudaStreamSynchronize(s));
    __atomic_store_n(&host[0], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&host[1], 0, __ATOMIC_RELEASE);
    hold_sms_kernel<<<held, 1024, kSmem, holder.s>>>(flags, flags + 1);
    TF_CUDA(cudaGetLastError());
    for (int i = 0; i < 2000 && __atomic_load_n(&host[1], __ATOMIC_ACQUIRE) < held; ++i) usleep(1000);
    EXPECT_EQ(__atomic_load_n(&host[1], __ATOMIC_ACQUIRE), held) << what << ": the holding grid is not all resident";
    cublaslt_launch(g, s, out, Clusters::small);
    bool done = false;
    for (int i = 0; i < 2000 && !done; ++i) {
      done = cudaStreamQuery(s) == cudaSuccess;
      if (!done) usleep(1000);
    }
    __atomic_store_n(&host[0], 1, __ATOMIC_RELEASE);
    TF_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(done) << what << ": the GEMM did not finish within 2 s";
  };
  const std::string beside = " beside " + std::to_string(held) + " held SMs";
  {
    const Problem p = make_problem(38, 72, 32, DType::bf16, BLayout::kn, 5150);
    const int64_t ldc = 72;
    DevBuf c(size_t(p.m * ldc) * 4);
    StreamGuard st;
    TF_CUDA(cudaMemsetAsync(c.p, 0xFF, size_t(p.m * ldc) * 4, st.s));
    GemmArgs g = p.args(c.p);
    g.ldc = ldc;
    const std::string what = label({p.m, p.n, p.k}, p.dtype, p.layout) + " fp32 C" + beside;
    runs_beside_held(g, OutType::fp32, st.s, what);
    std::vector<float> got(size_t(p.m * ldc));
    TF_CUDA(cudaMemcpy(got.data(), c.p, got.size() * 4, cudaMemcpyDeviceToHost));
    expect_fp32_matches(p, got, ldc, what);
  }
  {
    const Problem p = make_problem(1000, 3592, 1001, DType::bf16, BLayout::kn, 5151);
    Output out(p);
    StreamGuard st;
    out.poison(st.s);
    const std::string what = label({p.m, p.n, p.k}, p.dtype, p.layout) + beside;
    runs_beside_held(p.args(out.c()), OutType::same, st.s, what);
    expect_matches(p, out.read(), what);
  }
  TF_CUDA(cudaFreeHost(host));
}

}  // namespace
}  // namespace taxfree::gemm
