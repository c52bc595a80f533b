// The draws of the tests that pick fresh shapes every run: seeded from test_seed() (recorded as the
// test's "seed" property and named in every failure), so TAXFREE_TEST_SEED=N repeats a run draw for
// draw.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "gpu_env.h"

namespace taxfree::test {

class Draws {
 public:
  Draws() : seed_(test_seed()), rng_(seed_) { ::testing::Test::RecordProperty("seed", std::to_string(seed_)); }

  // Uniform in [lo, hi].
  int uni(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin() { return uni(0, 1) == 1; }
  // In [lo, hi] with its logarithm uniform: tiny, odd and large sizes alike.
  int64_t log_uni(double lo, double hi) {
    return int64_t(std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi + 1.0))(rng_)));
  }
  // 64 random bits: the seed of a problem's values.
  uint64_t bits() { return rng_(); }
  // "(seed S, shape I)": names draw I of this run in a failure.
  std::string where(int i) const { return "(seed " + std::to_string(seed_) + ", shape " + std::to_string(i) + ")"; }

 private:
  uint64_t seed_;
  std::mt19937_64 rng_;
};

}  // namespace taxfree::test
