// The runtime's stream release hooks (runtime/stream_release.h): each registered hook runs once
// per release, in registration order, and one that throws neither escapes nor stops the others.
// The registry is process-wide: these hooks act only on the fake streams below.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "taxfree/runtime/stream_release.h"

namespace taxfree {
namespace {

std::vector<std::string> calls;
const auto kStream = reinterpret_cast<cudaStream_t>(0x5eed);
const auto kFailing = reinterpret_cast<cudaStream_t>(0xbad);

void first(cudaStream_t s) {
  if (s == kStream || s == kFailing) calls.push_back("first");
}
void failing(cudaStream_t s) {
  if (s == kFailing) throw std::runtime_error("hook failed on purpose");
  if (s == kStream) calls.push_back("failing");
}
void last(cudaStream_t s) {
  if (s == kStream || s == kFailing) calls.push_back("last");
}

TEST(StreamRelease, HooksRunOnceEachInOrderAndAFailureStopsNoneOfThem) {
  add_stream_release_hook(&first);
  add_stream_release_hook(&failing);
  add_stream_release_hook(&first);  // again: still one call
  add_stream_release_hook(&last);
  add_stream_release_hook(nullptr);  // ignored

  calls.clear();
  EXPECT_TRUE(run_stream_release_hooks(kStream));
  EXPECT_EQ(calls, (std::vector<std::string>{"first", "failing", "last"}));

  calls.clear();
  testing::internal::CaptureStderr();
  EXPECT_FALSE(run_stream_release_hooks(kFailing));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(calls, (std::vector<std::string>{"first", "last"}));
  EXPECT_NE(err.find("hook failed on purpose"), std::string::npos) << err;
  EXPECT_NE(err.find("0xbad"), std::string::npos) << err;  // names the stream
}

}  // namespace
}  // namespace taxfree
