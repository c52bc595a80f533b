// Shared helpers of the GEMM GPU tests: random problems with a double-precision host reference,
// C buffers with guard bands, and the tolerance check.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_env.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_launch.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::gemm::test {

constexpr int64_t kGuard = 256;           // elements of guard band before and after C
constexpr uint16_t kPoison = 0xFFFF;      // NaN in bf16 and fp16

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { TF_CUDA(cudaMalloc(&p, bytes)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// Shape-parameterised suites: (index into a ShapeCase table, dtype, layout).
struct ShapeCase {
  int64_t m, n, k;
};
using ShapeParam = std::tuple<int, DType, BLayout>;
inline std::string label(const ShapeCase& s, DType t, BLayout l) {
  return "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) + " " +
         dtype_name(t) + " " + layout_name(l);
}
// Test names like M1_N3592_K8200_bf16_nk for INSTANTIATE_TEST_SUITE_P over `shapes`.
template <size_t kCount>
auto shape_param_name(const ShapeCase (&shapes)[kCount]) {
  return [&shapes](const ::testing::TestParamInfo<ShapeParam>& info) {
    const auto [i, t, l] = info.param;
    return "M" + std::to_string(shapes[i].m) + "_N" + std::to_string(shapes[i].n) + "_K" + std::to_string(shapes[i].k) +
           "_" + dtype_name(t) + "_" + layout_name(l);
  };
}

// A problem with fresh random inputs (uniform in [-1, 1)), padded row strides, on host and device.
struct Problem {
  int64_t m, n, k, lda, ldb, ldc;
  DType dtype;
  BLayout layout;
  std::vector<uint16_t> a, b;  // as stored, padding included
  std::vector<int64_t> rows;   // rows the reference covers
  std::vector<double> ref;     // rows.size() x n
  std::unique_ptr<DevBuf> da, db;

  int64_t b_rows() const { return layout == BLayout::nk ? n : k; }
  float a_at(int64_t i, int64_t kk) const { return bits_to_float(dtype, a[i * lda + kk]); }
  float b_at(int64_t kk, int64_t j) const {
    return bits_to_float(dtype, layout == BLayout::nk ? b[j * ldb + kk] : b[kk * ldb + j]);
  }
  GemmArgs args(void* c) const {
    GemmArgs g;
    g.a = da->p, g.lda = lda, g.b = db->p, g.ldb = ldb, g.c = c, g.ldc = ldc;
    g.m = m, g.n = n, g.k = k, g.dtype = dtype, g.b_layout = layout;
    return g;
  }
};

inline Problem make_problem(int64_t m, int64_t n, int64_t k, DType dtype, BLayout layout, uint64_t seed) {
  Problem p{m, n, k, (k + 7) / 8 * 8 + 8, 0, (n + 7) / 8 * 8 + 16, dtype, layout, {}, {}, {}, {}, {}, {}};
  p.ldb = layout == BLayout::nk ? (k + 7) / 8 * 8 + 24 : (n + 7) / 8 * 8 + 8;
  std::mt19937_64 rng(::taxfree::test::value_seed(seed));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  p.a.assign(size_t(m * p.lda), kPoison);  // padding stays NaN: reading it would poison C
  p.b.assign(size_t(p.b_rows() * p.ldb), kPoison);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t kk = 0; kk < k; ++kk) p.a[i * p.lda + kk] = float_to_bits(dtype, u(rng));
  const int64_t b_cols = layout == BLayout::nk ? k : n;
  for (int64_t r = 0; r < p.b_rows(); ++r)
    for (int64_t c = 0; c < b_cols; ++c) p.b[r * p.ldb + c] = float_to_bits(dtype, u(rng));

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
  ::taxfree::test::copy_to_device(p.da->p, p.a.data(), p.a.size() * 2);
  ::taxfree::test::copy_to_device(p.db->p, p.b.data(), p.b.size() * 2);
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

// Fills C with random values in [-4, 4) (guard bands and padding stay NaN) and returns the whole
// buffer as written: the base that an add epilogue's result is checked against.
inline std::vector<uint16_t> fill_random(const Problem& p, Output& c, uint32_t seed) {
  std::vector<uint16_t> init(static_cast<size_t>(c.elems), kPoison);
  std::mt19937_64 rng(::taxfree::test::value_seed(seed));
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) init[kGuard + i * p.ldc + j] = float_to_bits(p.dtype, u(rng));
  ::taxfree::test::copy_to_device(c.buf.p, init.data(), init.size() * 2);
  return init;
}

// Bounds for outputs rounded to 16 bits (unit roundoff u = 2^-8 bf16, 2^-11 fp16): elementwise
// |got - ref| <= 2u |ref| + slack, and relative Frobenius error <= 1.5 u (rounding alone gives
// about u / sqrt(3)). `base` is added to the reference (AddTo) and its size to the slack.
inline void expect_matches(const Problem& p, const std::vector<uint16_t>& out, const std::string& what,
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
      ASSERT_TRUE(std::isfinite(bits_to_float(p.dtype, row[j]))) << what << ": C[" << i << ", " << j << "] not written";
    for (int64_t j = p.n; j < p.ldc; ++j)
      ASSERT_EQ(row[j], kPoison) << what << ": padding C[" << i << ", " << j << "] (N=" << p.n << ") written";
  }
  double err2 = 0, ref2 = 0;
  int64_t bad = 0;
  for (size_t r = 0; r < p.rows.size(); ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      const int64_t o = kGuard + p.rows[r] * p.ldc + j;
      const double old = base ? bits_to_float(p.dtype, (*base)[o]) : 0.0;
      const double want = old + p.ref[r * p.n + j], got = bits_to_float(p.dtype, out[o]);
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
  ~StreamGuard() {
    release_stream_workspace(s);
    cudaStreamDestroy(s);
  }
};

// Runs `cfg` twice into poisoned C: both runs must match the reference and agree bit for bit
// (split-K partials are summed in a fixed order; the second run also finds the workspace counters
// the first left at zero).
inline void expect_repeatable(const Problem& p, Output& out, const GemmConfig& cfg, cudaStream_t s,
                              const std::string& what) {
  std::vector<uint16_t> first;
  for (int rep = 0; rep < 2; ++rep) {
    out.poison(s);
    launch(p.args(out.c()), cfg, s);
    TF_CUDA(cudaStreamSynchronize(s));
    const std::vector<uint16_t> got = out.read();
    expect_matches(p, got, what + " run " + std::to_string(rep));
    if (rep == 0) first = got;
    else EXPECT_TRUE(got == first) << what << ": two runs differ";
  }
}

}  // namespace taxfree::gemm::test
