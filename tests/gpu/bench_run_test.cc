// bench::run's own checks, on the GPU (they need a Team): a named op whose filters select no case
// fails, naming the op (or the op's own check names the entry), instead of printing an empty table
// and passing; every named op is checked before any runs.
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
  // A key the default sweep has, with a value it never takes: gemm's filter reaches bench::run's
  // check; flash_decode refuses such an entry itself, naming it, before any case is built.
  const auto expect_refused = [&](const char* op, const char* entry, const char* says) {
    req.ops = {op};
    req.options.shapes = {entry};
    try {
      bench::run(t, req);
      ADD_FAILURE() << op << ": no error for the filter " << entry << ", which selects nothing";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_refused("gemm", "M=12345", "op 'gemm': no case matches");
  expect_refused("flash_decode", "kv=12345", "'kv=12345' selects no shape of the default sweep");
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
