// Benchmark bookkeeping that needs no GPU: bandwidth formulas, statistics, size sweeps, filters,
// heap placement, the heap over caller-owned memory.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "expect_error.h"
#include "host_heap.h"
#include "taxfree/bench/harness.h"
#include "taxfree/runtime/coordinator.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/rank_share.h"
#include "taxfree/runtime/symmetric_heap.h"
#include "taxfree/runtime/team.h"

namespace taxfree::bench {
namespace {

TEST(Harness, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor("all_gather", 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor("all_gather", 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_factor("reduce_scatter", 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_factor("broadcast", 8), 1.0);
  EXPECT_THROW(bus_factor("gossip", 2), Error);
}

TEST(Harness, MedianMinMax) {
  auto s = summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.median, 3);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 5);
  EXPECT_EQ(summarize({4, 1, 3, 2}).median, 2.5);
  EXPECT_THROW(summarize({}), Error);
}

TEST(Harness, ParseBytes) {
  EXPECT_EQ(parse_bytes("1024"), 1024);
  EXPECT_EQ(parse_bytes("64K"), 64 << 10);
  EXPECT_EQ(parse_bytes("8M"), 8 << 20);
  EXPECT_EQ(parse_bytes("1G"), int64_t(1) << 30);
  EXPECT_EQ(parse_bytes("1.5K"), 1536);
  EXPECT_EQ(parse_bytes("1048576G"), kMaxBytes);
  // Past kMaxBytes (or int64: an undefined conversion before), NaN, inf, a leading space.
  for (const char* bad : {"", "abc", "12Q", "-5", "1.3", "1e19", "1e30", "9223372036854775807", "1048577G", "nan",
                          "inf", " 5"}) {
    try {
      parse_bytes(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

// Plain decimal digits in [min, max]; strtoll's saturation, signs, spaces and suffixes rejected.
TEST(Harness, ParseIntTakesPlainDecimalInRange) {
  EXPECT_EQ(parse_int("X", "0", 0, 10), 0);
  EXPECT_EQ(parse_int("X", "10", 0, 10), 10);
  EXPECT_EQ(parse_int("X", "9223372036854775807", 0, INT64_MAX), INT64_MAX);
  for (const char* bad : {"", "11", "-1", "+5", " 5", "5 ", "5abc", "0x5", "1e3", "99999999999999999999"})
    test::expect_invalid([&] { parse_int("X", bad, 0, 10); }, std::string("X=") + bad + " is not an integer in [0, 10]");
}

// --shape entries: each numeric key up to its own max (INT32_MAX unless the op says less), each key
// once, no empty entry or item; the message names the entry and the key.
TEST(Harness, ShapeEntriesAreStrict) {
  const std::vector<ShapeKey> keys = {{"M", {}}, {"B", {}, kMaxBytes}, {"small", {}, 8}, {"layout", {"nk", "kn"}}};
  auto kv = parse_shape_entry("M=2147483647,B=4294967296,small=8,layout=kn", keys);
  EXPECT_EQ(shape_int(kv, "M", 0), INT32_MAX);
  EXPECT_EQ(shape_int(kv, "B", 0), int64_t(1) << 32);
  EXPECT_EQ(shape_int(kv, "small", 0), 8);
  EXPECT_EQ(shape_int(kv, "absent", -7), -7);
  EXPECT_EQ(kv.at("layout"), "kn");
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"M=2147483648", "--shape entry 'M=2147483648': M=2147483648 is not an integer in [1, 2147483647]"},
      {"M=99999999999999999999", "M=99999999999999999999 is not an integer"},
      {"M=0", "M=0 is not an integer in [1, "},
      {"M= 5", "M= 5 is not an integer"},
      {"M=+5", "M=+5 is not an integer"},
      {"M=5abc", "M=5abc is not an integer"},
      {"M=", "M= is not an integer"},
      {"small=9", "small=9 is not an integer in [1, 8]"},
      {"B=1125899906842625", "B=1125899906842625 is not an integer in [1, 1125899906842624]"},
      {"M=1,M=2", "--shape entry 'M=1,M=2': key 'M' given twice"},
      {"", "--shape entry '': empty item"},
      {"M=1,", "--shape entry 'M=1,': empty item"},
      {",M=1", "empty item"},
      {"M=1,,small=2", "empty item"},
      {"M", "'M'; expected key=value"},
      {"=1", "'=1'; expected key=value"},
      {"Q=1", "unknown key 'Q' (keys: M, B, small, layout)"},
      {"layout=xy", "layout=xy is not one of nk, kn"},
  };
  for (const auto& b : bad) test::expect_invalid([&] { parse_shape_entry(b.first, keys); }, b.second);
}

// The ops whose entries only filter accept their own keys and nothing else (an unknown key once
// selected no case and exited 0).
TEST(Harness, FilterOnlyOpsCheckTheirShapeKeys) {
  const auto with = [](std::vector<std::string> shapes) {
    Options o;
    o.shapes = std::move(shapes);
    return o;
  };
  const std::vector<std::pair<const char*, const char*>> good = {
      {"put_get", "bytes=1073741824,mode=oneway"}, {"signal", "rounds=2000"},
      {"barrier", "reps=200"}, {"all_gather", "bytes_per_rank=4294967296"}};
  for (const auto& g : good) {
    EXPECT_NO_THROW(make_bench(g.first)->check_options(with({g.second}))) << g.first;
    test::expect_invalid([&] { make_bench(g.first)->check_options(with({"foo=1"})); }, "unknown key 'foo'");
    test::expect_invalid([&] { make_bench(g.first)->check_options(with({""})); }, "empty item");
  }
  test::expect_invalid([&] { make_bench("all_gather")->check_options(with({"bytes_per_rank=1125899906842625"})); },
                       "bytes_per_rank=1125899906842625");
}

TEST(Harness, SizeSweepRespectsBoundsFactorAndMultiple) {
  Options o;
  EXPECT_EQ(size_sweep(o, 1024, 8192, 16), (std::vector<int64_t>{1024, 2048, 4096, 8192}));
  o.min_bytes = 100, o.max_bytes = 1000, o.step_factor = 3;
  EXPECT_EQ(size_sweep(o, 1, 1, 16), (std::vector<int64_t>{96, 288, 896}));
  o.min_bytes = 1, o.max_bytes = 1;
  EXPECT_EQ(size_sweep(o, 1, 1, 16), (std::vector<int64_t>{16}));
  o.min_bytes = 10, o.max_bytes = 5;
  EXPECT_THROW(size_sweep(o, 1, 1, 16), Error);
}

TEST(Harness, ShapeFilters) {
  nlohmann::json p = {{"M", 8192}, {"N", 4096}, {"layout", "nk"}};
  EXPECT_TRUE(matches_shape_filters(p, {}));
  EXPECT_TRUE(matches_shape_filters(p, {"M=8192"}));
  EXPECT_TRUE(matches_shape_filters(p, {"M=8192,layout=nk"}));
  EXPECT_FALSE(matches_shape_filters(p, {"M=8192,layout=kn"}));
  EXPECT_TRUE(matches_shape_filters(p, {"M=1", "N=4096"}));  // any entry may match
  EXPECT_FALSE(matches_shape_filters(p, {"K=1"}));
  EXPECT_THROW(matches_shape_filters(p, {"M"}), Error);
}

// Times cross ranks in seconds: a median of 24.4567 us must come back as itself, not as 24 or
// 25 us (std::to_string kept 6 decimals; every cross-rank median read whole microseconds).
TEST(Harness, TimesCrossRanksExactly) {
  constexpr int kWorld = 3;
  CoordinatorServer server{"127.0.0.1", 0, kWorld};
  std::vector<std::unique_ptr<CoordinatorClient>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.push_back(std::make_unique<CoordinatorClient>("127.0.0.1", server.port(), r, kWorld, 10));
    ranks.back()->set_exit_grace(0);
  }
  const double values[kWorld] = {24.4567891234e-6, 1.0000000000000002, 3.3e-7 + 1e-19};
  std::vector<std::vector<double>> got(kWorld);
  std::vector<double> most(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r)
    threads.emplace_back([&, r] {
      got[size_t(r)] = all_gather_doubles(*ranks[size_t(r)], "t", values[r]);
      most[size_t(r)] = max_over_ranks(*ranks[size_t(r)], "m", values[(r + 2) % kWorld] * 1e-6);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(got[size_t(r)], std::vector<double>(values, values + kWorld)) << "rank " << r;
    EXPECT_EQ(most[size_t(r)], 1.0000000000000002e-6) << "rank " << r;
  }
  for (auto& c : ranks) c->finish();
}

// The bench JSON's GPU names read as nvidia-smi's (r219's GPU as the example).
TEST(Harness, GpuUuidAsNvidiaSmiPrintsIt) {
  const unsigned char b[16] = {0x8a, 0xe2, 0x30, 0x29, 0xba, 0x2f, 0xe6, 0x56,
                               0x3c, 0xf4, 0x4c, 0x02, 0x30, 0xfd, 0x61, 0x62};
  EXPECT_EQ(format_gpu_uuid(b), "GPU-8ae23029-ba2f-e656-3cf4-4c0230fd6162");
  const unsigned char z[16] = {};
  EXPECT_EQ(format_gpu_uuid(z), "GPU-00000000-0000-0000-0000-000000000000");
}

TEST(Harness, RunsPerSample) {
  Options o;  // 200 us samples, 20 iterations
  EXPECT_EQ(runs_per_sample(o, 20e-6, 1), 10);
  EXPECT_EQ(runs_per_sample(o, 23e-6, 1), 9);
  EXPECT_EQ(runs_per_sample(o, 1e-6, 1), 64);   // at most 64
  EXPECT_EQ(runs_per_sample(o, 5e-3, 1), 1);    // a long run: one
  o.cold_l2 = true;
  EXPECT_EQ(runs_per_sample(o, 5e-6, 1), 1);    // every run after its own flush
  o.cold_l2 = false;
  // NaN made int(clamp(NaN)) undefined; no iterations divided by zero.
  for (double bad : {std::nan(""), 0.0, -1.0, HUGE_VAL}) {
    Options b = o;
    b.sample_us = bad;
    test::expect_invalid([&] { runs_per_sample(b, 20e-6, 1); }, "sample_us=");
  }
  Options none = o;
  none.iters = 0;
  test::expect_invalid([&] { runs_per_sample(none, 20e-6, 1); }, "iters=0");
  // A round's batch must fit behind the gate: samples x (3 + runs x launches) <= 600.
  for (int iters : {1, 5, 16, 20, 40, 100, 1000})
    for (int launches = 1; launches <= 40; ++launches)
      for (double run_s : {1e-7, 2e-6, 15e-6, 60e-6, 1e-3}) {
        o.iters = iters;
        const int reps = runs_per_sample(o, run_s, launches);
        const int batch = (iters + 15) / 16;
        EXPECT_GE(reps, 1);
        EXPECT_LE(reps, 64);
        if (reps > 1) EXPECT_LE(batch * (3 + reps * launches), 600) << iters << " " << launches << " " << run_s;
      }
  // --graph: the same runs per sample (a graph's kernels count against the gate's queue, and graph
  // and eager times of a variant then cover the same runs).
  for (int iters : {20, 1000})
    for (double run_s : {1e-6, 20e-6}) {
      o.iters = iters;
      o.graph = false;
      const int eager = runs_per_sample(o, run_s, 40);
      o.graph = true;
      EXPECT_EQ(runs_per_sample(o, run_s, 40), eager) << iters << " " << run_s;
    }
}

TEST(Heap, PlacementAlignsAndNamesExhaustion) {
  EXPECT_EQ(heap_place(0, 1 << 20, 100, 256, "a"), 0u);
  EXPECT_EQ(heap_place(100, 1 << 20, 100, 256, "b"), 256u);
  EXPECT_EQ(heap_place(256, 1 << 20, 16, 4096, "c"), 4096u);
  try {
    heap_place(1000, 4096, 4000, 256, "ag.recv");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::OutOfMemory);
    const std::string m = e.what();
    EXPECT_NE(m.find("'ag.recv' asked for 4000 B"), std::string::npos) << m;
    EXPECT_NE(m.find("3072 B free of 4096 B"), std::string::npos) << m;
  }
  EXPECT_THROW(heap_place(0, 4096, 0, 256, "zero"), Error);
  EXPECT_THROW(heap_place(0, 4096, 16, 24, "align"), Error);
}

// A heap over caller-owned memory (ranks simulated on one GPU): every rank's span, the same calls,
// the same offsets within the span; release to a mark; no NCCL window; a bad view refused.
TEST(Heap, OverCallerMemoryGivesEveryRankTheSameOffsets) {
  constexpr uint64_t kSpan = 1 << 16;
  std::vector<char> memory(3 * kSpan);
  std::vector<uint64_t> offsets[3];
  for (int r = 0; r < 3; ++r) {
    dev::SymmetricView v;
    v.local_base = memory.data() + r * kSpan, v.stride = int64_t(kSpan), v.size = kSpan, v.rank = r, v.world = 3;
    SymmetricHeap heap(v);
    EXPECT_EQ(heap.capacity(), kSpan);
    for (uint64_t bytes : {100, 4000, 16})
      offsets[r].push_back(uint64_t(static_cast<char*>(heap.allocate(bytes, 256, "x")) - v.local_base));
    const uint64_t mark = heap.mark();
    heap.allocate(kSpan / 2, 4096, "big");
    heap.release(mark);
    EXPECT_EQ(heap.used(), mark);
    EXPECT_TRUE(heap.contains(v.local_base + offsets[r][1], 4000));
    test::expect_error([&] { heap.allocate(kSpan, 256, "too big"); }, Status::OutOfMemory, "'too big' asked for");
    test::expect_error([&] { heap.nccl_address(v.local_base); }, Status::NotSupported, "no NCCL window");
  }
  EXPECT_EQ(offsets[0], (std::vector<uint64_t>{0, 256, 4352}));
  EXPECT_EQ(offsets[1], offsets[0]);
  EXPECT_EQ(offsets[2], offsets[0]);
  dev::SymmetricView bad;
  bad.local_base = memory.data(), bad.size = kSpan, bad.rank = 3, bad.world = 3;
  test::expect_invalid([&] { SymmetricHeap h(bad); }, "rank 3 of 3");
}

// A wait that gave up names its flag by heap offset; the heap turns that into the live allocation
// holding it (its tag, the byte within it), and forgets allocations a release took back.
TEST(Heap, DescribeOffsetNamesTheLiveAllocation) {
  test::HostHeap host(0, 1, 1 << 16);
  SymmetricHeap& heap = host.heap;
  heap.allocate(100, 256, "op.data");
  const uint64_t mark = heap.mark();
  heap.allocate_array<uint64_t>(4, "op.arrived");  // at 256
  EXPECT_EQ(heap.describe_offset(0), "'op.data' + 0 B of a 100-byte allocation");
  EXPECT_EQ(heap.describe_offset(256 + 24), "'op.arrived' + 24 B of a 32-byte allocation");
  EXPECT_EQ(heap.describe_offset(100), "");  // alignment padding
  EXPECT_EQ(heap.describe_offset(256 + 32), "");
  dev::WaitRecord r{};
  r.complete = 1, r.site = uint32_t(dev::WaitSite::all_gather_data), r.rank = 0, r.peer = 1;
  r.flag_offset = 256 + 8, r.expected = 7, r.observed = 6, r.waited_ns = 10'000'000'001;
  const std::string text = describe_wait_record(r, &heap);
  EXPECT_NE(text.find("at heap offset 264 ('op.arrived' + 8 B of a 32-byte allocation) expected >= 7, observed 6"),
            std::string::npos) << text;
  // A value that is wrong, not late (waited 0: the direct merge's split count): no "gave up
  // waiting", no wait time.
  dev::WaitRecord bad = r;
  bad.site = uint32_t(dev::WaitSite::decode_partial), bad.expected = 16, bad.observed = 40, bad.waited_ns = 0;
  const std::string count = describe_wait_record(bad, &heap);
  EXPECT_NE(count.find("rank 0 stopped at 'flash_decode: peer partial arrived' from rank 1: line at heap offset 264 "
                       "('op.arrived' + 8 B of a 32-byte allocation) holds 40 where a count in [1, 16] was due"),
            std::string::npos) << count;
  EXPECT_EQ(count.find("after"), std::string::npos) << count;
  heap.release(mark);
  EXPECT_EQ(heap.describe_offset(256 + 24), "");
  EXPECT_EQ(describe_wait_record(r, &heap).find("op.arrived"), std::string::npos);
}

// release() takes back whole allocations only, and allocate_array's byte count cannot wrap: either
// would hand out memory that aliases a live buffer.
TEST(Heap, ReleaseInsideAnAllocationAndWrappingArraysAreRefused) {
  test::HostHeap host(0, 1, 1 << 16);
  SymmetricHeap& heap = host.heap;
  heap.allocate(4096, 256, "a");
  test::expect_invalid([&] { heap.release(100); }, "release to mark 100 inside the live allocation 'a' [0, 4096)");
  EXPECT_EQ(heap.used(), 4096u) << "nothing released";
  EXPECT_EQ(heap.describe_offset(100), "'a' + 100 B of a 4096-byte allocation");
  heap.allocate(16, 1024, "b");  // [4096, 4112)
  heap.allocate(16, 1024, "c");  // [5120, 5136)
  heap.release(4120);            // in the padding after 'b': only 'c' goes
  EXPECT_EQ(heap.used(), 4120u);
  test::expect_invalid([&] { heap.release(4100); }, "inside the live allocation 'b' [4096, 4112)");
  heap.release(4096);  // 'b' starts at the mark: it goes
  EXPECT_EQ(heap.describe_offset(4096), "");
  test::expect_invalid([&] { heap.allocate_array<uint32_t>((uint64_t(1) << 62) + 1, "huge"); },
                       "allocate_array('huge'): 4611686018427387905 elements of 4 B overflow 64 bits");
  EXPECT_EQ(heap.used(), 4096u);
  heap.release(0);
  EXPECT_EQ(heap.used(), 0u);
}

// What an op takes from a rank (rank_share.h): refused, naming the op and the bad value, without a
// heap, with a rank outside [0, world), with no SMs, without the rank's fault state, or with a
// coordinator and no NCCL call limit.
TEST(RankShare, CheckNamesTheOpAndWhatIsMissing) {
  test::HostHeap host(1, 2);
  const RankShare good = host.share(66);
  check_rank_share(good, "op");  // accepted
  RankShare s = good;
  s.heap = nullptr;
  test::expect_invalid([&] { check_rank_share(s, "flash_decode"); }, "flash_decode: rank share of rank 1 of 2 with 66 SMs, no heap");
  s = good, s.rank = 2;
  test::expect_invalid([&] { check_rank_share(s, "all_gather_matmul"); }, "rank 2 of 2");
  s = good, s.sm_count = 0;
  test::expect_invalid([&] { check_rank_share(s, "op"); }, "with 0 SMs");
  // A default FaultContext: the kernels' waits would dereference its null abort flag.
  s = good, s.fault = dev::FaultContext{};
  test::expect_invalid([&] { check_rank_share(s, "flash_decode"); }, "rank share of rank 1 has no fault state");
  s = good, s.fault.record = nullptr;
  test::expect_invalid([&] { check_rank_share(s, "op"); }, "wait record 0");
  s = good, s.fault.timeout_ns = 0;
  test::expect_invalid([&] { check_rank_share(s, "op"); }, "timeout 0 ns");
  s = good, s.fault.rank = 0;  // another rank's fault state: its diagnostics would name rank 0
  test::expect_invalid([&] { check_rank_share(s, "op"); }, "rank 0;");
  // Kernels index flags by the heap's rank and world, hosts size them by the share's: they must agree.
  test::HostHeap other(0, 4);
  s = good, s.heap = &other.heap;
  test::expect_invalid([&] { check_rank_share(s, "all_gather"); }, "its heap is rank 0 of 4");
  // A coordinator bounds the op's NCCL calls (CallDeadline): its limit is checked here, at the
  // op's construction, not at a launch that has enqueued part of its work.
  CoordinatorServer server("127.0.0.1", 0, 1);
  CoordinatorClient client("127.0.0.1", server.port(), 0, 1, 10);
  s = good, s.coordinator = &client, s.nccl_call_limit_s = 600;
  check_rank_share(s, "op");  // accepted
  for (const double bad : {0.0, -1.0, std::nan(""), 1e10}) {
    s.nccl_call_limit_s = bad;
    test::expect_invalid([&] { check_rank_share(s, "flash_decode"); }, "has a coordinator and an NCCL call limit of");
  }
  client.finish();
}

}  // namespace
}  // namespace taxfree::bench
