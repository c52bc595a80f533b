// GPU tests of the GEMM engine: every compiled kernel against a double-precision host reference
// on fresh random inputs, odd shapes, both B layouts, bf16 and fp16, guard bands and padding around
// C, repeated launches, and every hook (rotated tile order, A-ready flags set by another kernel,
// store into a second buffer, add into a buffer).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_env.h"
#include "taxfree/device/signal.cuh"
#include "taxfree/ops/cublaslt_gemm.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_launch.cuh"

namespace taxfree::gemm {
namespace {

using device::Major;

constexpr int64_t kGuard = 256;           // elements of guard band before and after C
constexpr uint16_t kPoison = 0xFFFF;      // NaN in bf16 and fp16

float to_float(uint16_t bits, DType t) {
  if (t == DType::bf16) {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}
uint16_t from_float(float f, DType t) {
  if (t == DType::bf16) {
    __nv_bfloat16_raw r = __nv_bfloat16_raw(__float2bfloat16(f));
    return r.x;
  }
  __half_raw r = __half_raw(__float2half(f));
  return r.x;
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { TF_CUDA(cudaMalloc(&p, bytes)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// A problem with fresh random inputs (uniform in [-1, 1)), padded row strides, on host and device.
struct Problem {
  int64_t m, n, k, lda, ldb, ldc;
  DType dtype;
  BLayout layout;
  std::vector<uint16_t> a, b;  // as stored, padding included
  std::vector<int64_t> rows;   // rows the reference covers
  std::vector<double> ref;     // rows.size() x n
  std::unique_ptr<DevBuf> da, db;

  int64_t b_rows() const { return layout == BLayout::NK ? n : k; }
  float a_at(int64_t i, int64_t kk) const { return to_float(a[i * lda + kk], dtype); }
  float b_at(int64_t kk, int64_t j) const {
    return to_float(layout == BLayout::NK ? b[j * ldb + kk] : b[kk * ldb + j], dtype);
  }
  GemmArgs args(void* c) const {
    GemmArgs g;
    g.a = da->p, g.lda = lda, g.b = db->p, g.ldb = ldb, g.c = c, g.ldc = ldc;
    g.m = m, g.n = n, g.k = k, g.dtype = dtype, g.b_layout = layout;
    return g;
  }
};

Problem make_problem(int64_t m, int64_t n, int64_t k, DType dtype, BLayout layout, uint64_t seed) {
  Problem p{m, n, k, (k + 7) / 8 * 8 + 8, 0, (n + 7) / 8 * 8 + 16, dtype, layout, {}, {}, {}, {}, {}, {}};
  p.ldb = layout == BLayout::NK ? (k + 7) / 8 * 8 + 24 : (n + 7) / 8 * 8 + 8;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  p.a.assign(size_t(m * p.lda), kPoison);  // padding stays NaN: reading it would poison C
  p.b.assign(size_t(p.b_rows() * p.ldb), kPoison);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t kk = 0; kk < k; ++kk) p.a[i * p.lda + kk] = from_float(u(rng), dtype);
  const int64_t b_cols = layout == BLayout::NK ? k : n;
  for (int64_t r = 0; r < p.b_rows(); ++r)
    for (int64_t c = 0; c < b_cols; ++c) p.b[r * p.ldb + c] = from_float(u(rng), dtype);

  // Reference rows: all for small M, else the edges of every 64-row band and a few random ones.
  for (int64_t i = 0; i < m; ++i)
    if (m <= 96 || i % 64 == 0 || i % 64 == 63 || i == m - 1 || rng() % 97 == 0) p.rows.push_back(i);
  std::vector<float> bt(static_cast<size_t>(n * k));  // B as [N, K] floats for a contiguous inner loop
  for (int64_t j = 0; j < n; ++j)
    for (int64_t kk = 0; kk < k; ++kk) bt[j * k + kk] = p.b_at(kk, j);
  std::vector<float> arow(static_cast<size_t>(k));
  p.ref.resize(p.rows.size() * size_t(n));
  for (size_t r = 0; r < p.rows.size(); ++r) {
    for (int64_t kk = 0; kk < k; ++kk) arow[kk] = p.a_at(p.rows[r], kk);
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      const float* bj = &bt[j * k];
      for (int64_t kk = 0; kk < k; ++kk) s += double(arow[kk]) * double(bj[kk]);
      p.ref[r * n + j] = s;
    }
  }
  p.da = std::make_unique<DevBuf>(p.a.size() * 2);
  p.db = std::make_unique<DevBuf>(p.b.size() * 2);
  TF_CUDA(cudaMemcpy(p.da->p, p.a.data(), p.a.size() * 2, cudaMemcpyHostToDevice));
  TF_CUDA(cudaMemcpy(p.db->p, p.b.data(), p.b.size() * 2, cudaMemcpyHostToDevice));
  return p;
}

// C with guard bands: [kGuard | M x ldc | kGuard] elements, all NaN before each run.
struct Output {
  int64_t elems;
  DevBuf buf;
  explicit Output(const Problem& p) : elems(p.m * p.ldc + 2 * kGuard), buf(size_t(elems) * 2) {}
  void* c() const { return static_cast<uint16_t*>(buf.p) + kGuard; }
  void poison(cudaStream_t s) { TF_CUDA(cudaMemsetAsync(buf.p, 0xFF, size_t(elems) * 2, s)); }
  std::vector<uint16_t> read() const {
    std::vector<uint16_t> h(static_cast<size_t>(elems));
    TF_CUDA(cudaMemcpy(h.data(), buf.p, h.size() * 2, cudaMemcpyDeviceToHost));
    return h;
  }
};

// Bounds for outputs rounded to 16 bits (unit roundoff u = 2^-8 bf16, 2^-11 fp16): elementwise
// |got - ref| <= 2u |ref| + slack, and relative Frobenius error <= 1.5 u (rounding alone gives
// about u / sqrt(3)). `base` is added to the reference (AddTo) and its size to the slack.
void expect_matches(const Problem& p, const std::vector<uint16_t>& out, const std::string& what,
                    const std::vector<uint16_t>* base = nullptr) {
  const double u = p.dtype == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
  const double slack = 1e-3 * std::sqrt(double(p.k) / 9.0);  // fp32 accumulation-order noise, generous
  for (int64_t g = 0; g < kGuard; ++g) {
    ASSERT_EQ(out[g], kPoison) << what << ": guard band before C written at " << g - kGuard;
    ASSERT_EQ(out[kGuard + p.m * p.ldc + g], kPoison) << what << ": guard band after C written at +" << g;
  }
  for (int64_t i = 0; i < p.m; ++i) {
    const uint16_t* row = &out[kGuard + i * p.ldc];
    for (int64_t j = 0; j < p.n; ++j)
      ASSERT_TRUE(std::isfinite(to_float(row[j], p.dtype))) << what << ": C[" << i << ", " << j << "] not written";
    for (int64_t j = p.n; j < p.ldc; ++j)
      ASSERT_EQ(row[j], kPoison) << what << ": padding C[" << i << ", " << j << "] (N=" << p.n << ") written";
  }
  double err2 = 0, ref2 = 0;
  int64_t bad = 0;
  for (size_t r = 0; r < p.rows.size(); ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      const int64_t o = kGuard + p.rows[r] * p.ldc + j;
      const double old = base ? to_float((*base)[o], p.dtype) : 0.0;
      const double want = old + p.ref[r * p.n + j], got = to_float(out[o], p.dtype);
      const double tol = 2 * u * (std::fabs(p.ref[r * p.n + j]) + std::fabs(old)) + slack;
      if (std::fabs(got - want) > tol && bad++ < 5)
        ADD_FAILURE() << what << ": C[" << p.rows[r] << ", " << j << "] = " << got << ", want " << want;
      err2 += (got - want) * (got - want);
      ref2 += want * want;
    }
  EXPECT_EQ(bad, 0) << what << ": elements outside tolerance";
  EXPECT_LE(std::sqrt(err2 / ref2), 1.5 * u) << what << ": relative Frobenius error";
}

struct StreamGuard {
  cudaStream_t s = nullptr;
  StreamGuard() { TF_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~StreamGuard() { cudaStreamDestroy(s); }
};

struct ShapeCase {
  int64_t m, n, k;
};
std::string label(const ShapeCase& s, DType t, BLayout l) {
  return "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) + " " +
         dtype_name(t) + " " + layout_name(l);
}

// Odd sizes (M = 1, 127, 1000; N = 3592 and N not a multiple of 8; K = 8200 and odd K), plus a
// problem with several tiles per CTA so the pipeline's phases wrap across tiles.
const ShapeCase kShapes[] = {{1, 3592, 8200}, {127, 3590, 1001}, {1000, 3592, 8200}, {4096, 4096, 512}};

class GemmAllConfigs : public ::testing::TestWithParam<std::tuple<int, DType, BLayout>> {};

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
    if (layout == BLayout::KN && cfg.bn % 64 != 0) continue;
    cfg.group_m = 3;  // groups that do not divide the m-blocks
    const std::string what = label(s, dtype, layout) + " " + cfg.name();
    out.poison(st.s);
    for (int rep = 0; rep < 2; ++rep) launch(p.args(out.c()), cfg, st.s);  // repeated launches, same result
    TF_CUDA(cudaStreamSynchronize(st.s));
    expect_matches(p, out.read(), what);
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
                                            ::testing::Values(BLayout::NK, BLayout::KN)),
                         [](const auto& info) {
                           const ShapeCase s = kShapes[std::get<0>(info.param)];
                           return "M" + std::to_string(s.m) + "_N" + std::to_string(s.n) + "_K" + std::to_string(s.k) +
                                  "_" + dtype_name(std::get<1>(info.param)) + "_" +
                                  layout_name(std::get<2>(info.param));
                         });

using Big = TileShape<128, 256, 4>;
GemmConfig big_config() {
  GemmConfig cfg;
  cfg.bm = Big::BM, cfg.bn = Big::BN, cfg.stages = Big::kStages;
  return cfg;
}

TEST(GemmHooks, RotatedTileOrderForEveryRank) {
  TF_REQUIRE_GPUS(1);
  const Problem p = make_problem(1000, 2056, 704, DType::bf16, BLayout::NK, 77);
  Output out(p);
  StreamGuard st;
  for (int world : {2, 3, 8})
    for (int rank = 0; rank < world; ++rank) {
      const RotatedOrder::Params order{rank_first_m_block(p.m, Big::BM, rank, world)};
      out.poison(st.s);
      launch_gemm<Big, __nv_bfloat16, Major::K, RotatedOrder, AlwaysReady, StoreTo>(
          p.args(nullptr), big_config(), order, {}, {out.c(), p.ldc}, st.s);
      TF_CUDA(cudaStreamSynchronize(st.s));
      expect_matches(p, out.read(), "rotated order world " + std::to_string(world) + " rank " + std::to_string(rank));
    }
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

TEST(GemmHooks, AReadyWaitsForFlagsSetByAnotherKernel) {
  TF_REQUIRE_GPUS(1);
  const Problem p = make_problem(1000, 1536, 1024, DType::bf16, BLayout::NK, 99);
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
    GemmConfig cfg = big_config();
    cfg.max_ctas = device_sm_count() - 8;  // a GEMM CTA fills its SM: leave some for the writer
    launch_gemm<Big, __nv_bfloat16, Major::K, GroupedOrder, FlagWait, StoreTo>(
        args, cfg, {}, {static_cast<const uint64_t*>(flags.p), epoch, fault}, {out.c(), p.ldc}, gemm_stream.s);
    publish_a<<<1, 256, 0, writer_stream.s>>>(static_cast<const uint16_t*>(p.da->p), static_cast<uint16_t*>(a.p), p.m,
                                               p.lda, Big::BM, static_cast<uint64_t*>(flags.p), epoch, 300'000);
    TF_CUDA(cudaGetLastError());
    TF_CUDA(cudaDeviceSynchronize());
    ASSERT_EQ(record->complete, 0u) << "an A-ready wait gave up: m-block " << record->flag_offset << " observed "
                                    << record->observed << " expected " << record->expected;
    ASSERT_EQ(*abort, 0u);
    expect_matches(p, out.read(), "A-ready flags, epoch " + std::to_string(epoch));
  }
  cudaFreeHost(record);
  cudaFreeHost(abort);
}

// --- Epilogue destinations -------------------------------------------------------------------------

TEST(GemmHooks, StoreIntoASecondBuffer) {
  TF_REQUIRE_GPUS(1);
  const Problem p = make_problem(300, 1000, 520, DType::fp16, BLayout::KN, 5);
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
  // C2 starts as random values (guards and padding stay NaN), then C2 += A * B.
  std::vector<uint16_t> init(static_cast<size_t>(c2.elems), kPoison);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) init[kGuard + i * p.ldc + j] = from_float(u(rng), dtype);
  TF_CUDA(cudaMemcpy(c2.buf.p, init.data(), init.size() * 2, cudaMemcpyHostToDevice));
  GemmConfig cfg;
  cfg.bm = Shape::BM, cfg.bn = Shape::BN, cfg.stages = Shape::kStages;
  launch_gemm<Shape, T, kMajorB, GroupedOrder, AlwaysReady, AddTo>(p.args(nullptr), cfg, {}, {}, {c2.c(), p.ldc}, st.s);
  TF_CUDA(cudaStreamSynchronize(st.s));
  expect_matches(p, c2.read(), std::string("add into C2 ") + dtype_name(dtype) + " " + layout_name(layout), &init);
}

TEST(GemmHooks, AddIntoABuffer) {
  TF_REQUIRE_GPUS(1);
  expect_add_into<Big, __nv_bfloat16, Major::K>(DType::bf16, BLayout::NK);
  expect_add_into<TileShape<64, 64, 13>, __half, Major::MN>(DType::fp16, BLayout::KN);
}

}  // namespace
}  // namespace taxfree::gemm
