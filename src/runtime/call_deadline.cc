#include "taxfree/runtime/call_deadline.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace taxfree {

CallDeadline::CallDeadline(CoordinatorClient& client, const std::string& call, double limit_s)
    : timer_([this, &client, call, limit_s] {
        std::unique_lock<std::mutex> lk(mu_);
        if (cv_.wait_for(lk, std::chrono::duration<double>(limit_s), [this] { return done_; })) return;
        const std::string why = call + " did not return within " + std::to_string(limit_s) + " s";
        std::fprintf(stderr, "[taxfree rank %d] %s; ending this process\n", client.rank(), why.c_str());
        std::fflush(stderr);
        client.fail(why);
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
