#include "taxfree/runtime/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "taxfree/runtime/coordinator.h"
#include "taxfree/runtime/error.h"

extern char** environ;

namespace taxfree {

namespace {

std::optional<long> parse_int(const EnvLookup& lookup, const char* name) {
  const char* v = lookup(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  TF_REQUIRE(errno == 0 && end != v && *end == '\0' && x >= INT_MIN && x <= INT_MAX, Status::InvalidArgument,
             "environment variable " << name << "='" << v << "' is not an integer");
  return x;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return "ended with status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitFailed;
}

volatile sig_atomic_t g_interrupted = 0;
void on_interrupt(int sig) { g_interrupted = sig; }

}  // namespace

std::optional<RankEnv> rank_env(const EnvLookup& lookup) {
  RankEnv env;
  std::optional<long> rank, world, local;
  const char *rank_var = "RANK", *world_var = "WORLD_SIZE";
  if (const char* coord = lookup("TAXFREE_COORDINATOR"); coord != nullptr && *coord != '\0') {
    std::string c = coord;
    auto colon = c.rfind(':');
    TF_REQUIRE(colon != std::string::npos && colon > 0, Status::InvalidArgument,
               "TAXFREE_COORDINATOR='" << c << "' must be host:port");
    env.coordinator_host = c.substr(0, colon);
    auto port = parse_int([&](const char*) { return coord + colon + 1; }, "TAXFREE_COORDINATOR port");
    TF_REQUIRE(port && *port > 0 && *port < 65536, Status::InvalidArgument,
               "TAXFREE_COORDINATOR='" << c << "' has no valid port");
    env.coordinator_port = int(*port);
    env.source = "taxfree launcher";
    rank = parse_int(lookup, "RANK");
    world = parse_int(lookup, "WORLD_SIZE");
    local = parse_int(lookup, "LOCAL_RANK");
    TF_REQUIRE(rank && world, Status::InvalidArgument, "TAXFREE_COORDINATOR is set but RANK or WORLD_SIZE is not");
  } else {
    if ((rank = parse_int(lookup, "RANK")) && (world = parse_int(lookup, "WORLD_SIZE"))) {
      local = parse_int(lookup, "LOCAL_RANK");
      env.source = "RANK/WORLD_SIZE (torchrun or user)";
    } else if ((rank = parse_int(lookup, "OMPI_COMM_WORLD_RANK"))) {
      rank_var = "OMPI_COMM_WORLD_RANK", world_var = "OMPI_COMM_WORLD_SIZE";
      world = parse_int(lookup, world_var);
      local = parse_int(lookup, "OMPI_COMM_WORLD_LOCAL_RANK");
      env.source = "Open MPI (OMPI_COMM_WORLD_*)";
    } else if ((rank = parse_int(lookup, "PMI_RANK"))) {
      rank_var = "PMI_RANK", world_var = "PMI_SIZE";
      world = parse_int(lookup, world_var);
      local = parse_int(lookup, "MPI_LOCALRANKID");
      env.source = "MPICH (PMI_RANK/PMI_SIZE)";
    } else {
      return std::nullopt;
    }
    TF_REQUIRE(world, Status::InvalidArgument, rank_var << " is set but " << world_var << " is not");
    const char* addr = lookup("MASTER_ADDR");
    env.coordinator_host = (addr && *addr) ? addr : "127.0.0.1";
    auto master_port = parse_int(lookup, "MASTER_PORT");
    auto port = parse_int(lookup, "TAXFREE_COORDINATOR_PORT");
    env.coordinator_port = int(port ? *port : (master_port ? *master_port : 29500) + 1);
    TF_REQUIRE(env.coordinator_port > 0 && env.coordinator_port < 65536, Status::InvalidArgument,
               "coordinator port " << env.coordinator_port << " (from MASTER_PORT/TAXFREE_COORDINATOR_PORT) is out of range");
    env.host_coordinator = (*rank == 0);
  }
  TF_REQUIRE(*world >= 1, Status::InvalidArgument, world_var << "=" << *world << " must be >= 1");
  TF_REQUIRE(*rank >= 0 && *rank < *world, Status::InvalidArgument,
             rank_var << "=" << *rank << " must be in [0, " << world_var << "=" << *world << ")");
  env.rank = int(*rank);
  env.world = int(*world);
  env.local_rank = int(local ? *local : *rank);
  TF_REQUIRE(env.local_rank >= 0, Status::InvalidArgument, "LOCAL_RANK=" << env.local_rank << " must be >= 0");
  return env;
}

std::optional<RankEnv> rank_env() {
  return rank_env([](const char* n) -> const char* { return std::getenv(n); });
}

std::string self_executable() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  TF_REQUIRE(n > 0, Status::SystemError, "readlink(/proc/self/exe): " << std::strerror(errno));
  return std::string(buf, size_t(n));
}

int probe_visible_gpus(const std::string& self_exe, std::string* why) {
  int pipefd[2];
  TF_REQUIRE(::pipe(pipefd) == 0, Status::SystemError, "pipe(): " << std::strerror(errno));
  pid_t pid = ::fork();
  TF_REQUIRE(pid >= 0, Status::SystemError, "fork(): " << std::strerror(errno));
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    ::execl(self_exe.c_str(), self_exe.c_str(), "_probe-gpus", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) out.append(buf, size_t(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  int count = 0;
  std::string reason;
  auto sp = out.find(' ');
  count = std::atoi(out.substr(0, sp).c_str());
  if (sp != std::string::npos) reason = out.substr(sp + 1);
  while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    count = 0;
    if (reason.empty()) reason = "the GPU probe " + describe_status(status);
  }
  if (why) *why = reason;
  return count;
}

int run_ranks(const LaunchSpec& spec) {
  TF_REQUIRE(spec.nranks >= 1, Status::InvalidArgument, "number of ranks " << spec.nranks << " must be >= 1");
  TF_REQUIRE(!spec.argv.empty(), Status::InvalidArgument, "no program to launch");
  CoordinatorServer server("127.0.0.1", 0, spec.nranks);
  const std::string coord = "127.0.0.1:" + std::to_string(server.port());

  struct sigaction sa{};
  sa.sa_handler = on_interrupt;
  struct sigaction old_int{}, old_term{};
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);

  std::vector<char*> args;
  for (const auto& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();

  std::vector<pid_t> pids(size_t(spec.nranks), -1);
  for (int r = 0; r < spec.nranks; ++r) {
    pid_t pid = ::fork();
    TF_REQUIRE(pid >= 0, Status::SystemError, "fork() for rank " << r << ": " << std::strerror(errno));
    if (pid == 0) {
      // The child only sets its environment and execs: nothing here touches CUDA.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher that dies takes its ranks with it
      if (::getppid() != parent) ::_exit(kExitRemote);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(spec.nranks).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(spec.nranks).c_str(), 1);
      ::setenv("TAXFREE_COORDINATOR", coord.c_str(), 1);
      // Eager module loading unless the user chose otherwise: with lazy loading the first launch of
      // a kernel waits for the device to go idle, which deadlocks (until a deadline) any kernel that
      // waits for a concurrently launched one, and adds load time to first timed runs.
      ::setenv("CUDA_MODULE_LOADING", "EAGER", 0);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "[taxfree launcher] rank %d: cannot exec %s: %s\n", r, args[0], std::strerror(errno));
      ::_exit(127);
    }
    pids[size_t(r)] = pid;
  }

  using Clock = std::chrono::steady_clock;
  int alive = spec.nranks;
  bool failing = false;
  int code = kExitOk;  // the first non-"remote" failure code wins: it names the cause
  std::vector<std::string> ended;  // abnormal endings, in order
  Clock::time_point failed_at{};
  int kill_stage = 0;
  while (alive > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      int r = -1;
      for (int i = 0; i < spec.nranks; ++i)
        if (pids[size_t(i)] == pid) r = i;
      if (r < 0) continue;
      pids[size_t(r)] = -1;
      --alive;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      const std::string how = "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") " + describe_status(status);
      ended.push_back(how);
      const int c = exit_code_of(status);
      if (code == kExitOk || (code == kExitRemote && c != kExitRemote)) code = c;
      if (!failing) {
        failing = true;
        failed_at = Clock::now();
        server.rank_ended_abnormally(r, how);
      }
      continue;
    }
    if (g_interrupted && !failing) {
      failing = true;
      code = 128 + g_interrupted;
      ended.push_back(std::string("launcher interrupted by ") + ::strsignal(g_interrupted));
      failed_at = Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec.grace_s));
    }
    if (failing) {
      double since = std::chrono::duration<double>(Clock::now() - failed_at).count();
      if (kill_stage == 0 && since > spec.grace_s) {
        for (pid_t p : pids)
          if (p > 0) ::kill(p, SIGTERM);
        kill_stage = 1;
      } else if (kill_stage == 1 && since > spec.grace_s + 3) {
        for (pid_t p : pids)
          if (p > 0) ::kill(p, SIGKILL);
        kill_stage = 2;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);

  if (failing) {
    const std::string cause = server.first_failure();
    std::cerr << "[taxfree launcher] job failed" << (cause.empty() ? "" : ": " + cause) << "\n";
    for (const auto& e : ended) std::cerr << "[taxfree launcher]   " << e << "\n";
    return code != kExitOk ? code : kExitFailed;
  }
  return kExitOk;
}

}  // namespace taxfree
