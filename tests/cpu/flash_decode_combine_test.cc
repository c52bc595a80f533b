// The LSE combine math (lse_combine.h, the exact code the kernels run) against a direct softmax
// over all tokens, including empty (-inf) partials and the all-empty case.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "test_seed.h"
#include "../../src/ops/flash_decode/reference.h"
#include "taxfree/kernels/attention/lse_combine.h"

namespace taxfree::flash_decode {
namespace {

namespace at = taxfree::attention;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Scores and values of n tokens, dealt to `parts` partials by a random cut (some partials empty);
// each partial computed exactly (double) and rounded to fp32 as a kernel would store it; then
// merged with the float combine and compared with a direct softmax over all tokens.
void check_random(std::mt19937& rng, int n, int parts, int dim, double score_scale, double offset) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> s(static_cast<size_t>(n)), v(size_t(n) * dim);
  for (auto& x : s) x = offset + score_scale * nd(rng);
  for (auto& x : v) x = nd(rng);
  // Random cut points (duplicates give empty partials).
  std::vector<int> cut = {0, n};
  std::uniform_int_distribution<int> pos(0, n);
  for (int i = 0; i < parts - 1; ++i) cut.push_back(pos(rng));
  std::sort(cut.begin(), cut.end());

  std::vector<float> o(size_t(parts) * dim), lse(static_cast<size_t>(parts));
  std::vector<double> od(static_cast<size_t>(dim));
  for (int i = 0; i < parts; ++i) {
    const int b = cut[i], e = cut[i + 1];
    const double l = ref::direct(e - b, dim, s.data() + b, v.data() + int64_t(b) * dim, od.data());
    lse[i] = float(l);
    for (int d = 0; d < dim; ++d)
      o[size_t(i) * dim + d] = e > b ? float(od[d]) : std::numeric_limits<float>::quiet_NaN();
  }
  std::vector<float> got(static_cast<size_t>(dim));
  const float got_lse = at::lse_combine(o.data(), dim, lse.data(), 1, parts, dim, got.data());
  std::vector<double> want(static_cast<size_t>(dim));
  const double want_lse = ref::direct(n, dim, s.data(), v.data(), want.data());

  if (n == 0) {
    EXPECT_EQ(got_lse, -std::numeric_limits<float>::infinity());
    for (int d = 0; d < dim; ++d) EXPECT_EQ(got[d], 0.f);
    return;
  }
  EXPECT_NEAR(got_lse, want_lse, 2e-6 * std::max(1.0, std::fabs(want_lse)));
  // Each fp32 lse is off by up to |lse| 2^-24, which moves its partial's weight by that much
  // relative: with large scores (|lse| ~ 1000: 6e-5) that term outgrows the fixed bound.
  double lse_abs = 0, o_abs = 0;
  for (int i = 0; i < parts; ++i)
    if (cut[i + 1] > cut[i]) {
      lse_abs = std::max(lse_abs, std::fabs(double(lse[i])));
      for (int d = 0; d < dim; ++d) o_abs = std::max(o_abs, std::fabs(double(o[size_t(i) * dim + d])));
    }
  const double weight_term = 4 * lse_abs * 0x1p-24 * o_abs;
  for (int d = 0; d < dim; ++d)
    EXPECT_NEAR(got[d], want[d], 2e-5 + 2e-5 * std::fabs(want[d]) + weight_term) << "d=" << d;
}

TEST(FlashDecodeCombine, MatchesDirectSoftmaxOnRandomScores) {
  SCOPED_TRACE(test::seed_trace());
  std::mt19937 rng(test::cpu_test_seed());
  for (int parts : {1, 2, 3, 5, 8, 22, 64})
    for (int n : {0, 1, 2, 17, 300, 5000})  // 0: every partial empty
      for (double sc : {0.3, 3.0, 30.0}) {
        SCOPED_TRACE(testing::Message() << "parts=" << parts << " n=" << n << " score_scale=" << sc);
        check_random(rng, n, parts, 16, sc, 0.0);
      }
}

TEST(FlashDecodeCombine, LargeScoresDoNotOverflow) {
  SCOPED_TRACE(test::seed_trace());
  std::mt19937 rng(test::cpu_test_seed() + 1);
  // exp(1000) overflows float and double; the max-subtract keeps every exponent <= 0.
  check_random(rng, 1000, 8, 8, 5.0, 1000.0);
  check_random(rng, 1000, 8, 8, 5.0, -1000.0);
  check_random(rng, 100, 4, 8, 200.0, 0.0);
}

TEST(FlashDecodeCombine, EmptyPartialsHaveZeroWeightAndAreNeverRead) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float ninf = -std::numeric_limits<float>::infinity();
  // Partial 1 and 3 are empty and hold poison; the result is partial 0 and 2's merge.
  const float o[4][2] = {{1.f, 2.f}, {nan, nan}, {3.f, -4.f}, {nan, nan}};
  const float lse[4] = {0.5f, ninf, 0.5f, ninf};
  float out[2];
  const float l = at::lse_combine(&o[0][0], 2, lse, 1, 4, 2, out);
  EXPECT_FLOAT_EQ(l, 0.5f + std::log(2.f));
  EXPECT_FLOAT_EQ(out[0], 2.f);
  EXPECT_FLOAT_EQ(out[1], -1.f);
  const at::LseStats st = at::lse_stats(lse, 4);
  EXPECT_EQ(at::lse_weight(lse[1], st), 0.f);
  EXPECT_FLOAT_EQ(at::lse_weight(lse[0], st) + at::lse_weight(lse[2], st), 1.f);
}

TEST(FlashDecodeCombine, AllEmptyGivesZeroAndMinusInf) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float ninf = -std::numeric_limits<float>::infinity();
  const float o[3][2] = {{nan, nan}, {nan, nan}, {nan, nan}};
  const float lse[3] = {ninf, ninf, ninf};
  float out[2] = {nan, nan};
  EXPECT_EQ(at::lse_combine(&o[0][0], 2, lse, 1, 3, 2, out), ninf);
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(out[1], 0.f);
  const at::LseStats st = at::lse_stats(lse, 3);
  EXPECT_EQ(st.max, ninf);
  EXPECT_EQ(st.sum, 0.f);
  EXPECT_EQ(at::lse_total(st), ninf);
  // Double reference agrees on the convention.
  const double od[2] = {1, 2}, ld[1] = {-kInf};
  double outd[2];
  EXPECT_EQ(ref::combine(1, 2, od, ld, outd), -kInf);
  EXPECT_EQ(outd[0], 0.0);
}

TEST(FlashDecodeCombine, SinglePartialIsIdentity) {
  const float o[3] = {0.25f, -1.5f, 7.f};
  const float lse[1] = {3.75f};
  float out[3];
  EXPECT_FLOAT_EQ(at::lse_combine(o, 3, lse, 1, 1, 3, out), 3.75f);
  for (int d = 0; d < 3; ++d) EXPECT_FLOAT_EQ(out[d], o[d]);
}

TEST(FlashDecodeCombine, StridedLayoutLikeTheKernels) {
  // [parts][rows][dim] with row 1 selected: o stride between parts = rows*dim, lse stride = rows.
  const int parts = 3, rows = 2, dim = 2;
  const float o[parts][rows][dim] = {{{9, 9}, {1, 1}}, {{9, 9}, {2, 2}}, {{9, 9}, {4, 4}}};
  const float lse[parts][rows] = {{0, 0}, {0, std::log(2.f)}, {0, -std::numeric_limits<float>::infinity()}};
  float out[dim];
  const float l = at::lse_combine(&o[0][1][0], rows * dim, &lse[0][1], rows, parts, dim, out);
  EXPECT_NEAR(l, std::log(3.f), 1e-6);
  EXPECT_NEAR(out[0], (1.f * 1 + 2.f * 2) / 3.f, 1e-6);
}

TEST(FlashDecodeReference, PartialsThenCombineEqualWholeSequence) {
  // The double reference path used by the GPU tests: attend slices, combine, compare to whole.
  SCOPED_TRACE(test::seed_trace());
  std::mt19937 rng(test::cpu_test_seed() + 2);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int group = 4, dim = 8, len = 97;
  std::vector<float> q(group * dim), k(len * dim), v(len * dim);
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = u(rng);
  std::vector<double> whole(group * dim), whole_lse(group);
  ref::attend_group(group, dim, q.data(), k.data(), v.data(), dim, 0, len, 0.5, whole.data(), whole_lse.data());
  const int cuts[] = {0, 40, 40, 96, 97};  // an empty middle slice
  const int parts = 4;
  std::vector<double> o(parts * group * dim), l(parts * group);
  for (int p = 0; p < parts; ++p)
    ref::attend_group(group, dim, q.data(), k.data(), v.data(), dim, cuts[p], cuts[p + 1], 0.5,
                      o.data() + p * group * dim, l.data() + p * group);
  for (int g = 0; g < group; ++g) {
    std::vector<double> og(parts * dim), lg(parts), out(dim);
    for (int p = 0; p < parts; ++p) {
      lg[p] = l[p * group + g];
      for (int d = 0; d < dim; ++d) og[p * dim + d] = o[(p * group + g) * dim + d];
    }
    EXPECT_NEAR(ref::combine(parts, dim, og.data(), lg.data(), out.data()), whole_lse[g], 1e-12);
    for (int d = 0; d < dim; ++d) EXPECT_NEAR(out[d], whole[g * dim + d], 1e-12);
  }
}

}  // namespace
}  // namespace taxfree::flash_decode
