// CallDeadline: a deadline for a blocking call that has none of its own.
//
// NCCL's communicator init and window registration wait for every rank, without a time limit. A
// CallDeadline alive around such a call ends the process if the call has not returned within
// `limit_s`: it prints why on stderr, tells the coordinator (so every other rank stops too, naming
// this rank and the call) and exits with kExitFailed. It cannot interrupt the call, so ending the
// process is the only bounded way out. Destroying it (the call returned, or threw) disarms it.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "taxfree/runtime/coordinator.h"

namespace taxfree {

class CallDeadline {
 public:
  // `client` must outlive this object.
  CallDeadline(CoordinatorClient& client, const std::string& call, double limit_s);
  ~CallDeadline();
  CallDeadline(const CallDeadline&) = delete;
  CallDeadline& operator=(const CallDeadline&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread timer_;
};

}  // namespace taxfree
