// bench::run's own checks, on the GPU (they need a Team): a named op whose filters select no case
// fails, naming the op, instead of printing an empty table and passing; every named op is checked
// before any runs.
#include <gtest/gtest.h>

#include <string>

#include "gpu_env.h"
#include "taxfree/bench/harness.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree {
namespace {

using test::team;

TEST(BenchRun, FiltersThatSelectNoCaseAreAnError) {
  TF_REQUIRE_GPUS(1);
  Team& t = team();
  bench::RunRequest req;
  req.ops = {"flash_decode"};
  req.options.shapes = {"kv=12345"};  // a key the default sweep has, with a value it never takes
  try {
    bench::run(t, req);
    ADD_FAILURE() << "no error for a filter that selects nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("op 'flash_decode': no case matches"), std::string::npos) << e.what();
  }
  // The same op with a filter that selects a case still runs it (the team is usable after the error).
  req.options.shapes = {"batch=1,kv=300,heads=64/8"};
  req.options.iters = 2, req.options.warmup = 1, req.options.check = 1;
  EXPECT_EQ(bench::run(t, req), 0);
  // A later op's bad entry (gemm has no key 'batch') fails before the first op measures anything.
  req.ops = {"flash_decode", "gemm"};
  ::testing::internal::CaptureStdout();
  EXPECT_THROW(bench::run(t, req), Error);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.find("measured"), std::string::npos) << out;
}

}  // namespace
}  // namespace taxfree
