// Shared helpers of the all_gather_matmul GPU tests: random problems whose inputs every rank can
// regenerate, a float64 host reference of sampled rows, the checks of C (tolerance, guard bands,
// padding) and of the gathered A (bit for bit, identical on every rank), and the ops under test.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gemm_test_util.h"
#include "gpu_env.h"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::agmm_test {

using gemm::BLayout;
using gemm::DType;
using test::bits_hash;
using test::expect_same_on_every_rank;
using test::team;

using gemm::test::DevBuf;
using gemm::test::kGuard;
using gemm::test::kPoison;
inline int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

struct Shape {
  int64_t m, n, k;
  int gather_dim;
  DType dtype;
  BLayout layout;
};

inline std::string label(const Shape& s) {
  return "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) + " gd" +
         std::to_string(s.gather_dim) + " " + gemm::dtype_name(s.dtype) + " " + gemm::layout_name(s.layout);
}

// The odd shapes every variant runs: M not a multiple of any tile but divisible by the ranks (gd0),
// K = 1001 (gd0) or a multiple of 8 but not of 64 per rank (gd1), N = 1000.
inline Shape odd_shape(int gather_dim, DType t, BLayout l, int64_t w = team().world()) {
  return gather_dim == 0 ? Shape{w * 500, 1000, 1001, 0, t, l} : Shape{999, 1000, w * 504, 1, t, l};
}

// Inputs of every rank, regenerable on every rank: shard s from seed (seed, s), B of rank r from
// (seed, 500 + r), or from (seed, 500) on every rank with `same_b` (a replicated weight, as ksplit
// needs); uniform in [-1, 1), rounded to the element type. Strides padded, padding NaN. The rank
// and world are the team's, or given (ranks simulated in one process: one Problem per rank).
class Problem {
 public:
  Problem(const Shape& s, uint64_t seed, bool same_b = false)
      : Problem(s, seed, same_b, team().rank(), team().world()) {}
  Problem(const Shape& s, uint64_t seed, bool same_b, int rank, int world)
      : Problem(s, seed, same_b, rank, world, true) {}

  // The same shape with other values, in buffers of its own, never checked (no reference): runs
  // that alternate its args() with this one's launch by launch, ending on this one, compute a wrong
  // C if a launch reads data a peer sent for the launch before it (with one set of inputs, that
  // data would hold the same values).
  Problem decoy() const { return Problem(s_, seed_ + 7919, same_b_, rank_, world_, false); }

 private:
  Problem(const Shape& s, uint64_t seed, bool same_b, int rank, int world, bool checked)
      : s_(s), seed_(seed), same_b_(same_b), rank_(rank), world_(world) {
    const int w = world_;
    sh_ = agmm_shard_shape(s.m, s.k, s.gather_dim, w);
    lda_ = round8(sh_.cols) + 8;
    ldb_ = (s.layout == BLayout::nk ? round8(s.k) : round8(s.n)) + 8;
    ldc_ = round8(s.n) + 16;
    for (int r = 0; r < w; ++r) shards_.push_back(random_matrix(sh_.rows, sh_.cols, lda_, 1000 * seed + uint64_t(r)));
    const int64_t b_rows = s.layout == BLayout::nk ? s.n : s.k, b_cols = s.layout == BLayout::nk ? s.k : s.n;
    b_ = random_matrix(b_rows, b_cols, ldb_, b_seed());
    a_dev_ = std::make_unique<DevBuf>(shards_[0].size() * 2);
    b_dev_ = std::make_unique<DevBuf>(b_.size() * 2);
    c_elems_ = s.m * ldc_ + 2 * kGuard;
    c_dev_ = std::make_unique<DevBuf>(size_t(c_elems_) * 2);
    upload();
    if (checked) reference();
  }

 public:
  // New values for every input (fresh random), same shape and buffers.
  void refresh(uint64_t seed) {
    const int w = world_;
    seed_ = seed;
    for (int r = 0; r < w; ++r) shards_[size_t(r)] = random_matrix(sh_.rows, sh_.cols, lda_, 1000 * seed + uint64_t(r));
    const int64_t b_rows = s_.layout == BLayout::nk ? s_.n : s_.k, b_cols = s_.layout == BLayout::nk ? s_.k : s_.n;
    b_ = random_matrix(b_rows, b_cols, ldb_, b_seed());
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

  // C against the reference and the gathered A bit for bit (and C bit for bit the same on every
  // rank with `c_same`, meaningful with same_b); `what` names the run in failures. Collective.
  void expect_result(const GatheredA& g, const std::string& what, bool c_same = false) {
    expect_c(what);
    expect_gathered(g, what);
    if (c_same) expect_c_same_on_every_rank(what);
  }

  const Shape& shape() const { return s_; }

  // The gathered A bit for bit against the shards (this rank only); returns its hash.
  uint64_t expect_gathered_values(const GatheredA& g, const std::string& what) {
    EXPECT_NE(g.ptr, nullptr) << what;
    if (g.ptr == nullptr) return 0;
    std::vector<uint16_t> got(static_cast<size_t>(s_.m * s_.k));
    TF_CUDA(cudaMemcpy2D(got.data(), size_t(s_.k * 2), g.ptr, size_t(g.ld * 2), size_t(s_.k * 2), size_t(s_.m),
                         cudaMemcpyDeviceToHost));
    int64_t wrong = 0;
    for (int64_t r = 0; r < s_.m; ++r)
      for (int64_t c = 0; c < s_.k; ++c) {
        const uint16_t v = got[size_t(r * s_.k + c)];
        if (v != a_bits(r, c) && wrong++ < 3)
          ADD_FAILURE() << what << ": gathered A[" << r << ", " << c << "] = 0x" << std::hex << v << ", want 0x"
                        << a_bits(r, c) << std::dec;
      }
    EXPECT_EQ(wrong, 0) << what << ": gathered A elements differ from the shards";
    return bits_hash(got);
  }

  // C as it is now on this rank (guard bands and padding included), bits.
  std::vector<uint16_t> c_bits() const {
    std::vector<uint16_t> out(static_cast<size_t>(c_elems_));
    TF_CUDA(cudaMemcpy(out.data(), c_dev_->p, out.size() * 2, cudaMemcpyDeviceToHost));
    return out;
  }

  // C bit for bit the same on every rank (meaningful with same_b). Collective: call on every rank.
  void expect_c_same_on_every_rank(const std::string& what) {
    std::vector<uint16_t> out(static_cast<size_t>(c_elems_));
    TF_CUDA(cudaMemcpy(out.data(), c_dev_->p, out.size() * 2, cudaMemcpyDeviceToHost));
    expect_same_on_every_rank(bits_hash(out), what + ": C");
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
        ASSERT_TRUE(std::isfinite(bits_to_float(s_.dtype, out[size_t(kGuard + i * ldc_ + j)])))
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
        const double got = bits_to_float(s_.dtype, out[size_t(kGuard + rows_[r] * ldc_ + j)]);
        if (std::fabs(got - want) > 2 * u * std::fabs(want) + slack && bad++ < 5)
          ADD_FAILURE() << what << ": C[" << rows_[r] << ", " << j << "] = " << got << ", want " << want;
        err2 += (got - want) * (got - want);
        ref2 += want * want;
      }
    EXPECT_EQ(bad, 0) << what << ": elements outside tolerance";
    EXPECT_LE(std::sqrt(err2 / ref2), 1.5 * u) << what << ": relative Frobenius error";
  }

 private:
  std::vector<uint16_t> random_matrix(int64_t rows, int64_t cols, int64_t ld, uint64_t seed) const {
    std::mt19937_64 rng(::taxfree::test::value_seed(seed));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> m(static_cast<size_t>(rows * ld), kPoison);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) m[size_t(r * ld + c)] = float_to_bits(s_.dtype, u(rng));
    return m;
  }
  void upload() {
    const int rank = rank_;
    ::taxfree::test::copy_to_device(a_dev_->p, shards_[size_t(rank)].data(), shards_[size_t(rank)].size() * 2);
    ::taxfree::test::copy_to_device(b_dev_->p, b_.data(), b_.size() * 2);
  }
  // Expected gathered A, element (r, c).
  uint16_t a_bits(int64_t r, int64_t c) const {
    if (s_.gather_dim == 0) return shards_[size_t(r / sh_.rows)][size_t((r % sh_.rows) * lda_ + c)];
    return shards_[size_t(c / sh_.cols)][size_t(r * lda_ + c % sh_.cols)];
  }
  float b_at(int64_t kk, int64_t j) const {
    return bits_to_float(s_.dtype, s_.layout == BLayout::nk ? b_[size_t(j * ldb_ + kk)] : b_[size_t(kk * ldb_ + j)]);
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
      for (int64_t kk = 0; kk < s_.k; ++kk) arow[size_t(kk)] = bits_to_float(s_.dtype, a_bits(rows_[r], kk));
      for (int64_t j = 0; j < s_.n; ++j) {
        double acc = 0;
        const double* bj = &bt[size_t(j * s_.k)];
        for (int64_t kk = 0; kk < s_.k; ++kk) acc += arow[size_t(kk)] * bj[kk];
        ref_[r * size_t(s_.n) + size_t(j)] = acc;
      }
    }
  }
  uint64_t b_seed() const { return 1000 * seed_ + 500 + (same_b_ ? 0 : uint64_t(rank_)); }
  void expect_gathered(const GatheredA& g, const std::string& what) {
    expect_same_on_every_rank(expect_gathered_values(g, what), what + ": gathered A");
  }

  Shape s_;
  uint64_t seed_;
  bool same_b_;
  int rank_, world_;
  ShardShape sh_{};
  int64_t lda_ = 0, ldb_ = 0, ldc_ = 0, c_elems_ = 0;
  std::vector<std::vector<uint16_t>> shards_;
  std::vector<uint16_t> b_;
  std::unique_ptr<DevBuf> a_dev_, b_dev_, c_dev_;
  std::vector<int64_t> rows_;
  std::vector<double> ref_;
};

// Wait for this rank's stream, then for every rank.
inline void align(const std::string& barrier) {
  team().sync(team().stream());
  team().host_barrier(barrier);
}

// Both NCCL flavours of the op, small capacity (K up to max(min_k, 4096, 1024 * world)), heap
// returned at the end. ksplit buffers (cfg's capacity) only on the plain one.
struct Ops {
  uint64_t mark;
  std::unique_ptr<AllGatherMatmul> plain, sym;
  explicit Ops(AgmmConfig cfg = {}, int64_t min_k = 0, int64_t min_m = 0) {
    mark = team().heap().mark();
    const int64_t w = team().world();
    cfg.max_m = std::max({int64_t(2048), 512 * w, min_m}), cfg.max_k = std::max({int64_t(4096), 1024 * w, min_k});
    plain = std::make_unique<AllGatherMatmul>(team(), cfg);
    cfg.bsp_symmetric = true;
    cfg.ksplit_max_m = 0;
    sym = std::make_unique<AllGatherMatmul>(team(), cfg);
  }
  // Poison p's C and every op buffer (enqueued; align() before a launch: peers write into them).
  void poison(Problem& p) {
    p.poison_c(team().stream());
    plain->fill_buffers(0xFF, team().stream());
    sym->fill_buffers(0xFF, team().stream());
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
                     {"fused-ce", false, AgmmVariant::fused_ce},     {"auto", false, AgmmVariant::automatic},
                     {"sm-specialized", false, AgmmVariant::sm_specialized}};

// Poison C and every op buffer, align the ranks (peers write into this rank's buffers), launch,
// wait, check, align again (this rank's next poison must not hit a peer's late writes). In place:
// this rank's shard is first copied into the op's slot and passed from there.
inline GatheredA launch_checked(Ops& ops, Problem& p, const VariantRun& run, AgmmArgs args, const std::string& what,
                                bool in_place = false) {
  auto& t = team();
  auto s = t.stream();
  AllGatherMatmul& op = run.sym ? *ops.sym : *ops.plain;
  ops.poison(p);
  if (in_place) {
    const AgmmArgs slot = p.in_place_args(op, s);
    args.a_shard = slot.a_shard, args.lda_shard = slot.lda_shard;
  }
  align("agmm.poisoned");
  GatheredA g = op.launch(run.variant, args, s);
  t.sync(s);
  p.expect_result(g, what);
  t.host_barrier("agmm.checked");
  return g;
}

}  // namespace taxfree::agmm_test
