#include "taxfree/runtime/launcher.h"

#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string_view>
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

// A signal's handler for a scope; the previous one comes back at its end, thrown or not.
class ScopedSignal {
 public:
  ScopedSignal(int sig, void (*handler)(int)) : sig_(sig) {
    struct sigaction sa{};
    sa.sa_handler = handler;
    ::sigaction(sig, &sa, &old_);
  }
  ~ScopedSignal() { ::sigaction(sig_, &old_, nullptr); }
  ScopedSignal(const ScopedSignal&) = delete;
  ScopedSignal& operator=(const ScopedSignal&) = delete;

 private:
  int sig_;
  struct sigaction old_{};
};

// waitpid() for at most `limit`; false if `pid` had not ended by then.
bool wait_until(pid_t pid, int* status, std::chrono::steady_clock::duration limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    const pid_t got = ::waitpid(pid, status, WNOHANG);
    if (got == pid || (got < 0 && errno != EINTR)) return got == pid;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// A rank's environment: the launcher's, with the rank's variables set. CUDA_MODULE_LOADING is
// EAGER unless the user chose otherwise: with lazy loading the first launch of a kernel waits for
// the device to go idle, which deadlocks (until a deadline) any kernel that waits for a
// concurrently launched one, and adds load time to first timed runs.
struct ChildEnv {
  ChildEnv(int rank, int world, const std::string& coordinator, const std::string& program) {
    const std::map<std::string, std::string> set = {
        {"RANK", std::to_string(rank)},           {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(rank)},     {"LOCAL_WORLD_SIZE", std::to_string(world)},
        {"TAXFREE_COORDINATOR", coordinator}};
    bool module_loading = false;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (set.count(key)) continue;
      module_loading |= key == "CUDA_MODULE_LOADING";
      vars.push_back(kv);
    }
    for (const auto& [key, value] : set) vars.push_back(key + "=" + value);
    if (!module_loading) vars.push_back("CUDA_MODULE_LOADING=EAGER");
    for (std::string& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    exec_failed = "[taxfree launcher] rank " + std::to_string(rank) + ": cannot exec " + program + ": ";
  }
  ChildEnv(const ChildEnv&) = delete;  // envp points into vars
  ChildEnv& operator=(const ChildEnv&) = delete;

  std::vector<std::string> vars;
  std::vector<char*> envp;  // into vars, null-terminated
  std::string exec_failed;  // the message's start, should execve fail
};

// write(2) until done or failed: the one output a forked child may still do.
void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(size_t(n));
  }
}

// The file execvp would run for `name`: `name` itself if it has a '/', else the first executable
// `PATH` entry (the C library's default path when PATH is unset). Throws InvalidArgument naming the
// program when there is none, before any rank starts.
std::string resolve_program(const std::string& name) {
  TF_REQUIRE(!name.empty(), Status::InvalidArgument, "no program to launch");
  auto runnable = [](const std::string& f) {
    struct stat st{};
    return ::stat(f.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(f.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    TF_REQUIRE(runnable(name), Status::InvalidArgument,
               "cannot exec " << name << ": " << (::access(name.c_str(), F_OK) != 0 ? std::strerror(errno)
                                                                                     : "not an executable file"));
    return name;
  }
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "/bin:/usr/bin";
  for (size_t begin = 0;;) {
    const size_t end = dirs.find(':', begin);
    const std::string dir = dirs.substr(begin, end - begin);
    const std::string file = (dir.empty() ? "." : dir) + "/" + name;
    if (runnable(file)) return file;
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  TF_THROW(Status::InvalidArgument, "cannot exec " << name << ": not found in PATH=" << dirs);
}

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
    env.launcher_coordinator = true;
    rank = parse_int(lookup, "RANK");
    world = parse_int(lookup, "WORLD_SIZE");
    local = parse_int(lookup, "LOCAL_RANK");
    TF_REQUIRE(rank && world, Status::InvalidArgument, "TAXFREE_COORDINATOR is set but RANK or WORLD_SIZE is not");
  } else {
    if ((rank = parse_int(lookup, "RANK"))) {  // WORLD_SIZE is required below, as MPI's size is
      world = parse_int(lookup, "WORLD_SIZE");
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
      // Half of torchrun's pair would otherwise start W single-process jobs on one GPU.
      TF_REQUIRE(!parse_int(lookup, "WORLD_SIZE"), Status::InvalidArgument, "WORLD_SIZE is set but RANK is not");
      return std::nullopt;
    }
    TF_REQUIRE(world, Status::InvalidArgument, rank_var << " is set but " << world_var << " is not");
    const char* addr = lookup("MASTER_ADDR");
    env.coordinator_host = (addr && *addr) ? addr : "127.0.0.1";
    // The coordinator listens on TAXFREE_COORDINATOR_PORT, else MASTER_PORT + 1 (MASTER_PORT is the
    // launcher's own store).
    auto master_port = parse_int(lookup, "MASTER_PORT");
    auto port = parse_int(lookup, "TAXFREE_COORDINATOR_PORT");
    if (port) {
      TF_REQUIRE(*port >= 1 && *port <= 65535, Status::InvalidArgument,
                 "TAXFREE_COORDINATOR_PORT=" << *port << " must be a port in [1, 65535]");
    } else if (master_port) {
      TF_REQUIRE(*master_port >= 1 && *master_port <= 65534, Status::InvalidArgument,
                 "MASTER_PORT=" << *master_port << " must be in [1, 65534]: the coordinator listens on MASTER_PORT + 1 "
                                   "(or set TAXFREE_COORDINATOR_PORT)");
    }
    env.coordinator_port = int(port ? *port : (master_port ? *master_port : 29500) + 1);
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

void default_multicast_off() {
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  ::setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
  ::setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 0);
}

std::string self_executable() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  TF_REQUIRE(n > 0, Status::SystemError, "readlink(/proc/self/exe): " << std::strerror(errno));
  return std::string(buf, size_t(n));
}

int probe_visible_gpus(const std::string& self_exe, std::string* why, double timeout_s) {
  const ScopedSignal child_default(SIGCHLD, SIG_DFL);  // an inherited SIG_IGN would reap it for us
  int pipefd[2];
  TF_REQUIRE(::pipe2(pipefd, O_CLOEXEC) == 0, Status::SystemError, "pipe(): " << std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    TF_THROW(Status::SystemError, "fork(): " << std::strerror(e));
  }
  if (pid == 0) {
    // The copy is not close-on-exec; both pipe ends are. (Started with stdout closed, the write end
    // may be fd 1 itself: then only its flag changes.)
    if (pipefd[1] == STDOUT_FILENO) ::fcntl(STDOUT_FILENO, F_SETFD, 0);
    else ::dup2(pipefd[1], STDOUT_FILENO);
    ::execl(self_exe.c_str(), self_exe.c_str(), "_probe-gpus", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  // CUDA's initialisation can hang on a wedged GPU or driver: the probe gets `timeout_s`.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                std::chrono::duration<double>(timeout_s));
  std::string out;
  bool answered = false;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{pipefd[0], POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = ::read(pipefd[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      answered = true;
      break;
    }
    out.append(buf, size_t(n));
  }
  ::close(pipefd[0]);
  if (!answered) ::kill(pid, SIGKILL);
  int status = 0;
  const bool reaped = wait_until(pid, &status, std::chrono::seconds(answered ? 60 : 5));
  if (!answered || !reaped) {
    if (!reaped) ::kill(pid, SIGKILL);
    if (why) {
      std::ostringstream os;
      os << "the GPU probe (" << self_exe << " _probe-gpus) " << (answered ? "did not exit" : "did not answer")
         << " within " << timeout_s << " s: is a GPU or the driver hung?";
      *why = os.str();
    }
    return 0;
  }
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
  const std::string program = resolve_program(spec.argv[0]);
  CoordinatorServer server("127.0.0.1", 0, spec.nranks);
  const std::string coord = "127.0.0.1:" + std::to_string(server.port());

  const ScopedSignal interrupt(SIGINT, on_interrupt), terminate(SIGTERM, on_interrupt);
  // Ranks must stay ours to reap: with an inherited SIG_IGN the kernel reaps them and waitpid
  // would never report them (the loop below would wait forever).
  const ScopedSignal child_default(SIGCHLD, SIG_DFL);

  std::vector<char*> args;
  for (const auto& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();

  std::vector<pid_t> pids(size_t(spec.nranks), -1);
  for (int r = 0; r < spec.nranks; ++r) {
    // Everything the child needs is built before the fork: the coordinator's thread runs in this
    // process, so between fork() and exec the child may only call async-signal-safe functions (no
    // malloc, setenv or stdio: a lock another thread held at the fork would stay held).
    const ChildEnv child(r, spec.nranks, coord, program);
    pid_t pid = ::fork();
    if (pid < 0) {  // no half-started job: the ranks already started go too
      const int e = errno;
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL), wait_until(p, nullptr, std::chrono::seconds(5));
      TF_THROW(Status::SystemError, "fork() for rank " << r << ": " << std::strerror(e));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher that dies takes its ranks with it
      if (::getppid() != parent) ::_exit(kExitRemote);
      ::execve(program.c_str(), args.data(), child.envp.data());
      const char* what = ::strerrordesc_np(errno);  // a constant string: safe here, unlike strerror
      // One write of at most PIPE_BUF bytes: the line stays whole beside other ranks' lines.
      char line[PIPE_BUF];
      size_t n = 0;
      for (std::string_view part : {std::string_view(child.exec_failed), std::string_view(what ? what : "unknown error")})
        for (char ch : part)
          if (n < sizeof line - 1) line[n++] = ch;
      line[n++] = '\n';
      write_all(STDERR_FILENO, std::string_view(line, n));
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
  const auto fail = [&](int c) {
    if (code == kExitOk || (code == kExitRemote && c != kExitRemote)) code = c;
    if (!failing) failing = true, failed_at = Clock::now();
  };
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
      if (!failing) server.rank_ended_abnormally(r, how, WIFEXITED(status));
      fail(exit_code_of(status));
      continue;
    }
    if (pid < 0 && errno == ECHILD) {  // reaped by someone else (the SIGCHLD disposition changed?)
      ended.push_back(std::to_string(alive) + " rank(s) ended unseen: their exit status is unknown");
      fail(kExitFailed);
      break;
    }
    if (g_interrupted && !failing) {
      ended.push_back(std::string("launcher interrupted by ") + ::strsignal(g_interrupted));
      fail(128 + g_interrupted);
      failed_at -= std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec.grace_s));
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
      } else if (kill_stage == 2 && since > spec.grace_s + 13) {  // unkillable (stuck in the kernel)
        for (int r = 0; r < spec.nranks; ++r)
          if (pids[size_t(r)] > 0)
            ended.push_back("rank " + std::to_string(r) + " (pid " + std::to_string(pids[size_t(r)]) +
                            ") did not end 10 s after SIGKILL (stuck in the driver?); left behind");
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  if (failing) {
    const std::string cause = server.first_failure();
    std::cerr << "[taxfree launcher] job failed" << (cause.empty() ? "" : ": " + cause) << "\n";
    for (const auto& e : ended) std::cerr << "[taxfree launcher]   " << e << "\n";
    return code != kExitOk ? code : kExitFailed;
  }
  return kExitOk;
}

}  // namespace taxfree
