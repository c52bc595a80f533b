// Fresh random inputs for CPU tests: one seed per process, TAXFREE_TEST_SEED=N repeats a run
// (the GPU tests' variable). A test that draws from it names it in its failures (seed_trace).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace taxfree::test {

inline uint32_t cpu_test_seed() {
  static const uint32_t seed = [] {
    const char* v = std::getenv("TAXFREE_TEST_SEED");
    return v && *v ? uint32_t(std::strtoull(v, nullptr, 10)) : std::random_device{}();
  }();
  return seed;
}

// For SCOPED_TRACE: how to repeat the run's inputs.
inline std::string seed_trace() {
  return "TAXFREE_TEST_SEED=" + std::to_string(cpu_test_seed()) + " repeats these inputs";
}

}  // namespace taxfree::test
