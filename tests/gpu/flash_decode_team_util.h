// Helpers of the flash_decode tests that run on a Team (FlashDecodeDist, one process per GPU): the
// op with the heap space it took, a checked launch, and the cross-rank comparison of outputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "flash_decode_dist_util.h"
#include "gpu_env.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::flash_decode::test {

using ::taxfree::test::expect_same_on_every_rank;
using ::taxfree::test::team;

inline void upload_local(const Global& g, Local& l) { upload_local(g, l, team().rank()); }

// The op and the heap space it took (released when this goes out of scope).
struct Op {
  uint64_t mark;
  std::unique_ptr<FlashDecode> op;
  using SplitMerge = FlashDecodeConfig::SplitMerge;
  Op(const Problem& p, BspBuffers bsp = BspBuffers::symmetric, SplitMerge merge = SplitMerge::cluster)
      : mark(team().heap().mark()) {
    FlashDecodeConfig c;
    c.max_batch = p.batch, c.max_q_heads = p.q_heads, c.max_kv_heads = p.kv_heads, c.max_head_dim = p.head_dim;
    c.num_splits = p.num_splits, c.bsp_buffers = bsp, c.split_merge = merge;
    op = std::make_unique<FlashDecode>(team(), c);
  }
  ~Op() {
    op.reset();
    team().heap().release(mark);
  }
  FlashDecode* operator->() { return op.get(); }
};

inline std::vector<uint16_t> download_out(const Local& l) {
  TF_CUDA(cudaStreamSynchronize(team().stream()));
  return l.out_d.download();
}

// Poison, align the ranks (peers write into this rank's buffers only after it is ready), launch,
// wait, download.
inline std::vector<uint16_t> run_checked(Op& op, FlashDecodeVariant v, const Problem& p, Local& l) {
  auto& t = team();
  TF_CUDA(cudaMemsetAsync(l.out_d.p, 0xFF, l.out_d.n * 2, t.stream()));
  t.sync(t.stream());
  t.host_barrier("fdd.run");
  op->launch(v, l.args(p), t.stream());
  t.sync(t.stream());
  return download_out(l);
}

inline void check(const Global& g, const std::vector<uint16_t>& out, const std::string& what) {
  EXPECT_EQ(count_wrong(g, out, what), 0) << what;
  expect_same_on_every_rank(out, what);
}

inline std::string name(const Problem& p) {
  return std::string(dtype_name(p.dtype)) + " D=" + std::to_string(p.head_dim) +
         " heads=" + std::to_string(p.q_heads) + "/" + std::to_string(p.kv_heads) +
         " splits=" + std::to_string(p.num_splits);
}

inline constexpr FlashDecodeVariant kVariants[] = {FlashDecodeVariant::bsp, FlashDecodeVariant::fused};

}  // namespace taxfree::flash_decode::test
