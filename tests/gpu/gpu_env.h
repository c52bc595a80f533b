// Environment of the GPU tests: the Team this rank belongs to, and the skip rule.
//
// The test binary starts one rank per visible GPU (TAXFREE_TEST_RANKS to choose fewer) with
// taxfree's launcher; every rank runs every test. Tests that need GPUs are reported SKIPPED (never
// passed) where fewer are present. The ops' tests that are generic over the team size need one GPU:
// on one rank they check the degenerate team every op must serve (tensor parallelism of 1); the
// tests whose point is what ranks do to each other (skew, peers' memory, ordering across ranks)
// need two. Collective calls inside tests must be made by every rank
// unconditionally (use EXPECT_*, not ASSERT_*, around them) so a failing rank never strands peers;
// device waits end at their deadlines regardless.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace taxfree {
class Team;
}

namespace taxfree::test {
// GPUs visible to this process (0 without a driver or device).
int visible_gpus();
// Ranks taking part in this run (0 when there is no GPU).
int world_size();
int rank();
// This rank's team; only valid when world_size() > 0.
Team& team();
// cudaMemcpy host -> device that returns only when the bytes are in device memory. From pageable
// memory cudaMemcpy may return while its last DMA is in flight, ordered only before later work on
// the legacy stream; a kernel on a non-blocking stream could read (or overwrite) the old bytes
// before it lands.
void copy_to_device(void* dst, const void* src, size_t bytes);
// The run's seed: TAXFREE_TEST_SEED when set (to repeat a run), else a fresh one at each
// --gtest_repeat iteration, the same on every rank (rank 0's: the ranks regenerate each other's
// inputs from it); rank 0 prints it at the iteration's start. Tests that draw fresh shapes seed
// from it and name it in every failure.
uint64_t test_seed();
// `seed` mixed with the run's seed, for input values: fresh values every run, the same on every
// rank and for equal `seed`s.
uint64_t value_seed(uint64_t seed);
// FNV-1a of 16-bit values (outputs compared across ranks by hash).
uint64_t bits_hash(const std::vector<uint16_t>& bits);
// Collective (every rank calls, in the same order): fails the test where a rank's hash differs
// from rank 0's.
void expect_same_on_every_rank(uint64_t hash, const std::string& what);
inline void expect_same_on_every_rank(const std::vector<uint16_t>& bits, const std::string& what) {
  expect_same_on_every_rank(bits_hash(bits), what);
}
}  // namespace taxfree::test

// Skip the current test unless `n` GPUs are available: one visible GPU for single-GPU tests, `n`
// ranks (one GPU each) for multi-GPU tests.
#define TF_REQUIRE_GPUS(n)                                                                                \
  do {                                                                                                    \
    const int tf_have_ = (n) <= 1 ? ::taxfree::test::visible_gpus() : ::taxfree::test::world_size();     \
    if (::taxfree::test::world_size() < 1 || tf_have_ < (n))                                              \
      GTEST_SKIP() << "needs " << (n) << " GPU(s); this run has " << ::taxfree::test::visible_gpus()      \
                   << " visible and " << ::taxfree::test::world_size() << " rank(s)";                     \
  } while (0)
