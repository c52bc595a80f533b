#include "taxfree/runtime/call_deadline.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sstream>

namespace taxfree {

CallDeadline::CallDeadline(CoordinatorClient& client, const std::string& call, double limit_s)
    : timer_([this, &client, call, limit_s] {
        std::unique_lock<std::mutex> lk(mu_);
        if (cv_.wait_for(lk, std::chrono::duration<double>(limit_s), [this] { return done_; })) return;
        std::ostringstream why;
        why << call << " did not return within " << limit_s << " s";
        std::fprintf(stderr, "[taxfree rank %d] %s; ending this process\n", client.rank(), why.str().c_str());
        std::fflush(stderr);
        client.fail(why.str());
        // A moment for the coordinator to pass it on: under torchrun it is a thread of rank 0's.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ::_exit(kExitFailed);
      }) {}

CallDeadline::~CallDeadline() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
  }
  cv_.notify_all();
  timer_.join();
}

}  // namespace taxfree
