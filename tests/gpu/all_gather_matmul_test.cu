// all_gather_matmul on real GPUs: every variant against a float64 host reference on fresh random
// inputs (odd M, K and N not multiples of any tile, M divisible by the ranks), the gathered A bit
// for bit against the expected shards and identical on every rank, both gather dims, both B
// layouts, bf16 and fp16, in place, tiny pieces, rank skew, 1000 launches without a host-side
// reset, CUDA-graph capture and replay, and validation before launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_env.h"
#include "gemm_test_util.h"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/runtime/coordinator.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree {
namespace {

using gemm::BLayout;
using gemm::DType;
using test::team;

using gemm::test::from_float;
using gemm::test::kGuard;
using gemm::test::kPoison;
using gemm::test::to_float;
int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { TF_CUDA(cudaMalloc(&p, bytes)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

struct Shape {
  int64_t m, n, k;
  int gather_dim;
  DType dtype;
  BLayout layout;
};

std::string label(const Shape& s) {
  return "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) + " gd" +
         std::to_string(s.gather_dim) + " " + gemm::dtype_name(s.dtype) + " " + gemm::layout_name(s.layout);
}

// The odd shapes every variant runs: M not a multiple of any tile but divisible by the ranks (gd0),
// K = 1001 (gd0) or a multiple of 8 but not of 64 per rank (gd1), N = 1000.
Shape odd_shape(int gather_dim, DType t, BLayout l) {
  const int64_t w = team().world();
  return gather_dim == 0 ? Shape{w * 500, 1000, 1001, 0, t, l} : Shape{999, 1000, w * 504, 1, t, l};
}

// Inputs of every rank, regenerable on every rank: shard s from seed (seed, s), B of rank r from
// (seed, 500 + r); uniform in [-1, 1), rounded to the element type. Strides padded, padding NaN.
class Problem {
 public:
  Problem(const Shape& s, uint64_t seed) : s_(s), seed_(seed) {
    const int w = team().world();
    sh_ = agmm_shard_shape(s.m, s.k, s.gather_dim, w);
    lda_ = round8(sh_.cols) + 8;
    ldb_ = (s.layout == BLayout::NK ? round8(s.k) : round8(s.n)) + 8;
    ldc_ = round8(s.n) + 16;
    for (int r = 0; r < w; ++r) shards_.push_back(random_matrix(sh_.rows, sh_.cols, lda_, 1000 * seed + uint64_t(r)));
    const int64_t b_rows = s.layout == BLayout::NK ? s.n : s.k, b_cols = s.layout == BLayout::NK ? s.k : s.n;
    b_ = random_matrix(b_rows, b_cols, ldb_, 1000 * seed + 500 + uint64_t(team().rank()));
    a_dev_ = std::make_unique<DevBuf>(shards_[0].size() * 2);
    b_dev_ = std::make_unique<DevBuf>(b_.size() * 2);
    c_elems_ = s.m * ldc_ + 2 * kGuard;
    c_dev_ = std::make_unique<DevBuf>(size_t(c_elems_) * 2);
    upload();
    reference();
  }

  // New values for every input (fresh random), same shape and buffers.
  void refresh(uint64_t seed) {
    const int w = team().world();
    seed_ = seed;
    for (int r = 0; r < w; ++r) shards_[size_t(r)] = random_matrix(sh_.rows, sh_.cols, lda_, 1000 * seed + uint64_t(r));
    const int64_t b_rows = s_.layout == BLayout::NK ? s_.n : s_.k, b_cols = s_.layout == BLayout::NK ? s_.k : s_.n;
    b_ = random_matrix(b_rows, b_cols, ldb_, 1000 * seed + 500 + uint64_t(team().rank()));
    upload();
    reference();
  }

  AgmmArgs args() const {
    AgmmArgs a;
    a.a_shard = a_dev_->p, a.lda_shard = lda_;
    a.b = b_dev_->p, a.ldb = ldb_;
    a.c = static_cast<uint16_t*>(c_dev_->p) + kGuard, a.ldc = ldc_;
    a.m = s_.m, a.n = s_.n, a.k = s_.k, a.gather_dim = s_.gather_dim, a.dtype = s_.dtype, a.b_layout = s_.layout;
    return a;
  }
  // The same arguments with this rank's shard copied into the op's own slot (in place).
  AgmmArgs in_place_args(const AllGatherMatmul& op, cudaStream_t st) const {
    AgmmArgs a = args();
    const GatheredA slot = op.local_slot(s_.m, s_.k, s_.gather_dim);
    TF_CUDA(cudaMemcpy2DAsync(const_cast<void*>(slot.ptr), size_t(slot.ld * 2), a_dev_->p, size_t(lda_ * 2),
                              size_t(sh_.cols * 2), size_t(sh_.rows), cudaMemcpyDeviceToDevice, st));
    a.a_shard = slot.ptr, a.lda_shard = slot.ld;
    return a;
  }

  void poison_c(cudaStream_t st) { TF_CUDA(cudaMemsetAsync(c_dev_->p, 0xFF, size_t(c_elems_) * 2, st)); }

  // C against the reference and the gathered A bit for bit; `what` names the run in failures.
  void expect_result(const GatheredA& g, const std::string& what) {
    expect_c(what);
    expect_gathered(g, what);
  }

  const Shape& shape() const { return s_; }

 private:
  std::vector<uint16_t> random_matrix(int64_t rows, int64_t cols, int64_t ld, uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> m(static_cast<size_t>(rows * ld), kPoison);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) m[size_t(r * ld + c)] = from_float(u(rng), s_.dtype);
    return m;
  }
  void upload() {
    const int rank = team().rank();
    TF_CUDA(cudaMemcpy(a_dev_->p, shards_[size_t(rank)].data(), shards_[size_t(rank)].size() * 2, cudaMemcpyHostToDevice));
    TF_CUDA(cudaMemcpy(b_dev_->p, b_.data(), b_.size() * 2, cudaMemcpyHostToDevice));
  }
  // Expected gathered A, element (r, c).
  uint16_t a_bits(int64_t r, int64_t c) const {
    if (s_.gather_dim == 0) return shards_[size_t(r / sh_.rows)][size_t((r % sh_.rows) * lda_ + c)];
    return shards_[size_t(c / sh_.cols)][size_t(r * lda_ + c % sh_.cols)];
  }
  float b_at(int64_t kk, int64_t j) const {
    return to_float(s_.layout == BLayout::NK ? b_[size_t(j * ldb_ + kk)] : b_[size_t(kk * ldb_ + j)], s_.dtype);
  }
  // float64 reference of a sample of rows: band edges of 64 rows, shard boundaries, random ones.
  void reference() {
    rows_.clear();
    std::mt19937 rng(static_cast<uint32_t>(seed_));
    for (int64_t i = 0; i < s_.m; ++i)
      if (s_.m <= 64 || i % 64 == 0 || i % 64 == 63 || i == s_.m - 1 || (s_.gather_dim == 0 && (i + 1) % sh_.rows <= 1) ||
          rng() % 97 == 0)
        rows_.push_back(i);
    std::vector<double> bt(static_cast<size_t>(s_.n * s_.k));
    for (int64_t j = 0; j < s_.n; ++j)
      for (int64_t kk = 0; kk < s_.k; ++kk) bt[size_t(j * s_.k + kk)] = b_at(kk, j);
    std::vector<double> arow(static_cast<size_t>(s_.k));
    ref_.assign(rows_.size() * size_t(s_.n), 0.0);
    for (size_t r = 0; r < rows_.size(); ++r) {
      for (int64_t kk = 0; kk < s_.k; ++kk) arow[size_t(kk)] = to_float(a_bits(rows_[r], kk), s_.dtype);
      for (int64_t j = 0; j < s_.n; ++j) {
        double acc = 0;
        const double* bj = &bt[size_t(j * s_.k)];
        for (int64_t kk = 0; kk < s_.k; ++kk) acc += arow[size_t(kk)] * bj[kk];
        ref_[r * size_t(s_.n) + size_t(j)] = acc;
      }
    }
  }
  // Bounds as the GEMM tests: |got - ref| <= 2u|ref| + slack, relative Frobenius error <= 1.5u.
  void expect_c(const std::string& what) {
    std::vector<uint16_t> out(static_cast<size_t>(c_elems_));
    TF_CUDA(cudaMemcpy(out.data(), c_dev_->p, out.size() * 2, cudaMemcpyDeviceToHost));
    for (int64_t g = 0; g < kGuard; ++g) {
      ASSERT_EQ(out[size_t(g)], kPoison) << what << ": guard band before C written";
      ASSERT_EQ(out[size_t(kGuard + s_.m * ldc_ + g)], kPoison) << what << ": guard band after C written";
    }
    for (int64_t i = 0; i < s_.m; ++i) {
      for (int64_t j = 0; j < s_.n; ++j)
        ASSERT_TRUE(std::isfinite(to_float(out[size_t(kGuard + i * ldc_ + j)], s_.dtype)))
            << what << ": C[" << i << ", " << j << "] not written";
      for (int64_t j = s_.n; j < ldc_; ++j)
        ASSERT_EQ(out[size_t(kGuard + i * ldc_ + j)], kPoison) << what << ": padding of C row " << i << " written";
    }
    const double u = s_.dtype == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
    const double slack = 1e-3 * std::sqrt(double(s_.k) / 9.0);
    double err2 = 0, ref2 = 0;
    int64_t bad = 0;
    for (size_t r = 0; r < rows_.size(); ++r)
      for (int64_t j = 0; j < s_.n; ++j) {
        const double want = ref_[r * size_t(s_.n) + size_t(j)];
        const double got = to_float(out[size_t(kGuard + rows_[r] * ldc_ + j)], s_.dtype);
        if (std::fabs(got - want) > 2 * u * std::fabs(want) + slack && bad++ < 5)
          ADD_FAILURE() << what << ": C[" << rows_[r] << ", " << j << "] = " << got << ", want " << want;
        err2 += (got - want) * (got - want);
        ref2 += want * want;
      }
    EXPECT_EQ(bad, 0) << what << ": elements outside tolerance";
    EXPECT_LE(std::sqrt(err2 / ref2), 1.5 * u) << what << ": relative Frobenius error";
  }
  void expect_gathered(const GatheredA& g, const std::string& what) {
    ASSERT_NE(g.ptr, nullptr) << what;
    std::vector<uint16_t> got(static_cast<size_t>(s_.m * s_.k));
    TF_CUDA(cudaMemcpy2D(got.data(), size_t(s_.k * 2), g.ptr, size_t(g.ld * 2), size_t(s_.k * 2), size_t(s_.m),
                         cudaMemcpyDeviceToHost));
    int64_t wrong = 0;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a of the bits, compared across ranks
    for (int64_t r = 0; r < s_.m; ++r)
      for (int64_t c = 0; c < s_.k; ++c) {
        const uint16_t v = got[size_t(r * s_.k + c)];
        if (v != a_bits(r, c) && wrong++ < 3)
          ADD_FAILURE() << what << ": gathered A[" << r << ", " << c << "] = 0x" << std::hex << v << ", want 0x"
                        << a_bits(r, c) << std::dec;
        hash = (hash ^ v) * 1099511628211ull;
      }
    EXPECT_EQ(wrong, 0) << what << ": gathered A elements differ from the shards";
    static int round = 0;
    const auto all = team().coordinator().all_gather("agmm.hash." + std::to_string(round++), std::to_string(hash), 60);
    for (size_t r = 1; r < all.size(); ++r) EXPECT_EQ(all[r], all[0]) << what << ": gathered A differs on rank " << r;
  }

  Shape s_;
  uint64_t seed_;
  ShardShape sh_{};
  int64_t lda_ = 0, ldb_ = 0, ldc_ = 0, c_elems_ = 0;
  std::vector<std::vector<uint16_t>> shards_;
  std::vector<uint16_t> b_;
  std::unique_ptr<DevBuf> a_dev_, b_dev_, c_dev_;
  std::vector<int64_t> rows_;
  std::vector<double> ref_;
};

// Both NCCL flavours of the op, small capacity, heap returned at the end.
struct Ops {
  uint64_t mark;
  std::unique_ptr<AllGatherMatmul> plain, sym;
  explicit Ops(AgmmConfig cfg = {}) {
    mark = team().heap().mark();
    const int64_t w = team().world();
    cfg.max_m = std::max<int64_t>(2048, 512 * w), cfg.max_k = std::max<int64_t>(4096, 1024 * w);
    plain = std::make_unique<AllGatherMatmul>(team(), cfg);
    cfg.bsp_symmetric = true;
    sym = std::make_unique<AllGatherMatmul>(team(), cfg);
  }
  ~Ops() {
    plain.reset();
    sym.reset();
    team().heap().release(mark);
  }
};

struct VariantRun {
  const char* name;
  bool sym;
  AgmmVariant variant;
};
const VariantRun kRuns[] = {{"bsp", false, AgmmVariant::bsp},           {"bsp-sym", true, AgmmVariant::bsp},
                     {"bsp-own", false, AgmmVariant::bsp_own},   {"bsp-own-sym", true, AgmmVariant::bsp_own},
                     {"decomposed", false, AgmmVariant::decomposed}, {"push", false, AgmmVariant::push},
                     {"fused-ce", false, AgmmVariant::fused_ce},     {"auto", false, AgmmVariant::automatic}};

// Poison C and every op buffer, align the ranks (peers write into this rank's buffers), launch,
// wait, check, align again (this rank's next poison must not hit a peer's late writes).
GatheredA launch_checked(Ops& ops, Problem& p, const VariantRun& run, const AgmmArgs& args, const std::string& what) {
  auto& t = team();
  auto s = t.stream();
  p.poison_c(s);
  ops.plain->fill_buffers(0xFF, s);
  ops.sym->fill_buffers(0xFF, s);
  t.sync(s);
  t.host_barrier("agmm.poisoned");
  GatheredA g = (run.sym ? ops.sym : ops.plain)->launch(run.variant, args, s);
  t.sync(s);
  p.expect_result(g, what);
  t.host_barrier("agmm.checked");
  return g;
}

class AgmmEveryVariant : public ::testing::TestWithParam<std::tuple<int, DType, BLayout>> {};

TEST_P(AgmmEveryVariant, MatchesReferenceAndGathersIdentically) {
  TF_REQUIRE_GPUS(2);
  const auto [gd, dtype, layout] = GetParam();
  Ops ops;
  Problem p(odd_shape(gd, dtype, layout), 11 + gd * 4 + int(dtype) * 2 + int(layout));
  for (const VariantRun& run : kRuns) launch_checked(ops, p, run, p.args(), label(p.shape()) + " " + run.name);
  // In place: this rank's shard already sits in the op's gathered A (bsp-sym, decomposed, push).
  for (const VariantRun& run : {kRuns[1], kRuns[4], kRuns[5]}) {
    AllGatherMatmul& op = run.sym ? *ops.sym : *ops.plain;
    auto& t = team();
    p.poison_c(t.stream());
    ops.plain->fill_buffers(0xFF, t.stream());
    ops.sym->fill_buffers(0xFF, t.stream());
    const AgmmArgs args = p.in_place_args(op, t.stream());
    t.sync(t.stream());
    t.host_barrier("agmm.poisoned");
    const GatheredA g = op.launch(run.variant, args, t.stream());
    t.sync(t.stream());
    p.expect_result(g, label(p.shape()) + " " + run.name + " in place");
    t.host_barrier("agmm.checked");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AgmmEveryVariant,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Values(DType::bf16, DType::fp16),
                                            ::testing::Values(BLayout::NK, BLayout::KN)),
                         [](const auto& info) {
                           return "gd" + std::to_string(std::get<0>(info.param)) + "_" +
                                  gemm::dtype_name(std::get<1>(info.param)) + "_" +
                                  gemm::layout_name(std::get<2>(info.param));
                         });

// Many pieces (64-column chunks) moved by a single push CTA, and the paper's decode shapes
// (M = 1 and 2, gather_dim 1).
TEST(Agmm, PushWithTinyPiecesOneCtaAndDecodeShapes) {
  TF_REQUIRE_GPUS(2);
  const int64_t w = team().world();
  AgmmConfig cfg;
  cfg.col_chunk = 64;
  cfg.push_ctas = 1;
  Ops ops(cfg);
  const VariantRun push{"push", false, AgmmVariant::push};
  for (const Shape& s : {Shape{w * 200, 520, 1000, 0, DType::bf16, BLayout::NK},
                         Shape{333, 520, w * 264, 1, DType::bf16, BLayout::KN}}) {
    Problem p(s, 77);
    launch_checked(ops, p, push, p.args(), label(s) + " push, 64-column pieces, 1 CTA");
  }
  Ops defaults;
  for (int64_t m : {1, 2, 7}) {
    const Shape s{m, 3584, w * 1024, 1, DType::bf16, BLayout::KN};
    Problem p(s, 78 + uint64_t(m));
    for (const VariantRun& run : kRuns) launch_checked(defaults, p, run, p.args(), label(s) + " " + run.name);
  }
}

TEST(Agmm, RankSkew) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  Ops ops;
  for (int gd : {0, 1}) {
    Problem p(odd_shape(gd, DType::bf16, BLayout::NK), 300 + uint64_t(gd));
    int round = 0;
    for (const VariantRun& run : {kRuns[0], kRuns[4], kRuns[5], kRuns[6]}) {
      auto s = t.stream();
      p.poison_c(s);
      ops.plain->fill_buffers(0xFF, s);
      t.sync(s);
      t.host_barrier("agmm.skew.poisoned");
      // One rank (a different one each round) starts 100 ms late.
      if (t.rank() == round++ % t.world()) usleep(100 * 1000);
      const GatheredA g = ops.plain->launch(run.variant, p.args(), s);
      t.sync(s);
      p.expect_result(g, label(p.shape()) + " " + run.name + " with rank skew");
      t.host_barrier("agmm.skew.checked");
    }
  }
}

// Epochs, not resets: 1000 launches of each fused variant back to back with no host work between,
// then new inputs and one more launch each, all checked.
TEST(Agmm, ThousandLaunchesWithoutReset) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  Ops ops;
  const int64_t w = t.world();
  Problem p(Shape{w * 96, 264, 520, 0, DType::bf16, BLayout::NK}, 900);
  for (const VariantRun& run : {kRuns[5], kRuns[4], kRuns[6]}) {
    auto s = t.stream();
    p.poison_c(s);
    ops.plain->fill_buffers(0xFF, s);
    t.sync(s);
    t.host_barrier("agmm.many.poisoned");
    GatheredA g{};
    for (int i = 0; i < 1000; ++i) g = ops.plain->launch(run.variant, p.args(), s);
    t.sync(s);
    p.expect_result(g, std::string(run.name) + " after 1000 launches");
    t.host_barrier("agmm.many.checked");
    p.refresh(901);
    launch_checked(ops, p, run, p.args(), std::string(run.name) + " on new inputs after 1000 launches");
    p.refresh(900);
  }
}

TEST(Agmm, CudaGraphCaptureAndReplay) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  Ops ops;
  for (int gd : {0, 1}) {
    Problem p(odd_shape(gd, DType::bf16, BLayout::KN), 700 + uint64_t(gd));
    for (const VariantRun& run : {kRuns[1], kRuns[4], kRuns[5], kRuns[6]}) {
      AllGatherMatmul& op = run.sym ? *ops.sym : *ops.plain;
      auto s = t.stream();
      op.launch(run.variant, p.args(), s);  // first launch outside the graph: plans, attributes
      t.sync(s);
      t.host_barrier("agmm.graph.warm");
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      TF_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      GatheredA g{};
      for (int i = 0; i < 2; ++i) g = op.launch(run.variant, p.args(), s);
      TF_CUDA(cudaStreamEndCapture(s, &graph));
      TF_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      for (int rep = 0; rep < 3; ++rep) {
        p.refresh(710 + uint64_t(rep) + 10 * uint64_t(gd));
        p.poison_c(s);
        ops.plain->fill_buffers(0xFF, s);
        ops.sym->fill_buffers(0xFF, s);
        t.sync(s);
        t.host_barrier("agmm.graph.poisoned");
        TF_CUDA(cudaGraphLaunch(exec, s));
        t.sync(s);
        p.expect_result(g, label(p.shape()) + " " + run.name + " graph replay " + std::to_string(rep));
        t.host_barrier("agmm.graph.checked");
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }
}

TEST(Agmm, RejectsBadArgumentsBeforeLaunch) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  Ops ops;
  Problem p(odd_shape(0, DType::bf16, BLayout::NK), 5);
  auto expect_invalid = [&](const std::string& what, AgmmArgs a, const char* needle) {
    try {
      ops.plain->launch(AgmmVariant::push, a, t.stream());
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << what;
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  AgmmArgs a = p.args();
  a.m += 1;
  expect_invalid("M not divisible", a, "divisible");
  a = p.args();
  a.gather_dim = 1;
  a.k = t.world() * 500 + 1;
  expect_invalid("K not divisible", a, "divisible");
  a = p.args();
  a.m = 4096;
  expect_invalid("over capacity", a, "capacity");
  a = p.args();
  a.a_shard = ops.plain->local_slot(a.m, a.k, 0).ptr;  // in the op's buffer but not with its stride
  expect_invalid("A_shard inside the op's buffer", a, "overlaps");
  a = p.args();
  a.c = static_cast<char*>(const_cast<void*>(a.a_shard));
  expect_invalid("C over A_shard", a, "overlaps");
  EXPECT_THROW(parse_agmm_variant("pull"), Error);
  t.host_barrier("agmm.invalid.done");
}

}  // namespace
}  // namespace taxfree
