// Environment of the GPU tests: which GPU this process drives, and the skip rule.
//
// GPU tests are reported SKIPPED (never passed) where fewer GPUs than a test needs are present.
#pragma once

#include <gtest/gtest.h>

namespace taxfree::test {
// GPUs visible to this process (0 when the CUDA driver is absent or reports none).
int visible_gpus();
// Ranks taking part in this test run (1 for single-process runs).
int world_size();
int rank();
}  // namespace taxfree::test

// Skip the current test unless `n` GPUs are available: one visible GPU for single-GPU tests, `n`
// ranks (one GPU each) for multi-GPU tests.
#define TF_REQUIRE_GPUS(n)                                                                    \
  do {                                                                                        \
    const int tf_have_ = (n) <= 1 ? ::taxfree::test::visible_gpus() : ::taxfree::test::world_size(); \
    if (::taxfree::test::visible_gpus() < 1 || tf_have_ < (n))                                \
      GTEST_SKIP() << "needs " << (n) << " GPU(s); this run has "                             \
                   << ::taxfree::test::visible_gpus() << " visible and "                      \
                   << ::taxfree::test::world_size() << " rank(s)";                            \
  } while (0)
