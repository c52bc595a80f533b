// The command line without GPUs: bad input fails once, clearly, before any rank starts.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "taxfree/ops/gemm.h"
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
  expect_usage_error({"frobnicate"}, "unknown command or option 'frobnicate'; commands: bench run list gemm-choice info");
  expect_usage_error({"--frobnicate", "bench"}, "not expected: --frobnicate");
  expect_usage_error({}, "A subcommand is required");
  expect_usage_error({"bench", "gemm", "--shape", "M=1,tile=1x1"}, "tile=1x1 is not one of");
  expect_usage_error({"bench", "gemm", "--shape", "M=1,cluster=3"}, "cluster=3 is not one of");  // not compiled
  expect_usage_error({"bench", "gemm", "--shape", "M=1,N=64,K=64,tile=128x256,clusterk=2"},
                     "tile 128x256 with cluster=1 clusterk=2 is not compiled");  // each is, not together
  expect_usage_error({"bench", "gemm", "--shape", "M=1,splitk=65"}, "splitk=65 is not an integer in [1, 64]");
  expect_usage_error({"bench", "all_gather", "-e", "0"}, "-e 0: sizes must be > 0 bytes");
  expect_usage_error({"bench", "flash_decode", "--shape", "batch=1,kv=1,q_heads=17,kv_heads=1"},
                     "q_heads=17 must be a multiple of kv_heads=1, at most 16 per KV head");
  expect_usage_error({"bench", "decode", "--shape", "q_heads=64,kv_heads=2"}, "q_heads=64 must be a multiple");
  expect_usage_error({"bench", "flash_decode", "--shape", "kv=8192", "--shape", "kv=8191"},
                     "'kv=8191' selects no shape of the default sweep");
  expect_usage_error({"bench", "gemm", "--shape", "Q=1"}, "unknown key 'Q'");
  expect_usage_error({"bench", "all_gather_matmul", "--shape", "gather_dim=2"}, "gather_dim=2 is not one of 0, 1");
  expect_usage_error({"bench", "all_gather_matmul", "--shape", "M=-4"}, "M=-4 is not an integer in [1, 2147483647]");
  // With -g known, a shape the ranks cannot split fails before any rank starts.
  expect_usage_error({"bench", "all_gather_matmul", "-g", "3", "--shape", "M=1000,N=64,K=64,gather_dim=0"},
                     "gather_dim 0 needs M divisible by the number of ranks: M=1000, world=3");
  expect_usage_error({"bench", "all_gather_matmul", "-g", "3", "--shape", "M=64,N=64,K=1000,gather_dim=1"},
                     "gather_dim 1 needs K divisible by the number of ranks: K=1000, world=3");
}

// Passes the CLI's checks: fails only at the malformed RANK read after them (exit 2 naming RANK),
// so no GPU is needed and none is used.
void expect_accepted(std::vector<std::string> args) {
  args.insert(args.begin(), cli());
  auto r = run_process(args, {{"RANK", "abc"}, {"WORLD_SIZE", "2"}});
  EXPECT_NE(r.output.find("RANK='abc'"), std::string::npos) << r.output;
}

// --shape numbers: plain decimal, in the key's range (the op's limit), each key once, no empty
// entry or item. Saturated or huge values once passed (gemm then overflowed its allocation size)
// and decode's std::stoi said only "stoi".
TEST(Cli, ShapeNumbersAreCheckedAgainstEachKeysLimit) {
  expect_usage_error({"bench", "gemm", "--shape", "M=1125899906842625,N=3584,K=8192"},
                     "M=1125899906842625 is not an integer in [1, 2147483647]");
  expect_usage_error({"bench", "gemm", "--shape", "M=99999999999999999999,N=3584,K=8192"}, "M=99999999999999999999");
  expect_usage_error({"bench", "gemm", "--shape", "M=2147483648,N=1,K=1"}, "M=2147483648");
  expect_usage_error({"bench", "gemm", "--shape", "M= 5"}, "M= 5 is not an integer");
  expect_usage_error({"bench", "gemm", "--shape", "M=+5"}, "M=+5 is not an integer");
  expect_usage_error({"bench", "gemm", "--shape", "M=5abc"}, "M=5abc is not an integer");
  expect_usage_error({"bench", "gemm", "--shape", "M=1,M=2"}, "key 'M' given twice");
  expect_usage_error({"bench", "gemm", "--shape", ""}, "--shape entry '': empty item");
  expect_usage_error({"bench", "gemm", "--shape", "M=1,"}, "--shape entry 'M=1,': empty item");
  expect_usage_error({"bench", "gemm", "--shape", "M=1,,N=2"}, "empty item");
  expect_usage_error({"bench", "all_gather_matmul", "--shape", "M=2147483648,N=3584,K=8192,gather_dim=1"},
                     "M=2147483648 is not an integer in [1, 2147483647]");
  expect_usage_error({"bench", "all_gather_matmul", "--shape", "M=8,N=3584,K=1073741817,gather_dim=0"},
                     "K=1073741817 is not an integer in [1, 1073741816]");
  expect_usage_error({"bench", "decode", "--shape", "batch=99999999999,kv=8192"},
                     "batch=99999999999 is not an integer in [1, 65535]");
  expect_usage_error({"bench", "flash_decode", "--shape", "batch=1,kv=2147483648"},
                     "kv=2147483648 is not an integer in [1, 1073741824]");
  expect_usage_error({"bench", "flash_decode", "--shape", "batch=1,kv=8192,kv_heads=65536,q_heads=65536"},
                     "kv_heads=65536");
  expect_accepted({"bench", "gemm", "--shape", "M=2147483647,N=1,K=1"});
  expect_accepted({"bench", "flash_decode", "--shape", "batch=65535,kv=8192,kv_heads=1,q_heads=1"});
}

// Ops whose entries only filter (put_get, signal, barrier, all_gather) once took any key and ran
// no case; an op named without --shape keys takes none.
TEST(Cli, FilterOnlyOpsRejectUnknownShapeKeys) {
  expect_usage_error({"bench", "all_gather", "--shape", "foo=1"}, "unknown key 'foo' (keys: bytes_per_rank)");
  expect_usage_error({"bench", "put_get", "--shape", "mode=both"}, "mode=both is not one of oneway, ring");
  expect_usage_error({"bench", "signal", "--shape", "bytes=8"}, "unknown key 'bytes' (keys: rounds)");
  expect_usage_error({"bench", "barrier", "--shape", "M=1"}, "unknown key 'M' (keys: reps)");
  expect_accepted({"bench", "all_gather", "--shape", "bytes_per_rank=4294967296"});  // past int32: a size
  expect_accepted({"bench", "put_get", "--shape", "bytes=1024,mode=ring"});
}

// Integer options: decimal digits only, read as decimal (CLI11 alone read "010" as 8 and "0x10" as
// 16, and saturated past the type); empty values are refused, not read as "not given".
TEST(Cli, IntegerOptionsAreDecimalAndEmptyValuesAreRefused) {
  expect_usage_error({"bench", "gemm", "-g", "0x10"}, "--ngpus: value 0x10 is not an integer in [1, 1024]");
  expect_usage_error({"bench", "gemm", "-n", "1e3"}, "--iters: value 1e3 is not an integer in [1, 1000000]");
  expect_usage_error({"bench", "gemm", "-w", "-1"}, "--warmup_iters: value -1 is not an integer");
  expect_usage_error({"bench", "gemm", "-c", "+2"}, "--check: value +2 is not an integer in [0, 1000]");
  expect_usage_error({"bench", "gemm", "--seed", "-1"}, "--seed: value -1 is not an integer");
  expect_usage_error({"bench", "gemm", "--seed", "18446744073709551616"}, "--seed: value 18446744073709551616");
  expect_usage_error({"run", "-n", "0x2", "--", "true"}, "--nranks: value 0x2 is not an integer in [1, 4096]");
  // "010" is ten ranks, not eight: rank 9 is inside the job
  expect_usage_error({"bench", "gemm", "-g", "08", "--inject", "kill:9"}, "rank 9 is not in this job of 8 rank(s)");
  expect_accepted({"bench", "gemm", "-g", "010", "--inject", "kill:9", "--seed", "9223372036854775807"});
  for (const char* opt : {"-b", "-e", "--json", "--inject"})
    expect_usage_error({"bench", "all_gather", opt, ""}, "an empty value is not allowed");
}

// One value per --shape / --variant: the op named after one is the op, not a second entry.
TEST(Cli, ShapeAndVariantTakeOneValueEach) {
  expect_accepted({"bench", "--variant", "ours", "gemm"});
  expect_accepted({"bench", "--shape", "M=1,N=2,K=3", "gemm", "--shape", "M=4,N=5,K=6"});
  expect_usage_error({"bench", "gemm", "--shape", "M=1", "all_gatherr"}, "unknown op 'all_gatherr'");
  expect_usage_error({"bench", "gemm", "decode", "gemm"}, "op 'gemm' named twice");
  expect_usage_error({"bench", "gemm", "--variant", "ours", "--variant", "ours"}, "--variant 'ours' named twice");
}

// Under torchrun / mpirun the launcher sets the world; a -g that disagrees is a mistake, not ignored.
TEST(Cli, NgpusMustMatchAnOutsideLaunchersWorld) {
  auto r = run_process({cli(), "bench", "gemm", "-g", "3"}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("-g 3 but RANK/WORLD_SIZE (torchrun or user) started 2 rank(s)"), std::string::npos) << r.output;
}

// What the ranks would read only once started, checked before: the JSON file (written after the
// whole benchmark) and Team::join's environment variables.
TEST(Cli, JsonPathAndTeamVariablesAreCheckedBeforeAnyRankStarts) {
  const std::string dir = ::testing::TempDir();
  expect_usage_error({"bench", "gemm", "--json", dir}, "is a directory");
  expect_usage_error({"bench", "gemm", "--json", dir + "/no/such/dir/x.json"}, "cannot be written: No such file");
  // A writable path passes and is not left behind; an existing file keeps its contents. Stopped
  // right after by a bad TAXFREE_TIMEOUT_S (checked next), so no rank starts even on a GPU machine.
  const std::string fresh = dir + "/taxfree_cli_json_" + std::to_string(::getpid()) + ".json";
  auto r = run_process({cli(), "bench", "gemm", "--json", fresh}, {{"TAXFREE_TIMEOUT_S", "nan"}});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("TAXFREE_TIMEOUT_S='nan' must be a number in [1e-06, 1000000]"), std::string::npos) << r.output;
  EXPECT_NE(::access(fresh.c_str(), F_OK), 0) << fresh << " was left behind";
  { std::ofstream(fresh) << "kept"; }
  r = run_process({cli(), "bench", "gemm", "--json", fresh}, {{"TAXFREE_HEAP_BYTES", "abc"}});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("TAXFREE_HEAP_BYTES='abc' must be a whole number in [1048576, 1125899906842624]"), std::string::npos)
      << r.output;
  std::string kept;
  std::getline(std::ifstream(fresh), kept);
  EXPECT_EQ(kept, "kept");
  std::remove(fresh.c_str());
  // A link to a file not there yet: the check neither replaces the link nor leaves the file.
  const std::string link = fresh + ".link";
  ASSERT_EQ(::symlink(fresh.c_str(), link.c_str()), 0);
  r = run_process({cli(), "bench", "gemm", "--json", link}, {{"TAXFREE_TIMEOUT_S", "nan"}});
  EXPECT_NE(r.output.find("TAXFREE_TIMEOUT_S='nan'"), std::string::npos) << r.output;
  struct stat st {};
  EXPECT_TRUE(::lstat(link.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) << link << " is no longer a link";
  EXPECT_NE(::access(fresh.c_str(), F_OK), 0) << fresh << " was left behind";
  ASSERT_EQ(::symlink("no/such/dir/x.json", (link + "2").c_str()), 0);
  expect_usage_error({"bench", "gemm", "--json", link + "2"}, "cannot be written: No such file");
  std::remove(link.c_str());
  std::remove((link + "2").c_str());
}

// With no op, bench runs every op's default sweep: one op's --shape or --variant is a mistake;
// every op's other checks still run up front.
TEST(Cli, SummaryModeTakesNoShapeOrVariant) {
  expect_usage_error({"bench", "--shape", "M=1"}, "--shape and --variant need an op");
  expect_usage_error({"bench", "--variant", "ours"}, "--shape and --variant need an op");
  auto r = run_process({cli(), "bench"}, {{"TAXFREE_AGMM_PUSH_CTAS", "4294967300"}});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("TAXFREE_AGMM_PUSH_CTAS=4294967300 is not an integer in [0, 2147483647]"), std::string::npos)
      << r.output;
}

// -b/-e past int64 once hit an undefined double -> int64 conversion ("sizes must be > 0 bytes").
TEST(Cli, SizesPastTheLimitNameTheValue) {
  expect_usage_error({"bench", "all_gather", "-b", "1e19"}, "size '1e19' is out of range");
  expect_usage_error({"bench", "all_gather", "-b", "1e30"}, "size '1e30' is out of range");
  expect_usage_error({"bench", "all_gather", "-e", "9223372036854775807"}, "size '9223372036854775807' is out of range");
  expect_usage_error({"bench", "all_gather", "-b", "inf"}, "size 'inf' is out of range");
}

// NaN passed CLI11's ranges; huge timeouts and heaps became 0 in later uint64 conversions.
TEST(Cli, FloatingOptionsAreFiniteAndBounded) {
  expect_usage_error({"bench", "gemm", "--timeout", "nan"}, "--timeout");
  expect_usage_error({"bench", "gemm", "--timeout", "1e12"}, "--timeout");
  expect_usage_error({"bench", "gemm", "--timeout", "inf"}, "--timeout");
  expect_usage_error({"bench", "gemm", "--timeout", "0"}, "--timeout");
  expect_usage_error({"bench", "gemm", "--heap", "nan"}, "--heap");
  expect_usage_error({"bench", "gemm", "--heap", "1e300"}, "--heap");
  expect_usage_error({"bench", "gemm", "--heap", "0.0001"}, "--heap");
  expect_usage_error({"bench", "gemm", "-f", "nan"}, "--stepfactor");
  expect_usage_error({"bench", "gemm", "--sample-us", "nan"}, "--sample-us");
  expect_usage_error({"bench", "gemm", "--sample-us", "-inf"}, "--sample-us");
  expect_accepted({"bench", "gemm", "--timeout", "1e6", "--heap", "0.0009765625", "-f", "1.01", "--sample-us", "1"});
  expect_accepted({"bench", "gemm", "--heap", "1048576", "--sample-us", "100000"});
}

// --inject's rank: a number (kill:5abc once meant 5, kill:abc said only "stoi"), inside the job.
TEST(Cli, InjectRankIsCheckedAgainstTheJob) {
  expect_usage_error({"bench", "gemm", "--inject", "kill:abc"}, "--inject 'kill:abc': rank=abc is not an integer");
  expect_usage_error({"bench", "gemm", "--inject", "kill:5abc"}, "rank=5abc is not an integer");
  expect_usage_error({"bench", "gemm", "--inject", "skip-signal:-1"}, "rank=-1 is not an integer");
  expect_usage_error({"bench", "gemm", "-g", "2", "--inject", "kill:99"},
                     "--inject 'kill:99': rank 99 is not in this job of 2 rank(s)");
  expect_accepted({"bench", "gemm", "-g", "2", "--inject", "kill:1"});
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
  EXPECT_NE(port.output.find("MASTER_PORT=99999 must be in [1, 65534]"), std::string::npos) << port.output;
}

TEST(Cli, ListsOpsAndVariants) {
  auto r = run_process({cli(), "list"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all_gather (min ranks 2): nccl nccl-sym push"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gemm (min ranks 1): cublaslt ours"), std::string::npos) << r.output;
}

// gemm-choice prints the library's choice for each shape (--shape entries, then stdin lines), and
// with --candidates the ranking it came from, one line marked chosen. No GPU needed.
TEST(Cli, GemmChoicePrintsTheHeuristicsChoiceAndRanking) {
  const auto choice = [](int64_t m, int64_t n, int64_t k, gemm::BLayout layout) {
    return std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) + " " + gemm::layout_name(layout) + " " +
           gemm::choose_gemm_config(m, n, k, DType::bf16, layout, 132).name() + "\n";
  };
  auto r = run_process({cli(), "gemm-choice", "--shape", "M=896,N=8192,K=16384,layout=kn", "--shape", "M=1000,N=3584,K=8191"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, choice(896, 8192, 16384, gemm::BLayout::kn) + choice(1000, 3584, 8191, gemm::BLayout::nk));

  auto piped = run_process({"/bin/sh", "-c", "printf '7 4096 8192\\n\\n300 5000 2048 kn\\n' | " + cli() + " gemm-choice --stdin --sms 66"});
  EXPECT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(piped.output, "7 4096 8192 nk " + gemm::choose_gemm_config(7, 4096, 8192, DType::bf16, gemm::BLayout::nk, 66).name() +
                              "\n300 5000 2048 kn " +
                              gemm::choose_gemm_config(300, 5000, 2048, DType::bf16, gemm::BLayout::kn, 66).name() + "\n");

  auto all = run_process({cli(), "gemm-choice", "--candidates", "--shape", "M=384,N=7168,K=8192"});
  EXPECT_EQ(all.exit_code, 0) << all.output;
  const gemm::GemmRanking ranking = gemm::rank_gemm_configs(384, 7168, 8192, DType::bf16, gemm::BLayout::nk);
  const std::string chosen = ranking.candidates[ranking.chosen].config.name();
  EXPECT_EQ(all.output.rfind(choice(384, 7168, 8192, gemm::BLayout::nk), 0), 0u) << all.output;
  EXPECT_NE(all.output.find(" us  " + chosen + "  <- chosen\n"), std::string::npos) << all.output;
  size_t lines = 0, marked = 0;
  for (size_t at = 0; (at = all.output.find("\n  ", at)) != std::string::npos; ++at) ++lines;
  for (size_t at = 0; (at = all.output.find("<- chosen", at)) != std::string::npos; ++at) ++marked;
  EXPECT_EQ(lines, ranking.candidates.size()) << all.output;
  EXPECT_EQ(marked, 1u) << all.output;

  expect_usage_error({"gemm-choice"}, "gemm-choice: no shape (give --shape or --stdin)");
  expect_usage_error({"gemm-choice", "--shape", "M=5,N=3"}, "--shape 'M=5,N=3' needs M, N and K");
  expect_usage_error({"gemm-choice", "--shape", "M=5,N=3,K=7,layout=qq"}, "layout=qq is not one of nk, kn");
  auto bad = run_process({"/bin/sh", "-c", "printf '12 x 5\\n' | " + cli() + " gemm-choice --stdin"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("stdin line 1 '12 x 5': N=x is not an integer in [1, 2147483647]"), std::string::npos) << bad.output;
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
