// GPU test driver: starts one rank per GPU, each joins the team and runs every test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_env.h"
#include "taxfree/runtime/coordinator.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/launcher.h"
#include "taxfree/runtime/team.h"

namespace taxfree::test {
namespace {
std::unique_ptr<Team> g_team;
int g_visible = 0;
uint64_t g_seed = 0;

// Ranks other than 0 print only failures, prefixed with their rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::cerr << "[rank " << rank_ << "] " << (r.file_name() ? r.file_name() : "?") << ":" << r.line_number()
                << ": failure\n" << r.summary() << "\n";
  }

 private:
  int rank_;
};

uint64_t fresh_seed() {
  if (const char* s = std::getenv("TAXFREE_TEST_SEED"); s && *s) return std::strtoull(s, nullptr, 10);
  return (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
}

// The run's seed, anew at each --gtest_repeat iteration: rank 0's on every rank (the ranks
// regenerate each other's inputs from it), printed by rank 0 first, so TAXFREE_TEST_SEED=N repeats
// an iteration's shapes and values alike.
class SeedListener : public ::testing::EmptyTestEventListener {
  void OnTestIterationStart(const ::testing::UnitTest&, int iteration) override {
    uint64_t seed = fresh_seed();
    try {
      if (g_team) {
        CoordinatorClient& c = g_team->coordinator();
        seed = std::stoull(c.all_gather(c.next_key("test.seed"), std::to_string(seed), 60)[0]);
      }
    } catch (const Error& e) {  // another rank is gone: nothing can run
      std::cerr << e.what() << "\n";
      std::exit(e.status() == Status::RemoteError ? kExitRemote : kExitFailed);
    }
    g_seed = seed;
    if (!g_team || g_team->rank() == 0)
      std::cout << "[taxfree gpu tests] iteration " << iteration << ": TAXFREE_TEST_SEED=" << seed << std::endl;
  }
};
}  // namespace

int visible_gpus() { return g_visible; }
int world_size() { return g_team ? g_team->world() : 0; }
int rank() { return g_team ? g_team->rank() : 0; }
Team& team() { return *g_team; }
void copy_to_device(void* dst, const void* src, size_t bytes) {
  TF_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  TF_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
}
uint64_t test_seed() { return g_seed; }
uint64_t value_seed(uint64_t seed) {  // splitmix64 of the pair
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + g_seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t bits_hash(const std::vector<uint16_t>& bits) {
  uint64_t h = 1469598103934665603ull;
  for (uint16_t x : bits) h = (h ^ x) * 1099511628211ull;
  return h;
}
void expect_same_on_every_rank(uint64_t hash, const std::string& what) {
  CoordinatorClient& c = team().coordinator();
  const auto all = c.all_gather(c.next_key("test.hash"), std::to_string(hash), 120);
  for (size_t r = 1; r < all.size(); ++r) EXPECT_EQ(all[r], all[0]) << what << ": rank " << r << " differs from rank 0";
}
}  // namespace taxfree::test

int main(int argc, char** argv) {
  using namespace taxfree;
  default_multicast_off();
  if (argc > 1 && std::strcmp(argv[1], "_probe-gpus") == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    std::cout << n << "\n";
    return 0;
  }
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::strncmp(argv[i], "--gtest_list_tests", 18) == 0;
  // The ranks get the command line as given: InitGoogleTest removes the --gtest_* flags it parsed
  // (a --gtest_filter would otherwise reach only this launcher process).
  const std::vector<std::string> given(argv, argv + argc);
  ::testing::InitGoogleTest(&argc, argv);
  if (listing) return RUN_ALL_TESTS();
  ::testing::UnitTest::GetInstance()->listeners().Append(new taxfree::test::SeedListener);

  if (!rank_env()) {
    std::string why;
    const int visible = probe_visible_gpus(self_executable(), &why);
    if (visible > 0) {
      int n = visible;
      if (const char* r = std::getenv("TAXFREE_TEST_RANKS")) n = std::max(1, std::min(visible, std::atoi(r)));
      LaunchSpec spec;
      spec.nranks = n;
      spec.argv = given;
      spec.argv[0] = self_executable();
      return run_ranks(spec);
    }
    std::cerr << "[taxfree gpu tests] no GPU visible" << (why.empty() ? "" : " (" + why + ")")
              << ": every test reports SKIPPED\n";
    return RUN_ALL_TESTS();
  }
  try {
    int n = 0;
    taxfree::test::g_visible = cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
    taxfree::test::g_team = Team::join();
  } catch (const Error& e) {
    std::cerr << e.what() << "\n";
    return e.status() == Status::RemoteError ? kExitRemote : kExitFailed;
  }
  if (taxfree::test::rank() != 0) {
    GTEST_FLAG_SET(output, "");  // rank 0 alone writes --gtest_output (the ranks share the path)
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new taxfree::test::FailurePrinter(taxfree::test::rank()));
  }
  int rc = RUN_ALL_TESTS();
  try {
    taxfree::test::team().finish();
  } catch (const Error& e) {
    std::cerr << e.what() << "\n";
    rc = rc ? rc : e.status() == Status::RemoteError ? kExitRemote : kExitFailed;
  }
  taxfree::test::g_team.reset();
  return rc;
}
