// Running a child process from a CPU test: command line, extra environment, captured output,
// exit code and wall time, with a hard time limit so a broken launcher fails the test, not CI.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace taxfree::test {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal if killed
  std::string output;  // stdout and stderr together
  double seconds = 0;
  bool timed_out = false;
};

// Runs `argv` with `env` added to this process's environment; kills it after `limit_s`.
ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                          double limit_s = 60);

// Starts `argv` without waiting; returns its pid. Output goes to the file `log`.
int spawn_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  const std::string& log);
// Waits for `pid` up to `limit_s`; returns its exit code (128 + signal), or -1 after killing it.
int wait_process(int pid, double limit_s);

// The taxfree CLI built alongside the tests.
std::string cli();

// A TCP port that was free a moment ago on 127.0.0.1.
int free_port();

}  // namespace taxfree::test
