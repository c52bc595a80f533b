// flash_decode validation: every bad input is rejected with InvalidArgument and a message naming
// the offending value, before any CUDA call (these run without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "expect_error.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"

namespace taxfree::flash_decode {
namespace {

template <class T = void>
T* fake(uintptr_t addr) {
  return reinterpret_cast<T*>(addr);
}

using taxfree::test::expect_invalid;

struct Fixture {
  std::vector<int32_t> lens{100, 0, 7};
  std::vector<int32_t> starts{0, 5, 200};
  std::vector<int32_t> table = std::vector<int32_t>(3 * 16, 0);
  DecodeArgs a;
  Fixture() {
    a.batch = 3, a.q_heads = 32, a.kv_heads = 4, a.head_dim = 128;
    // 256 MiB apart: no buffer of these shapes reaches the next (the overlap checks see real ranges).
    a.q = fake(0x10000000), a.k = fake(0x20000000), a.v = fake(0x30000000);
    a.capacity = 256, a.max_len = 128;
    a.slice_start = fake<const int32_t>(0x40000000);
    a.slice_len = fake<const int32_t>(0x50000000);
    a.host_slice_start = starts;
    a.host_slice_len = lens;
    a.out = fake(0x60000000);
  }
  void paged(int page_size) {
    a.layout = KvLayout::paged_hnd;
    a.page_size = page_size, a.num_pages = 64, a.max_pages_per_seq = 16;
    a.block_table = fake<const int32_t>(0x70000000);
    a.host_block_table = table;
    a.capacity = 0;
  }
};

TEST(FlashDecodeValidation, ValidArgsPass) {
  Fixture f;
  EXPECT_NO_THROW(validate_decode_args(f.a));
  f.paged(16);
  EXPECT_NO_THROW(validate_decode_args(f.a));
  for (int p : {16, 32, 64, 128, 256}) {
    Fixture g;
    g.paged(p);
    EXPECT_NO_THROW(validate_decode_args(g.a)) << "page_size " << p;
  }
}

TEST(FlashDecodeValidation, Shapes) {
  auto bad = [](auto mutate, const std::string& needle) {
    Fixture f;
    mutate(f.a);
    expect_invalid([&] { validate_decode_args(f.a); }, needle);
    expect_invalid([&] { launch_decode_partial(f.a, DecodePlan{}, nullptr, 0, nullptr); }, needle);
  };
  bad([](DecodeArgs& a) { a.head_dim = 96; }, "head_dim=96");
  bad([](DecodeArgs& a) { a.head_dim = 256; }, "head_dim=256");
  bad([](DecodeArgs& a) { a.q_heads = 30; }, "q_heads=30 must be a multiple of kv_heads=4");
  bad([](DecodeArgs& a) { a.q_heads = 68; }, "GQA ratio q_heads/kv_heads=17");
  bad([](DecodeArgs& a) { a.q_heads = 128, a.kv_heads = 4; }, "q_heads/kv_heads=32");
  bad([](DecodeArgs& a) { a.kv_heads = 0; }, "kv_heads=0");
  bad([](DecodeArgs& a) { a.batch = 0; }, "batch=0");
  bad([](DecodeArgs& a) { a.dtype = DType(7); }, "dtype=7");
  bad([](DecodeArgs& a) { a.softmax_scale = -1.f; }, "softmax_scale=-1");
  bad([](DecodeArgs& a) { a.softmax_scale = NAN; }, "softmax_scale=nan");
  bad([](DecodeArgs& a) { a.max_len = -2; }, "max_len=-2");
  bad([](DecodeArgs& a) { a.max_len = 300; }, "max_len=300 exceeds the cache capacity of 256");
  bad([](DecodeArgs& a) { a.capacity = -1; }, "capacity=-1");
  bad([](DecodeArgs& a) { a.layout = KvLayout(9); }, "layout=9");
}

TEST(FlashDecodeValidation, PointersAndAlignment) {
  auto bad = [](auto mutate, const std::string& needle) {
    Fixture f;
    mutate(f.a);
    expect_invalid([&] { validate_decode_args(f.a); }, needle);
  };
  bad([](DecodeArgs& a) { a.q = nullptr; }, "q is null");
  bad([](DecodeArgs& a) { a.k = nullptr; }, "k is null");
  bad([](DecodeArgs& a) { a.v = nullptr; }, "v is null");
  bad([](DecodeArgs& a) { a.slice_len = nullptr; }, "slice_len is null");
  bad([](DecodeArgs& a) { a.q = fake(0x10008); }, "q=0x10008 must be 16-byte aligned");
  bad([](DecodeArgs& a) { a.k = fake(0x20004); }, "k=0x20004 must be 16-byte aligned");
  bad([](DecodeArgs& a) { a.v = fake(0x30002); }, "v=0x30002 must be 16-byte aligned");
  bad([](DecodeArgs& a) { a.out = fake(0x60008); }, "out=0x60008 must be 16-byte aligned");
  bad([](DecodeArgs& a) { a.o_part = fake<float>(0x60004); }, "o_part=0x60004 must be 16-byte aligned");
  bad([](DecodeArgs& a) { a.lse_part = fake<float>(0x60002); }, "lse_part=0x60002 must be 4-byte aligned");
  bad([](DecodeArgs& a) { a.slice_len = fake<const int32_t>(0x50002); }, "slice_len=0x50002");
  bad([](DecodeArgs& a) { a.out = nullptr; }, "no output");
}

TEST(FlashDecodeValidation, OutputsOverlappingInputsOrEachOther) {
  auto bad = [](const std::function<void(Fixture&)>& set, const std::string& what, bool is_paged = false) {
    Fixture f;
    if (is_paged) f.paged(64);
    set(f);
    expect_invalid([&] { validate_decode_args(f.a); }, what);
  };
  const uintptr_t q = 0x10000000, k = 0x20000000;
  const int64_t q_bytes = 3 * 32 * 128 * 2, k_bytes = 3 * 4 * 256 * 128 * 2;  // q; contiguous k
  bad([&](Fixture& f) { f.a.out = fake(q + 16); }, "output out overlaps input q");
  bad([&](Fixture& f) { f.a.out = fake(k + k_bytes - 16); }, "output out overlaps input k");
  bad([&](Fixture& f) { f.a.o_part = fake<float>(0x30000000); }, "output o_part overlaps input v");
  bad([&](Fixture& f) { f.a.lse_part = fake<float>(0x50000000); }, "output lse_part overlaps input slice_len");
  bad([&](Fixture& f) { f.a.lse_part = fake<float>(0x60000000 + 3 * 32 * 128 * 2 - 4); },
      "output lse_part overlaps output out");
  // Paged: k is num_pages x kv_heads x page x head_dim; the block table is an input too.
  bad([&](Fixture& f) { f.a.out = fake(k + 64 * 4 * 64 * 128 * 2 - 16); }, "output out overlaps input k", true);
  bad([&](Fixture& f) { f.a.out = fake(0x70000000); }, "output out overlaps input block_table", true);
  // Right after an input ends, or in a smaller paged cache's unused tail, is fine.
  Fixture f;
  f.a.out = fake(q + q_bytes);
  f.a.o_part = fake<float>(k + k_bytes);
  EXPECT_NO_THROW(validate_decode_args(f.a));
  Fixture g;
  g.paged(64);
  g.a.out = fake(k + 64 * 4 * 64 * 128 * 2);
  EXPECT_NO_THROW(validate_decode_args(g.a));
}

TEST(FlashDecodeValidation, LengthsAndSlices) {
  {
    Fixture f;
    f.lens[2] = -3;
    expect_invalid([&] { validate_decode_args(f.a); }, "slice_len[2]=-3 must be >= 0");
  }
  {
    Fixture f;
    f.lens[0] = 129;
    expect_invalid([&] { validate_decode_args(f.a); }, "slice_len[0]=129 exceeds max_len=128");
  }
  {
    Fixture f;
    f.starts[1] = -1;
    expect_invalid([&] { validate_decode_args(f.a); }, "slice_start[1]=-1 must be >= 0");
  }
  {
    Fixture f;  // [200, 207) fits in 256; [250, 257) does not
    f.starts[2] = 250;
    expect_invalid([&] { validate_decode_args(f.a); },
                   "slice [250, 257) of sequence 2 ends beyond the cache capacity of 256");
  }
  {
    Fixture f;
    f.lens.pop_back();
    f.a.host_slice_len = f.lens;
    expect_invalid([&] { validate_decode_args(f.a); }, "host_slice_len has 2 entries, batch=3");
  }
  {
    Fixture f;
    f.a.slice_start = nullptr;
    expect_invalid([&] { validate_decode_args(f.a); }, "device slice_start is null");
  }
}

TEST(FlashDecodeValidation, Paging) {
  for (int p : {0, 8, 48, 100, 512}) {
    Fixture f;
    f.paged(p);
    expect_invalid([&] { validate_decode_args(f.a); }, "page_size=" + std::to_string(p));
  }
  {
    Fixture f;
    f.paged(16);
    f.a.block_table = nullptr;
    expect_invalid([&] { validate_decode_args(f.a); }, "block_table is null");
  }
  {
    Fixture f;
    f.paged(16);
    f.a.num_pages = 0;
    expect_invalid([&] { validate_decode_args(f.a); }, "num_pages=0");
  }
  {
    Fixture f;
    f.paged(16);  // capacity 16 x 16 = 256; max_len 128 fits
    f.a.max_pages_per_seq = 4;
    f.table.resize(3 * 4);
    f.a.host_block_table = f.table;
    expect_invalid([&] { validate_decode_args(f.a); }, "max_len=128 exceeds the cache capacity of 64");
  }
  {
    Fixture f;
    f.paged(16);
    f.table[2 * 16 + 200 / 16] = 64;  // the page of sequence 2's slice [200, 207)
    expect_invalid([&] { validate_decode_args(f.a); }, "block_table[2][12]=64 must be in [0, num_pages=64)");
  }
  {
    Fixture f;
    f.paged(16);
    f.table[1 * 16 + 3] = -1;  // sequence 1 is empty: its pages are never read
    f.table[0 * 16 + 15] = -1; // beyond sequence 0's slice [0, 100)
    EXPECT_NO_THROW(validate_decode_args(f.a));
  }
  {
    // Device starts without their host copy: which pages are read is unknown, so none is checked
    // (sequence 2's slice [200, 207) leaves page 0 unread; assuming it started at 0 refused this).
    Fixture f;
    f.paged(16);
    f.table[2 * 16 + 0] = -1;
    f.a.host_slice_start = {};
    EXPECT_NO_THROW(validate_decode_args(f.a));
    f.a.slice_start = nullptr;  // now the slices start at 0, and page 0 is read
    expect_invalid([&] { validate_decode_args(f.a); }, "block_table[2][0]=-1 must be in [0, num_pages=64)");
  }
}

TEST(FlashDecodeValidation, PlanAndWorkspace) {
  Fixture f;
  DecodeConfig cfg;
  cfg.num_splits = kMaxSplits + 1;
  expect_invalid([&] { plan_decode(f.a, cfg); }, "num_splits=65");
  cfg.num_splits = -1;
  expect_invalid([&] { plan_decode(f.a, cfg); }, "num_splits=-1");
  cfg = {};
  cfg.waves = 0;
  expect_invalid([&] { plan_decode(f.a, cfg); }, "waves=0");

  DecodePlan plan{4, decode_workspace_bytes(3, 32, 4, 128, 4)};
  expect_invalid([&] { launch_decode_partial(f.a, plan, nullptr, plan.workspace_bytes, nullptr); },
                 "workspace is null; num_splits=4");
  expect_invalid([&] { launch_decode_partial(f.a, plan, fake(0x100000), 100, nullptr); },
                 "workspace_bytes=100");
  expect_invalid([&] { launch_decode_partial(f.a, plan, fake(0x100010), plan.workspace_bytes, nullptr); },
                 "must be 256-byte aligned");
  expect_invalid([&] { launch_decode_partial(f.a, DecodePlan{0, 0}, nullptr, 0, nullptr); },
                 "plan.num_splits=0");
}

TEST(FlashDecodeValidation, Combine) {
  auto base = [] {
    CombineArgs c;
    c.world = 4, c.batch = 2, c.q_heads = 8, c.head_dim = 64;
    c.o_parts = fake<const float>(0x10000);
    c.lse_parts = fake<const float>(0x20000);
    c.out = fake(0x30000);
    return c;
  };
  EXPECT_NO_THROW(validate_combine_args(base()));
  auto bad = [&](auto mutate, const std::string& needle) {
    CombineArgs c = base();
    mutate(c);
    expect_invalid([&] { validate_combine_args(c); }, needle);
    expect_invalid([&] { launch_combine(c, nullptr); }, needle);
  };
  bad([](CombineArgs& c) { c.world = 0; }, "world=0");
  bad([](CombineArgs& c) { c.world = 65; }, "world=65");
  bad([](CombineArgs& c) { c.head_dim = 80; }, "head_dim=80");
  bad([](CombineArgs& c) { c.batch = -1; }, "batch=-1");
  bad([](CombineArgs& c) { c.o_parts = nullptr; }, "o_parts is null");
  bad([](CombineArgs& c) { c.lse_parts = fake<const float>(0x20001); }, "lse_parts=0x20001");
  bad([](CombineArgs& c) { c.o_parts = fake<const float>(0x10004); }, "o_parts=0x10004 must be 16-byte aligned");
  bad([](CombineArgs& c) { c.o_rank_stride = 2 * 8 * 64 - 4; }, "o_rank_stride=1020");
  bad([](CombineArgs& c) { c.o_rank_stride = 2 * 8 * 64 + 2; }, "o_rank_stride=1026");
  bad([](CombineArgs& c) { c.lse_rank_stride = 15; }, "lse_rank_stride=15 must be 0 (dense) or >= batch*q_heads=16");
  bad([](CombineArgs& c) { c.o_rank_stride = int64_t(1) << 62; }, "puts world=4 partials past 64-bit byte offsets");
  bad([](CombineArgs& c) { c.lse_rank_stride = int64_t(1) << 61; }, "puts world=4 partials past 64-bit byte offsets");
  bad([](CombineArgs& c) { c.out = nullptr; }, "no output");
  bad([](CombineArgs& c) { c.out = fake(0x30008); }, "out=0x30008 must be 16-byte aligned");
  // Outputs apart from every rank's partials and from each other (the last rank's block ends at
  // 0x10000 + 4 x 1024 x 4 B = 0x14000; the LSE parts at 0x20000 + 4 x 16 x 4 B = 0x20100).
  bad([](CombineArgs& c) { c.out = fake(0x13ff0); }, "output out overlaps input o_parts");
  bad([](CombineArgs& c) { c.o_out = const_cast<float*>(c.o_parts); }, "output o_out overlaps input o_parts");
  bad([](CombineArgs& c) { c.lse_out = fake<float>(0x200f0); }, "output lse_out overlaps input lse_parts");
  bad([](CombineArgs& c) { c.o_out = fake<float>(0x30000); }, "output out overlaps output o_out");
  {
    CombineArgs c = base();
    c.out = fake(0x14000), c.lse_out = fake<float>(0x20100);  // just past each
    EXPECT_NO_THROW(validate_combine_args(c));
  }
  // One interleaved buffer per rank ([O | LSE]) is a valid layout.
  CombineArgs c = base();
  c.o_rank_stride = c.lse_rank_stride = 2 * 8 * 64 + 2 * 8;
  c.lse_parts = c.o_parts + 2 * 8 * 64;
  EXPECT_NO_THROW(validate_combine_args(c));
}

TEST(FlashDecodeValidation, Partition) {
  expect_invalid([] { partition_slice(10, 0, 0); }, "world=0");
  expect_invalid([] { partition_slice(10, 4, 4); }, "rank=4 must be in [0, world=4)");
  expect_invalid([] { partition_slice(10, 4, -1); }, "rank=-1");
  expect_invalid([] { partition_slice(-1, 4, 0); }, "len=-1");
  expect_invalid([] { partition_slice(10, 4, 0, 0); }, "align=0");
  const std::vector<int32_t> lens = {5, -2};
  expect_invalid([&] { partition(lens, 2); }, "lens[1]=-2");
}

}  // namespace
}  // namespace taxfree::flash_decode
