#include "taxfree/runtime/stream_release.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "taxfree/runtime/error.h"

namespace taxfree {
namespace {
struct Hooks {
  std::mutex mu;
  std::vector<StreamReleaseHook> list;
};
Hooks& hooks() {
  static Hooks h;
  return h;
}
}  // namespace

void add_stream_release_hook(StreamReleaseHook hook) {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  if (hook && std::find(h.list.begin(), h.list.end(), hook) == h.list.end()) h.list.push_back(hook);
}

bool run_stream_release_hooks(cudaStream_t stream) noexcept {
  std::vector<StreamReleaseHook> list;
  {
    Hooks& h = hooks();
    std::lock_guard<std::mutex> lock(h.mu);
    list = h.list;  // a hook may register another: run a copy outside the lock
  }
  bool ok = true;
  const auto report = [&](const char* what) {
    const std::string who = error_rank() >= 0 ? " rank " + std::to_string(error_rank()) : "";
    std::fprintf(stderr, "[taxfree%s] releasing what stream %p held failed: %s\n", who.c_str(),
                 static_cast<void*>(stream), what);
    ok = false;
  };
  for (StreamReleaseHook hook : list) {
    try {
      hook(stream);
    } catch (const std::exception& e) {
      report(e.what());
    } catch (...) {
      report("unknown exception");
    }
  }
  return ok;
}

}  // namespace taxfree
