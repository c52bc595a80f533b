// CallDeadline: a deadline for a blocking host call that has none of its own.
//
// NCCL's communicator init, window registration and teardown, and a collective's first use of an
// algorithm (the connection setup blocks the host until the peers make the same call), wait for
// every rank without a time limit. A CallDeadline alive around such a call ends the process if the
// call has not returned within `limit_s`: it prints why on stderr, tells the coordinator (so every
// other rank stops too, naming this rank and the call) and exits with kExitFailed. It cannot
// interrupt the call, so ending the process is the only bounded way out. Destroying it (the call
// returned, or threw) disarms it.
//
// Cheap enough for every NCCL call (a lock, a map insert and erase; no thread of its own, and the
// watcher is woken only for a deadline earlier than the one it sleeps until): one watcher thread
// per process, started at the first CallDeadline and never joined, serves them all. Thread-safe;
// any number may be armed at once, from any threads; past several deadlines, the earliest is named.
#pragma once

#include <cstdint>
#include <string>

#include "taxfree/runtime/coordinator.h"

namespace taxfree {

inline constexpr double kCallDeadlineMaxS = 1e9;  // the longest limit a CallDeadline takes

class CallDeadline {
 public:
  // `client` must outlive this object. InvalidArgument unless `limit_s` is in (0, 1e9] s.
  CallDeadline(CoordinatorClient& client, std::string call, double limit_s);
  // Disarmed (does nothing, checks nothing) where `client` is null: a rank without a coordinator
  // (ranks simulated in one process, which have no NCCL).
  CallDeadline(CoordinatorClient* client, std::string call, double limit_s);
  ~CallDeadline();
  CallDeadline(const CallDeadline&) = delete;
  CallDeadline& operator=(const CallDeadline&) = delete;

 private:
  uint64_t id_ = 0;  // 0: disarmed
};

}  // namespace taxfree
