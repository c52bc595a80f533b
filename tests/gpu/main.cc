// GPU test driver. Single process for now: drives GPU 0 (or reports every test skipped without one).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "gpu_env.h"

namespace taxfree::test {
int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
int world_size() { return visible_gpus() > 0 ? 1 : 0; }
int rank() { return 0; }
}  // namespace taxfree::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (taxfree::test::visible_gpus() > 0) cudaSetDevice(0);
  return RUN_ALL_TESTS();
}
