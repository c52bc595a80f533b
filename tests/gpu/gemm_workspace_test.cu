// GPU test of the GEMMs' stream workspace (gemm_detail.h): a launch prepared on a stream
// (gemm::prepare, cublaslt_prepare) needs no device memory, so a fused op that prepares its GEMMs
// before enqueuing anything cannot fail half-way for want of memory. Checked with the device's
// memory exhausted: unprepared streams fail with OutOfMemory, the prepared one runs and is right;
// then release_stream_workspace gives the memory back.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gemm_test_util.h"
#include "gpu_env.h"
#include "taxfree/ops/cublaslt_gemm.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/runtime/error.h"

namespace taxfree::gemm {
namespace {

using namespace test;

// Takes all device memory it can get, in halving chunks down to 1 MiB; gives it back when destroyed.
class MemoryHog {
 public:
  MemoryHog() {
    int dev = 0;
    TF_CUDA(cudaGetDevice(&dev));
    cudaMemPool_t pool;
    TF_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
    TF_CUDA(cudaDeviceSynchronize());
    TF_CUDA(cudaMemPoolTrimTo(pool, 0));  // no free block left in the pool for an async allocation
    for (size_t bytes = size_t(1) << 36; bytes >= (size_t(1) << 20);) {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) == cudaSuccess) {
        chunks_.push_back(p);
      } else {
        (void)cudaGetLastError();
        bytes /= 2;
      }
    }
  }
  ~MemoryHog() {
    for (void* p : chunks_) cudaFree(p);
  }
  MemoryHog(const MemoryHog&) = delete;
  MemoryHog& operator=(const MemoryHog&) = delete;

 private:
  std::vector<void*> chunks_;
};

template <class F>
void expect_out_of_memory(F&& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": ran with the device's memory exhausted (the test's premise failed)";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::OutOfMemory) << what << ": " << e.what();
  }
}

TEST(GemmWorkspace, PreparedLaunchesNeedNoMemory) {
  TF_REQUIRE_GPUS(1);
  // Odd M and N; our GEMM with split-K 16 over 8 x 16 tiles (128 MiB of fp32 partials: more than
  // the memory pool may keep free inside what it holds for earlier allocations, r187-r188 with
  // 2 MiB), cuBLASLt (its 32 MiB).
  const Problem p = make_problem(1000, 2040, 2056, DType::bf16, BLayout::nk, 31);
  Output ours(p), theirs(p);
  GemmConfig cfg;
  cfg.bm = 128, cfg.bn = 128, cfg.stages = 6, cfg.splits = 16;
  StreamGuard warm, prepared, bare_ours, bare_lt;  // created while memory is free
  // A stream destroyed earlier in this process without release_stream_workspace may have left its
  // workspace to the same handle: the bare streams start with none.
  release_stream_workspace(bare_ours.s);
  release_stream_workspace(bare_lt.s);
  // Kernels loaded (lazy module loading allocates at first launch) and cuBLASLt's plan cached.
  launch(p.args(ours.c()), cfg, warm.s);
  cublaslt_launch(p.args(theirs.c()), warm.s);
  TF_CUDA(cudaStreamSynchronize(warm.s));
  prepare(p.args(ours.c()), cfg, prepared.s);
  cublaslt_prepare(p.args(theirs.c()), prepared.s);
  ours.poison(prepared.s);
  theirs.poison(prepared.s);
  TF_CUDA(cudaStreamSynchronize(prepared.s));
  {
    MemoryHog hog;
    expect_out_of_memory([&] { launch(p.args(ours.c()), cfg, bare_ours.s); }, "our split-K GEMM, unprepared stream");
    expect_out_of_memory([&] { cublaslt_launch(p.args(theirs.c()), bare_lt.s); }, "cuBLASLt, unprepared stream");
    for (int rep = 0; rep < 3; ++rep) {
      launch(p.args(ours.c()), cfg, prepared.s);
      cublaslt_launch(p.args(theirs.c()), prepared.s);
    }
    TF_CUDA(cudaStreamSynchronize(prepared.s));
  }
  expect_matches(p, ours.read(), "our split-K GEMM on the prepared stream");
  expect_matches(p, theirs.read(), "cuBLASLt on the prepared stream");
}

}  // namespace
}  // namespace taxfree::gemm
