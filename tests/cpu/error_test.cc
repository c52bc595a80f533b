#include <gtest/gtest.h>
#include <nccl.h>

#include "taxfree/runtime/error.h"

namespace taxfree {
namespace {

TEST(Error, NamesFileLineRankAndValue) {
  set_error_rank(3);
  try {
    int m = 17;
    TF_REQUIRE(m % 2 == 0, Status::InvalidArgument, "M=" << m << " must be divisible by world size 2");
    FAIL() << "did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_EQ(e.rank(), 3);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("error_test.cc:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("M=17"), std::string::npos) << msg;
    EXPECT_NE(msg.find("invalid argument"), std::string::npos) << msg;
  }
  set_error_rank(-1);
}

TEST(Error, CudaAndNcclCodesMapToStatus) {
  // cudaErrorMemoryAllocation == 2, ncclInvalidUsage == 5.
  try {
    TF_CUDA(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::OutOfMemory);
    EXPECT_NE(std::string(e.what()).find("cudaErrorMemoryAllocation"), std::string::npos) << e.what();
  }
  try {
    TF_NCCL(5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidUsage);
  }
  // ncclRemoteError (6) is what this rank saw, not a failure another rank already reported: a
  // rank that sees it must report it, which it skips for RemoteError.
  static_assert(ncclRemoteError == 6);
  try {
    TF_NCCL(6);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::NcclError);
  }
}

}  // namespace
}  // namespace taxfree
