// all_gather on real GPUs: every variant against the expected shards, odd sizes, guard bands,
// in place, rank skew, 1000 launches without a host-side reset, CUDA-graph replay, validation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>

#include "../../src/bench/bench_util.cuh"
#include "gpu_env.h"
#include "taxfree/ops/all_gather.h"
#include "taxfree/runtime/captured_graph.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree {
namespace {

using test::team;

constexpr uint64_t kGuard = 4096;

// recv with guard bands on both sides, all in the heap.
struct Buffers {
  uint64_t mark;
  char* base;     // guard | recv | guard
  char* recv;
  char* send;     // separate (out of place)
  uint64_t bytes;
  Buffers(uint64_t b) : bytes(b) {
    auto& t = team();
    mark = t.heap().mark();
    base = static_cast<char*>(t.heap().allocate(b * t.world() + 2 * kGuard, 256, "test.ag.recv"));
    recv = base + kGuard;
    send = static_cast<char*>(t.heap().allocate(b, 256, "test.ag.send"));
  }
  ~Buffers() { team().heap().release(mark); }
};

int64_t check_recv(const char* recv, uint64_t bytes, uint64_t seed) {
  int64_t wrong = 0;
  for (int r = 0; r < team().world(); ++r)
    wrong += bench::count_mismatch16(recv + uint64_t(r) * bytes, bytes, seed, uint64_t(r), team().stream());
  return wrong;
}

int64_t check_guards(const Buffers& b) {
  const uint64_t total = b.bytes * team().world();
  return bench::count_mismatch16(b.base, kGuard, 99, 99, team().stream()) +
         bench::count_mismatch16(b.recv + total, kGuard, 98, 98, team().stream());
}

void fill_guards(const Buffers& b) {
  const uint64_t total = b.bytes * team().world();
  bench::fill_random16(b.base, kGuard, 99, 99, team().stream());
  bench::fill_random16(b.recv + total, kGuard, 98, 98, team().stream());
}

// The push variant under both protocols: low-latency lines (default config, small sizes) and
// direct stores (ll disabled, every size).
AllGatherConfig direct_only() {
  AllGatherConfig c;
  c.ll_max_bytes = 0;
  return c;
}

TEST(AllGather, EveryVariantOddSizesGuardsAndInPlace) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  AllGather op(t), direct(t, direct_only());
  auto s = t.stream();
  uint64_t seed = ::taxfree::test::value_seed(1234);  // fresh values every run
  for (uint64_t bytes : {16ull, 48ull, 4112ull, 65536ull, 65536ull + 16, 1000000ull, (48ull << 20) + 16}) {
    for (int which = 0; which < 3; ++which) {
      const auto v = which == 0 ? AllGatherVariant::nccl : AllGatherVariant::push;
      AllGather& impl = which == 2 ? direct : op;
      const char* name = which == 0 ? "nccl" : which == 1 ? (op.push_uses_ll(bytes) ? "push (ll)" : "push") : "push (direct)";
      for (bool in_place : {false, true}) {
        Buffers b(bytes);
        ++seed;
        char* send = in_place ? b.recv + uint64_t(t.rank()) * bytes : b.send;
        bench::fill_random16(send, bytes, seed, uint64_t(t.rank()), s);
        if (!in_place) bench::poison16(b.recv, bytes * t.world(), s);
        else  // poison everything but this rank's own shard
          for (int r = 0; r < t.world(); ++r)
            if (r != t.rank()) bench::poison16(b.recv + uint64_t(r) * bytes, bytes, s);
        fill_guards(b);
        t.sync(s);
        t.host_barrier("ag.poisoned");  // peers write into this rank's recv only after it is poisoned
        impl.launch(v, send, b.recv, bytes, s);
        t.sync(s);
        EXPECT_EQ(check_recv(b.recv, bytes, seed), 0) << name << " " << bytes << " B/rank" << (in_place ? " in place" : "");
        EXPECT_EQ(check_guards(b), 0) << name << " wrote outside recv, " << bytes << " B/rank";
        t.host_barrier("ag.checked");
      }
    }
  }
}

TEST(AllGather, ThousandLaunchesWithoutResetAndRankSkew) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  AllGather op(t);
  auto s = t.stream();
  // Alternates the two protocols on one op instance: they share the launch sequence.
  const uint64_t bytes = 8192 + 16, big = (2 << 20) + 16;
  Buffers b(big);
  std::mt19937 rng(uint32_t(t.rank()) + 5);
  for (int round = 0; round < 4; ++round) {
    const uint64_t seed = ::taxfree::test::value_seed(777 + round), n = round % 2 ? big : bytes;
    bench::fill_random16(b.send, n, seed + 1000, uint64_t(t.rank()), s);  // launch 0's: 249 is odd
    bench::poison16(b.recv, n * t.world(), s);
    t.sync(s);
    t.host_barrier("ag.round");
    // Rank skew: one rank (a different one each round) starts late. Every other launch sends other
    // data (the last sends `seed`'s), so a launch that takes a line or chunk of the launch before
    // it, or leaves recv unwritten, fails the check.
    if (t.rank() == round % t.world()) usleep(50 * 1000 + rng() % 50000);
    for (int i = 0; i < 250; ++i) {
      if (i > 0) bench::fill_random16(b.send, n, (249 - i) % 2 ? seed + 1000 : seed, uint64_t(t.rank()), s);
      op.launch(AllGatherVariant::push, b.send, b.recv, n, s);
    }
    t.sync(s);
    EXPECT_EQ(check_recv(b.recv, n, seed), 0) << "round " << round << ", " << n << " B/rank";
  }
}

class AllGatherGraph : public ::testing::TestWithParam<uint64_t> {};

TEST_P(AllGatherGraph, CudaGraphReplay) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  AllGather op(t);
  auto s = t.stream();
  const uint64_t bytes = GetParam();
  Buffers b(bytes), decoy(bytes);
  // Ten launches alternating two send buffers, ending on b's: a launch that takes data of the one
  // before it, or leaves recv unwritten, fails the check.
  const CapturedGraph graph(s, [&] {
    for (int i = 0; i < 10; ++i) op.launch(AllGatherVariant::push, i % 2 ? b.send : decoy.send, b.recv, bytes, s);
  });
  for (int rep = 0; rep < 5; ++rep) {
    const uint64_t seed = ::taxfree::test::value_seed(4242 + rep);
    bench::fill_random16(b.send, bytes, seed, uint64_t(t.rank()), s);
    bench::fill_random16(decoy.send, bytes, seed + 1000, uint64_t(t.rank()), s);
    bench::poison16(b.recv, bytes * t.world(), s);
    t.sync(s);
    t.host_barrier("ag.graph");
    graph.launch(s);
    t.sync(s);
    EXPECT_EQ(check_recv(b.recv, bytes, seed), 0) << "replay " << rep;
  }
}
// One size per protocol: low-latency lines and direct stores.
INSTANTIATE_TEST_SUITE_P(Protocols, AllGatherGraph, ::testing::Values(uint64_t(4096), uint64_t(4) << 20));

TEST(AllGather, RejectsBadArgumentsBeforeLaunch) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  AllGather op(t);
  char* const op_flags = t.heap().view().local_base + t.heap().mark() - 128;  // its launch sequence's line
  Buffers b(4096);
  char* plain = nullptr;
  TF_CUDA(cudaMalloc(&plain, 4096 * t.world()));
  auto expect_invalid = [&](const char* what, auto fn, const char* needle) {
    try {
      fn();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << what;
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  auto push = AllGatherVariant::push;
  expect_invalid("zero bytes", [&] { op.launch(push, b.send, b.recv, 0, t.stream()); }, "0 bytes");
  expect_invalid("not x16", [&] { op.launch(push, b.send, b.recv, 40, t.stream()); }, "multiple of 16");
  expect_invalid("unaligned", [&] { op.launch(push, b.send + 8, b.recv, 16, t.stream()); }, "16-byte aligned");
  expect_invalid("recv outside heap", [&] { op.launch(push, b.send, plain, 4096, t.stream()); }, "symmetric heap");
  expect_invalid("overlap", [&] { op.launch(push, b.recv + 16, b.recv, 4096, t.stream()); }, "overlap");
  for (auto v : {push, AllGatherVariant::nccl}) {
    expect_invalid("send over the op's flags", [&] { op.launch(v, op_flags, b.recv, 16, t.stream()); },
                   "overlaps the op's flags and staging lines");
    expect_invalid("recv over the op's flags", [&] { op.launch(v, b.send, op_flags, 16, t.stream()); },
                   "recv=");
  }
  expect_invalid("unknown variant", [&] { parse_all_gather_variant("pull"); }, "unknown all_gather variant");
  cudaFree(plain);
}

}  // namespace
}  // namespace taxfree
