// The command line without GPUs: bad input fails once, clearly, before any rank starts.
#include <gtest/gtest.h>

#include "test_process.h"

namespace taxfree {
namespace {

using test::cli;
using test::run_process;

void expect_usage_error(std::vector<std::string> args, const std::string& needle) {
  args.insert(args.begin(), cli());
  auto r = run_process(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
}

TEST(Cli, RejectsBadBenchArguments) {
  expect_usage_error({"bench", "all_gatherr"}, "unknown op 'all_gatherr' (known: put_get, signal, barrier, all_gather");
  expect_usage_error({"bench", "all_gather", "--variant", "pull"}, "op 'all_gather' has no variant or part 'pull'");
  expect_usage_error({"bench", "all_gather", "-b", "0"}, "sizes must be > 0 bytes");
  expect_usage_error({"bench", "all_gather", "-b", "1M", "-e", "1K"}, "is smaller than -b");
  expect_usage_error({"bench", "all_gather", "-b", "12Q"}, "unknown unit");
  expect_usage_error({"bench", "all_gather", "-g", "1"}, "needs at least 2 GPUs");
  expect_usage_error({"bench", "--inject", "melt:1"}, "unknown fault 'melt'");
  expect_usage_error({"bench", "--dtype", "fp64"}, "fp64");
  expect_usage_error({"bench", "decode", "--sample-us", "0"}, "--sample-us");
  expect_usage_error({"frobnicate"}, "A subcommand is required");
  expect_usage_error({"bench", "gemm", "--shape", "M=1,tile=1x1"}, "tile=1x1 is not one of");
  expect_usage_error({"bench", "gemm", "--shape", "Q=1"}, "unknown key 'Q'");
  expect_usage_error({"bench", "all_gather_matmul", "--shape", "gather_dim=2"}, "gather_dim=2 is not one of 0, 1");
  expect_usage_error({"bench", "all_gather_matmul", "--shape", "M=-4"}, "M=-4 is not a positive integer");
}

TEST(Cli, BenchWithoutGpuSaysSoAndFails) {
  auto r = run_process({cli(), "bench", "all_gather"});
  if (r.output.find("GPU") == std::string::npos || r.exit_code == 0)
    GTEST_SKIP() << "this machine has a GPU: " << r.output.substr(0, 200);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("no GPU is visible"), std::string::npos) << r.output;
}

TEST(Cli, MalformedRankVariablesAreUsageErrors) {
  // Read before any rank starts, outside a rank's error handling: still a typed error and exit 2.
  auto bad = run_process({cli(), "bench", "gemm"}, {{"RANK", "abc"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("environment variable RANK='abc' is not an integer"), std::string::npos) << bad.output;
  auto port = run_process({cli(), "bench", "gemm"}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "99999"}});
  EXPECT_EQ(port.exit_code, 2) << port.output;
  EXPECT_NE(port.output.find("out of range"), std::string::npos) << port.output;
}

TEST(Cli, ListsOpsAndVariants) {
  auto r = run_process({cli(), "list"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all_gather (min ranks 2): nccl nccl-sym push"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gemm (min ranks 1): cublaslt ours"), std::string::npos) << r.output;
}

TEST(Cli, RunNeedsAProgram) {
  auto r = run_process({cli(), "run", "-n", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  auto missing = run_process({cli(), "run", "-n", "2", "--", "/nonexistent/program"});
  EXPECT_NE(missing.exit_code, 0) << missing.output;
  EXPECT_NE(missing.output.find("cannot exec /nonexistent/program"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace taxfree
