// The launcher and the coordinator with ranks that do no CUDA work: every way a rank can end, and
// how fast and how clearly the others learn of it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "taxfree/runtime/coordinator.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/launcher.h"
#include "taxfree/runtime/team.h"
#include "expect_error.h"
#include "test_process.h"

namespace taxfree {
namespace {

using test::cli;
using test::run_process;

EnvLookup env_of(std::map<std::string, std::string> m) {
  auto owned = std::make_shared<std::map<std::string, std::string>>(std::move(m));
  return [owned](const char* k) -> const char* {
    auto it = owned->find(k);
    return it == owned->end() ? nullptr : it->second.c_str();
  };
}

TEST(RankEnv, NoLauncherVariablesMeansSingleProcess) { EXPECT_FALSE(rank_env(env_of({})).has_value()); }

TEST(RankEnv, TaxfreeLauncher) {
  auto e = rank_env(env_of({{"TAXFREE_COORDINATOR", "127.0.0.1:4567"}, {"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->world, 4);
  EXPECT_EQ(e->local_rank, 2);
  EXPECT_EQ(e->coordinator_host, "127.0.0.1");
  EXPECT_EQ(e->coordinator_port, 4567);
  EXPECT_FALSE(e->host_coordinator);
  EXPECT_TRUE(e->launcher_coordinator);  // it outlives the rank's Teams: they may join one after another
}

TEST(RankEnv, TorchrunUsesMasterPortPlusOneAndRankZeroHosts) {
  auto e = rank_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "10.0.0.1"},
                            {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->coordinator_host, "10.0.0.1");
  EXPECT_EQ(e->coordinator_port, 29501);
  EXPECT_TRUE(e->host_coordinator);
  EXPECT_FALSE(e->launcher_coordinator);
  auto e3 = rank_env(env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"TAXFREE_COORDINATOR_PORT", "4000"}}));
  ASSERT_TRUE(e3);
  EXPECT_EQ(e3->coordinator_port, 4000);
  EXPECT_EQ(e3->local_rank, 3);  // LOCAL_RANK defaults to RANK
  EXPECT_FALSE(e3->host_coordinator);
  EXPECT_FALSE(e3->launcher_coordinator);
}

// A Team's deadline and heap from its options and the environment, checked before anything starts:
// NaN, inf, 0 and values whose conversion to integer nanoseconds or bytes would overflow are refused.
TEST(TeamLimits, DeadlineAndHeapFromOptionsAndEnvironment) {
  TeamOptions o;
  EXPECT_EQ(team_timeout_s(o, env_of({})), 10.0);
  EXPECT_EQ(team_timeout_s(o, env_of({{"TAXFREE_TIMEOUT_S", "60"}})), 60.0);
  EXPECT_EQ(team_heap_bytes(o, 8, env_of({})), 10ull << 30);
  EXPECT_EQ(team_heap_bytes(o, 1, env_of({})), 4ull << 30);
  EXPECT_EQ(team_heap_bytes(o, 2, env_of({{"TAXFREE_HEAP_BYTES", "3e9"}})), 3'000'000'000ull);
  for (const char* bad : {"nan", "inf", "0", "-1", "2e10", "1e400", "10s"})
    test::expect_error([&] { team_timeout_s(o, env_of({{"TAXFREE_TIMEOUT_S", bad}})); }, Status::InvalidArgument,
                       "TAXFREE_TIMEOUT_S");
  for (const char* bad : {"nan", "inf", "1e300", "1000", "4GiB", "1048576.5", "20971525e-1"})
    test::expect_error([&] { team_heap_bytes(o, 2, env_of({{"TAXFREE_HEAP_BYTES", bad}})); }, Status::InvalidArgument,
                       "TAXFREE_HEAP_BYTES");
  o.timeout_s = 2.5;
  EXPECT_EQ(team_timeout_s(o, env_of({{"TAXFREE_TIMEOUT_S", "nan"}})), 2.5);  // the option wins
  for (double bad : {0.0, std::nan(""), 1e12})
    o.timeout_s = bad, test::expect_error([&] { team_timeout_s(o, env_of({})); }, Status::InvalidArgument,
                                          "TeamOptions::timeout_s");
  o.heap_bytes = 1000;
  test::expect_error([&] { team_heap_bytes(o, 2, env_of({})); }, Status::InvalidArgument, "TeamOptions::heap_bytes");
  o.timeout_s = 2.5;
  for (double bad : {0.0, std::nan(""), HUGE_VAL, 1e7})
    o.bootstrap_timeout_s = bad, test::expect_error([&] { team_timeout_s(o, env_of({})); }, Status::InvalidArgument,
                                                    "TeamOptions::bootstrap_timeout_s");
  o.bootstrap_timeout_s = 120;
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL, 1e7})
    o.nccl_call_timeout_s = bad, test::expect_error([&] { team_timeout_s(o, env_of({})); }, Status::InvalidArgument,
                                                    "TeamOptions::nccl_call_timeout_s");
}

TEST(RankEnv, OpenMpiAndMpich) {
  auto o = rank_env(env_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  ASSERT_TRUE(o);
  EXPECT_EQ(o->world, 3);
  EXPECT_NE(o->source.find("Open MPI"), std::string::npos);
  auto m = rank_env(env_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->world, 2);
}

void expect_invalid(std::map<std::string, std::string> env, const std::string& needle) {
  try {
    rank_env(env_of(env));
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RankEnv, BadValuesNameTheVariable) {
  expect_invalid({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, "RANK='abc' is not an integer");
  expect_invalid({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 must be in [0, WORLD_SIZE=2)");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 must be >= 1");
  expect_invalid({{"OMPI_COMM_WORLD_RANK", "0"}}, "OMPI_COMM_WORLD_SIZE is not");
  // Half of torchrun's pair is an error, not W single-process jobs on one GPU.
  expect_invalid({{"RANK", "1"}}, "RANK is set but WORLD_SIZE is not");
  expect_invalid({{"WORLD_SIZE", "4"}}, "WORLD_SIZE is set but RANK is not");
  expect_invalid({{"RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
                 "RANK is set but WORLD_SIZE is not");
  expect_invalid({{"TAXFREE_COORDINATOR", "nohost"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}}, "must be host:port");
  // The coordinator's port is MASTER_PORT + 1: the message names the variable and its value.
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "65535"}},
                 "MASTER_PORT=65535 must be in [1, 65534]: the coordinator listens on MASTER_PORT + 1");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "2147483647"}}, "MASTER_PORT=2147483647 must be");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}, "MASTER_PORT=0 must be");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}, {"TAXFREE_COORDINATOR_PORT", "65536"}},
                 "TAXFREE_COORDINATOR_PORT=65536 must be a port in [1, 65535]");
  EXPECT_EQ(rank_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "65534"}}))->coordinator_port, 65535);
  EXPECT_EQ(rank_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "65535"},
                             {"TAXFREE_COORDINATOR_PORT", "65535"}}))->coordinator_port, 65535);
}

// ---- whole jobs through `taxfree run` ----------------------------------------------------------

std::vector<std::string> selftest_job(int n, int fail_rank, const std::string& mode) {
  return {cli(), "run", "-n", std::to_string(n), "--", cli(), "_rank-selftest", "--fail-rank",
          std::to_string(fail_rank), "--mode", mode};
}

TEST(Launcher, AllRanksFinish) {
  auto r = run_process(selftest_job(4, -1, "ok"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int i = 0; i < 4; ++i) EXPECT_NE(r.output.find("rank " + std::to_string(i) + " done"), std::string::npos) << r.output;
}

TEST(Launcher, EachRankGetsItsVariablesAndTheLaunchersEnvironment) {
  // `sh` is found through PATH; each rank prints what it was given, on one line.
  const std::string script =
      "echo \"got rank=$RANK/$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE coord=${TAXFREE_COORDINATOR%%:*} "
      "loading=$CUDA_MODULE_LOADING keep=$TAXFREE_TEST_KEEP\"";
  auto r = run_process({cli(), "run", "-n", "3", "--", "sh", "-c", script},
                       {{"TAXFREE_TEST_KEEP", "kept"}, {"RANK", "9"}, {"WORLD_SIZE", "9"}});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int i = 0; i < 3; ++i) {
    const std::string want = "got rank=" + std::to_string(i) + "/3 local=" + std::to_string(i) +
                             "/3 coord=127.0.0.1 loading=EAGER keep=kept";
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
  // A user's choice of module loading is kept.
  auto lazy = run_process({cli(), "run", "-n", "2", "--", "sh", "-c", "echo \"loading=$CUDA_MODULE_LOADING\""},
                          {{"CUDA_MODULE_LOADING", "LAZY"}});
  EXPECT_EQ(lazy.exit_code, 0) << lazy.output;
  EXPECT_NE(lazy.output.find("loading=LAZY"), std::string::npos) << lazy.output;
  EXPECT_EQ(lazy.output.find("loading=EAGER"), std::string::npos) << lazy.output;
}

TEST(Launcher, ProgramNotFoundFailsBeforeAnyRankStarts) {
  auto r = run_process({cli(), "run", "-n", "4", "--", "taxfree-no-such-program"}, {{"PATH", "/usr/bin:/bin"}});
  EXPECT_EQ(r.exit_code, kExitUsage) << r.output;
  EXPECT_NE(r.output.find("cannot exec taxfree-no-such-program: not found in PATH=/usr/bin:/bin"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("[taxfree launcher] rank"), std::string::npos) << r.output;  // no rank started
  auto dir = run_process({cli(), "run", "-n", "2", "--", "/"});
  EXPECT_EQ(dir.exit_code, kExitUsage) << dir.output;
  EXPECT_NE(dir.output.find("cannot exec /: not an executable file"), std::string::npos) << dir.output;
}

// An executable file with `text` in the test's temporary folder, removed when this goes.
struct ExecutableFile {
  std::string path;
  ExecutableFile(const std::string& name, const std::string& text) : path(::testing::TempDir() + name) {
    std::ofstream(path) << text;
    EXPECT_EQ(::chmod(path.c_str(), 0755), 0) << path;
  }
  ~ExecutableFile() { std::remove(path.c_str()); }
};

TEST(Launcher, ExecFailingInARankNamesTheRankAndTheCause) {
  // Executable but in no format the kernel runs (no "#!"): execve fails in every child, which can
  // then only write(2) its message and exit 127.
  const ExecutableFile file("taxfree_not_a_program", "not a program\n");
  const std::string& path = file.path;
  auto r = run_process({cli(), "run", "-n", "2", "--", path});
  EXPECT_EQ(r.exit_code, 127) << r.output;
  for (int i = 0; i < 2; ++i)
    EXPECT_NE(r.output.find("[taxfree launcher] rank " + std::to_string(i) + ": cannot exec " + path + ": Exec format error"),
              std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 127"), std::string::npos) << r.output;
}

TEST(Launcher, IgnoredSigchldDoesNotHangTheLauncher) {
  // An ignored SIGCHLD survives exec (some job runners leave it so): the kernel would then reap the
  // ranks itself and the launcher would wait for them forever.
  auto r = run_process({"/bin/sh", "-c", "trap '' CHLD; exec \"$0\" run -n 2 -- sh -c 'exit 0'", cli()}, {}, 30);
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto failing = run_process({"/bin/sh", "-c", "trap '' CHLD; exec \"$0\" run -n 2 -- sh -c 'exit 7'", cli()}, {}, 30);
  EXPECT_FALSE(failing.timed_out) << failing.output;
  EXPECT_EQ(failing.exit_code, 7) << failing.output;
}

TEST(Launcher, GpuProbeThatHangsIsKilledAtItsDeadline) {
  // Stands in for a probe stuck in CUDA's initialisation on a wedged GPU.
  const ExecutableFile probe("taxfree_hung_probe", "#!/bin/sh\nexec sleep 600\n");
  std::string why;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(probe_visible_gpus(probe.path, &why, 0.5), 0);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 5.0);
  EXPECT_NE(why.find("did not answer within 0.5 s"), std::string::npos) << why;
}

TEST(Launcher, RankExitingNonZeroEndsTheJobNamingIt) {
  auto r = run_process(selftest_job(3, 1, "exit"));
  EXPECT_EQ(r.exit_code, 7) << r.output;  // the failing rank's own code
  EXPECT_LT(r.seconds, 10);
  EXPECT_NE(r.output.find("job failed: rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 7"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("done"), std::string::npos) << "no rank may pass the final barrier: " << r.output;
}

TEST(Launcher, KilledRankEndsTheJobNamingIt) {
  auto r = run_process(selftest_job(3, 2, "kill"));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_LT(r.seconds, 10);
  EXPECT_NE(r.output.find("rank 2 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 9"), std::string::npos) << r.output;
  // Survivors stop with "remote failure", naming the dead rank.
  EXPECT_NE(r.output.find("rank 2 failed"), std::string::npos) << r.output;
}

TEST(Launcher, ReportedErrorReachesEveryRank) {
  auto r = run_process(selftest_job(3, 0, "error"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 10);
  EXPECT_NE(r.output.find("[taxfree rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[taxfree rank 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 failed: injected error in rank 0"), std::string::npos) << r.output;
}

TEST(Launcher, HungRankIsNamedWhenTheOthersTimeOut) {
  // The others wait 10 s at a host barrier, then the job ends naming the rank that never came.
  auto r = run_process(selftest_job(3, 1, "hang"), {}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_LT(r.seconds, 30);
  EXPECT_NE(r.output.find("rank(s) 1 never arrived"), std::string::npos) << r.output;
}

TEST(Launcher, NonZeroExitAfterFinishingFailsTheJobWithoutAbortingFinishedPeers) {
  auto r = run_process(selftest_job(3, 1, "finish-exit"));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("job failed: rank 1: rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 5"), std::string::npos) << r.output;
  for (int rank : {0, 1, 2}) EXPECT_NE(r.output.find("rank " + std::to_string(rank) + " done"), std::string::npos);
  EXPECT_EQ(r.output.find("was told to abort"), std::string::npos) << r.output;
}

TEST(Launcher, StalledCallEndsItsRankAtTheCallDeadlineAndTheJobNamesIt) {
  // A call that never returns, under a 1 s CallDeadline (what guards NCCL's init in a Team), armed
  // inside another call's 100 s one: the process ends at the earlier deadline.
  auto r = run_process(selftest_job(3, 2, "stall"), {}, 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;  // not the others' 10 s barrier timeout
  EXPECT_NE(r.output.find("[taxfree rank 2] a stalled call did not return within 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("job failed: rank 2: a stalled call did not return"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 2 failed"), std::string::npos) << r.output;  // the others are told
  EXPECT_EQ(r.output.find("done"), std::string::npos) << r.output;
}

// ---- ranks started by another launcher (torchrun/mpirun style environment) ---------------------

// Rank r's log of one of the tests below; the test process's pid in the name, so two test runs at
// once (ctest -j, two checkouts) do not read each other's logs.
std::string joined_log(const std::string& test, int r) {
  return "/tmp/taxfree-" + test + "-" + std::to_string(::getpid()) + "-" + std::to_string(r) + ".log";
}

// The text of rank `read`'s log; removes the logs of ranks [0, ranks).
std::string take_joined_logs(const std::string& test, int ranks, int read) {
  std::ifstream log(joined_log(test, read));
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  for (int r = 0; r < ranks; ++r) std::remove(joined_log(test, r).c_str());
  return text;
}

TEST(JoinedRanks, KilledRankEndsTheOthersWithItsName) {
  const int port = test::free_port();
  std::vector<int> pids;
  for (int r = 0; r < 3; ++r)
    pids.push_back(test::spawn_process(
        {cli(), "_rank-selftest", "--fail-rank", "1", "--mode", "kill"},
        {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"},
         {"MASTER_PORT", std::to_string(port - 1)}},
        joined_log("joined", r)));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> codes;
  for (int pid : pids) codes.push_back(test::wait_process(pid, 30));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_EQ(codes[0], 3) << "remote failure";
  EXPECT_EQ(codes[2], 3) << "remote failure";
  EXPECT_LT(took, 10);
  const std::string text = take_joined_logs("joined", 3, 2);
  EXPECT_NE(text.find("rank 1 failed"), std::string::npos) << text;
}

TEST(JoinedRanks, LosingTheCoordinatorHostEndsTheOthers) {
  const int port = test::free_port();
  std::vector<int> pids;
  for (int r = 0; r < 2; ++r)
    pids.push_back(test::spawn_process({cli(), "_rank-selftest", "--fail-rank", "0", "--mode", "kill"},
                                       {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"},
                                        {"TAXFREE_COORDINATOR_PORT", std::to_string(port)}},
                                       joined_log("joined-host", r)));
  EXPECT_EQ(test::wait_process(pids[0], 30), 128 + SIGKILL);
  EXPECT_EQ(test::wait_process(pids[1], 30), 3);
  const std::string text = take_joined_logs("joined-host", 2, 1);
  EXPECT_NE(text.find("lost the connection to the coordinator"), std::string::npos) << text;
}

}  // namespace
}  // namespace taxfree
