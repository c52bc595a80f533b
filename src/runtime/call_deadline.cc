#include "taxfree/runtime/call_deadline.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "taxfree/runtime/error.h"

namespace taxfree {
namespace {

using Clock = std::chrono::steady_clock;

struct Armed {
  Clock::time_point due;
  CoordinatorClient* client;
  std::string call;
  double limit_s;
};

// One thread sleeps until the earliest armed deadline. It is never joined (leaked with its state):
// a process may end with calls still armed, and exit must not wait for it.
class Watcher {
 public:
  Watcher() : thread_([this] { run(); }) { thread_.detach(); }

  uint64_t arm(CoordinatorClient* client, std::string call, double limit_s) {
    const auto due = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t id = ++next_id_;
    armed_.emplace(id, Armed{due, client, std::move(call), limit_s});
    if (due < wake_at_) cv_.notify_one();  // only a deadline before its wake-up needs the thread
    return id;
  }

  void disarm(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    armed_.erase(id);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      const Armed* first = nullptr;
      for (const auto& [id, a] : armed_)
        if (!first || a.due < first->due) first = &a;
      if (first && first->due <= Clock::now()) fire(*first);  // under the lock: the CallDeadline, and
                                                               // so its client, stay alive
      // A deadline disarmed meanwhile leaves a wake-up that finds nothing due: harmless.
      wake_at_ = first ? first->due : Clock::time_point::max();
      if (first) cv_.wait_until(lk, wake_at_);
      else cv_.wait(lk);
    }
  }

  [[noreturn]] static void fire(const Armed& a) {
    std::ostringstream why;
    why << a.call << " did not return within " << a.limit_s << " s";
    std::fprintf(stderr, "[taxfree rank %d] %s; ending this process\n", a.client->rank(), why.str().c_str());
    std::fflush(stderr);
    a.client->fail(why.str());
    // A moment for the coordinator to pass it on: under torchrun it is a thread of rank 0's.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::_exit(kExitFailed);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Armed> armed_;
  uint64_t next_id_ = 0;
  // When the sleeping thread wakes. It holds mu_ except while it sleeps, so an arm() never meets it
  // awake; before its first sleep it reads the map anyway (min: no notify needed).
  Clock::time_point wake_at_ = Clock::time_point::min();
  std::thread thread_;
};

Watcher& watcher() {
  static Watcher* w = new Watcher();  // leaked on purpose (see Watcher)
  return *w;
}

}  // namespace

CallDeadline::CallDeadline(CoordinatorClient& client, std::string call, double limit_s)
    : CallDeadline(&client, std::move(call), limit_s) {}

CallDeadline::CallDeadline(CoordinatorClient* client, std::string call, double limit_s) {
  if (client == nullptr) return;
  TF_REQUIRE(limit_s > 0 && limit_s <= kCallDeadlineMaxS, Status::InvalidArgument,
             "CallDeadline for " << call << ": limit " << limit_s << " s must be positive and at most "
                                 << kCallDeadlineMaxS);
  id_ = watcher().arm(client, std::move(call), limit_s);
}

CallDeadline::~CallDeadline() {
  if (id_ != 0) watcher().disarm(id_);
}

}  // namespace taxfree
