#include "test_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace taxfree::test {

namespace {
std::vector<char*> c_args(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

int child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, int out_fd) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group, so a timeout kills the ranks it starts too
    ::dup2(out_fd, 1);
    ::dup2(out_fd, 2);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    auto args = c_args(argv);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}
}  // namespace

int spawn_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  const std::string& log) {
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int pid = child(argv, env, fd);
  ::close(fd);
  return pid;
}

int wait_process(int pid, double limit_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return decode_status(status);
}

ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                          double limit_s) {
  char path[] = "/tmp/taxfree-test-XXXXXX";
  int fd = ::mkstemp(path);
  const auto t0 = std::chrono::steady_clock::now();
  int pid = child(argv, env, fd);
  ::close(fd);
  ProcessResult r;
  r.exit_code = wait_process(pid, limit_s);
  r.timed_out = r.exit_code == -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  ::unlink(path);
  return r;
}

std::string cli() { return TAXFREE_CLI_PATH; }

int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

}  // namespace taxfree::test
