// `taxfree bench --graph` on small, odd shapes of every op this team runs: each variant and part is
// captured into a CUDA graph after one run outside a capture, and the outputs its checks count are
// a graph replay's (poisoned before each), so every variant a serving engine may capture is checked
// as replayed, not only the ones the ops' own graph tests name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu_env.h"
#include "taxfree/bench/harness.h"
#include "taxfree/bench/op_bench.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree {
namespace {

using test::team;

struct GraphCase {
  std::string op;
  std::vector<std::string> shapes;
  std::set<std::string> must_run;  // variants that apply to these shapes at any world
};

// Runs each case's op with --graph and two checked replays per variant: no wrong element, every
// variant of must_run ran and was checked (rank 0 reads the JSON).
void expect_checked_as_replayed_graphs(const std::vector<GraphCase>& cases) {
  Team& t = team();
  for (const GraphCase& gc : cases) {
    ASSERT_GE(t.world(), bench::make_bench(gc.op)->min_ranks()) << gc.op;
    SCOPED_TRACE(gc.op);
    bench::RunRequest req;
    req.ops = {gc.op};
    req.options.graph = true;
    req.options.iters = 4;
    req.options.warmup = 1;
    req.options.check = 2;  // two poisoned replays of the one-run graph per variant
    req.options.shapes = gc.shapes;
    if (gc.op == "all_gather" || gc.op == "put_get")
      req.options.min_bytes = 1000, req.options.max_bytes = 300000, req.options.step_factor = 17;
    req.options.seed = test::test_seed();
    const std::string json = "/tmp/taxfree_bench_graph_" + std::to_string(getpid()) + ".json";
    req.json_path = t.rank() == 0 ? json : "";
    int code = -1;
    try {
      code = bench::run(t, req);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    EXPECT_EQ(code, 0) << "wrong elements in a replayed graph (seed " << req.options.seed << ")";
    if (t.rank() != 0) continue;
    std::ifstream f(json);
    ASSERT_TRUE(f.good()) << json;
    const nlohmann::json d = nlohmann::json::parse(f);
    std::remove(json.c_str());
    EXPECT_TRUE(d["config"]["graph"].get<bool>());
    EXPECT_DOUBLE_EQ(d["rates"]["tax_launch_rate_us"].get<double>(), d["rates"]["graph_launch_us"].get<double>());
    std::set<std::string> ran;
    int checked = 0;
    for (const auto& r : d["results"]) {
      const std::string v = r["variant"].get<std::string>();
      ran.insert(v);
      if (r["nwrong"].get<int64_t>() < 0) continue;  // a part: timed, not checked
      ++checked;
      EXPECT_GT(r["time_us"]["median"].get<double>(), 0.0) << v << " " << r["case"];
      EXPECT_EQ(r["nwrong"].get<int64_t>(), 0) << v << " " << r["case"];
    }
    for (const auto& v : gc.must_run) EXPECT_TRUE(ran.count(v)) << v << " did not run";
    EXPECT_GE(checked, int(gc.must_run.size()));
  }
}

TEST(BenchGraph, EveryVariantIsCheckedAsAReplayedGraph) {
  TF_REQUIRE_GPUS(1);
  const std::vector<GraphCase> cases = {
      {"gemm", {"M=200,N=328,K=520", "M=7,N=264,K=1000"}, {"cublaslt", "ours"}},
      {"decode", {"batch=3,kv=1000,heads=64/8", "batch=2,kv=777,heads=96/12,page=16"}, {"split-kv"}},
      {"flash_decode",
       {"batch=2,kv=777,heads=64/8", "batch=1,kv=3001,heads=96/12", "batch=3,kv=500,heads=64/8,ragged=1"},
       {"bsp", "bsp-plain", "fused", "fused-global"}},
      {"all_gather_matmul",
       {"M=384,N=320,K=776,gather_dim=0,layout=kn", "M=48,N=512,K=2048,gather_dim=1,layout=nk",
        "M=264,N=384,K=1024,gather_dim=1,layout=kn"},
       {"bsp", "bsp-sym", "bsp-own", "decomposed", "decomposed-in-place", "auto", "push", "sm-specialized",
        "fused-ce"}},
  };
  expect_checked_as_replayed_graphs(cases);
}

// The ops that need two ranks, the same way.
TEST(BenchGraph, EveryTwoRankVariantIsCheckedAsAReplayedGraph) {
  TF_REQUIRE_GPUS(2);
  const std::vector<GraphCase> cases = {
      {"all_gather", {}, {"nccl", "nccl-sym", "push"}},
      {"put_get", {"mode=ring"}, {"copy-engine", "put", "get", "put-bulk"}},
      {"signal", {}, {"ping-pong", "one-way"}},
      {"barrier", {}, {"nccl-allreduce", "device", "in-kernel"}},
  };
  expect_checked_as_replayed_graphs(cases);
}

}  // namespace
}  // namespace taxfree
