#include "taxfree/bench/harness.h"
#include "rates.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "taxfree/device/scoped_memory.cuh"
#include "taxfree/device/stream_read.cuh"
#include "taxfree/runtime/captured_graph.h"
#include "taxfree/runtime/coordinator.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/gpc_layout.h"
#include "taxfree/runtime/team.h"

namespace taxfree::bench {

namespace {

// Timed samples of a case are taken in this many interleaved rounds over its variants (at most
// one round per sample). 4 rounds left whole batches of a variant inside one clock state: r47 timed
// all_gather_matmul's auto and decomposed (the same code) at 2490-2880 us at M = 16384 N = 7168,
// which one read fast depending on the order.
constexpr int kTimingRounds = 16;

// At most this many back-to-back runs in one timed sample, and at most this many launches queued
// behind the gate in one batch (what the stream takes without blocking the host).
constexpr int kMaxRunsPerSample = 64;
constexpr int kMaxGatedLaunches = 600;
// --cold: untimed flushed runs of a variant after another variant's round. With one, the first
// cold sample of a round was 7-9 us slower in 8-16 of 16 rounds (flash_decode fused-global and
// decode-only, 64/8 b=1 4K/16K; the second 0-8, the third 0-5), and a variant timed alone never
// (r254-r257: not the gate, the host, the flush's size or what is queued behind; cause unknown;
// r258: with four, 0-5 of 48 samples slow per row).
constexpr int kColdSwitchRuns = 4;

// Holds the stream until the host has queued a whole timed batch, so the GPU never waits for the
// host's launches inside a timed region. Bounded: after `timeout_ns` it lets the batch run anyway
// and writes its ticket to gate[1], so the host can say the batch's samples include its launches.
__global__ void gate_kernel(uint32_t* gate, uint32_t ticket, uint64_t timeout_ns) {
  const uint64_t start = dev::global_timer_ns();
  while (dev::load<dev::Sem::relaxed, dev::Scope::sys>(gate) < ticket)
    if (dev::global_timer_ns() - start > timeout_ns) {
      dev::store<dev::Sem::relaxed, dev::Scope::sys>(gate + 1, ticket);
      break;
    }
}

// --cold's flush: reads a buffer of four times the L2, so that every line a timed op touches is
// evicted and the L2 holds clean lines, as after a layer whose weights streamed through it. The
// memset it replaces left dirty lines, whose write-backs the timed op then paid beside its own
// reads (r246: 1.4-4.6 us of small cold decode shapes).
__global__ void l2_evict_kernel(const uint4* words, int64_t count, uint32_t* sink) {
  dev::stream_read(words, count, sink);
}

// Sum of every rank's value (all ranks call; the coordinator carries it).
int64_t sum_over_ranks(Team& team, const std::string& key, int64_t v) {
  auto all = team.coordinator().all_gather(key, std::to_string(v), 120);
  int64_t sum = 0;
  for (const auto& s : all) sum += std::stoll(s);
  return sum;
}

std::string fmt(double v, int prec = 2) {
  if (v <= 0) return "-";
  std::ostringstream os;
  os << std::fixed << std::setprecision(v >= 1e5 ? 0 : prec) << v;
  return os.str();
}

struct Row {
  int reps = 1;  // runs per timed sample
  std::string op, variant;
  Case c;
  Stats us;
  std::vector<double> samples_us;  // this rank's samples, µs per run, in the order taken
  Figures fig;
  int64_t wrong = -1;  // -1: not checked
  double floor_us = 0;
  double host_us = 0;  // host wall time to enqueue one run, slowest rank
  std::string bound;
};

void print_header(const std::string& op, const Team& team, const Options& o) {
  std::printf("#\n# taxfree bench %s   ranks %d   iters %d   warmup %d   check %d   cold-L2 %d   graph %d   sample %g us\n",
              op.c_str(), team.world(), o.iters, o.warmup, o.check, int(o.cold_l2), int(o.graph), o.sample_us);
  std::printf("#%12s %12s %6s %-12s %10s %10s %10s %8s %8s %7s %8s %7s %9s %9s  %s\n", "size(B)", "count", "type",
              "variant", "time(us)", "min(us)", "max(us)", "algbw", "busbw", "#wrong", "TFLOP/s", "vs-bsp",
              "floor(us)", "host(us)", "case");
}

void print_row(const Row& r, double base_us) {
  const std::string wrong = r.wrong < 0 ? "N/A" : std::to_string(r.wrong);
  const std::string speed = base_us > 0 ? fmt(base_us / r.us.median, 2) + "x" : "-";
  std::printf(" %12lld %12lld %6s %-12s %10s %10s %10s %8s %8s %7s %8s %7s %9s %9s  %s\n",
              static_cast<long long>(r.c.size_bytes), static_cast<long long>(r.c.count), r.c.type.c_str(),
              r.variant.c_str(), fmt(r.us.median).c_str(), fmt(r.us.min).c_str(), fmt(r.us.max).c_str(),
              fmt(r.fig.algbw_gbs).c_str(), fmt(r.fig.busbw_gbs).c_str(), wrong.c_str(), fmt(r.fig.tflops, 1).c_str(),
              speed.c_str(), fmt(r.floor_us).c_str(), fmt(r.host_us).c_str(), r.c.label.c_str());
  std::fflush(stdout);
}

nlohmann::json row_json(const Row& r) {
  return {{"op", r.op},
          {"variant", r.variant},
          {"case", r.c.label},
          {"params", r.c.params},
          {"size", r.c.size_bytes},
          {"count", r.c.count},
          {"type", r.c.type},
          {"time_us", {{"median", r.us.median}, {"min", r.us.min}, {"max", r.us.max}}},
          {"algbw_gbs", r.fig.algbw_gbs},
          {"busbw_gbs", r.fig.busbw_gbs},
          {"tflops", r.fig.tflops},
          {"nwrong", r.wrong},
          {"floor_us", r.floor_us},
          {"floor_bound", r.bound},
          {"host_us", r.host_us},
          {"runs_per_sample", r.reps},
          {"samples_us", r.samples_us}};
}

// --graph: `runs` back-to-back runs of one variant captured into a CUDA graph, replayed by
// launch(). The variant has run once outside a capture (its plans, attributes and workspaces
// exist), so the capture records only stream work; a variant that synchronises or allocates while
// captured fails here with the op and variant named.
class RunGraph {
 public:
  RunGraph(OpBench& bench, const std::string& op, const std::string& variant, int runs, cudaStream_t s)
      : graph_(
            s, [&] { for (int i = 0; i < runs; ++i) bench.run(variant, s); },
            "--graph: " + op + " variant '" + variant + "'") {}
  void launch(cudaStream_t s) const { graph_.launch(s); }

 private:
  CapturedGraph graph_;
};

uint32_t* g_gate = nullptr;  // host-mapped gate of the current run: [0] opens, [1] the last ticket that expired
uint32_t g_gate_ticket = 0;

}  // namespace

std::string format_gpu_uuid(const unsigned char (&bytes)[16]) {
  std::ostringstream s;
  s << "GPU-" << std::hex << std::setfill('0');
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s << '-';
    s << std::setw(2) << int(bytes[i]);
  }
  return s.str();
}

std::vector<double> all_gather_doubles(CoordinatorClient& coordinator, const std::string& key, double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", v);  // 17 significant digits read back to the same double
  std::vector<double> out;
  for (const std::string& s : coordinator.all_gather(key, text, 120)) out.push_back(std::strtod(s.c_str(), nullptr));
  return out;
}

int runs_per_sample(const Options& o, double run_s, int launches) {
  // A NaN sample_us made int(clamp(NaN)) undefined; no iterations divided by zero below.
  TF_REQUIRE(std::isfinite(o.sample_us) && o.sample_us > 0 && o.iters >= 1, Status::InvalidArgument,
             "bench options: sample_us=" << o.sample_us << " must be finite and > 0, iters=" << o.iters << " >= 1");
  if (o.cold_l2) return 1;
  const double wanted = std::ceil(o.sample_us * 1e-6 / std::max(run_s, 1e-7));
  const int batch = (o.iters + kTimingRounds - 1) / kTimingRounds;  // samples per variant and round
  const int fit = (kMaxGatedLaunches / batch - 3) / std::max(launches, 1);
  return std::max(1, std::min(fit, int(std::clamp(wanted, 1.0, double(kMaxRunsPerSample)))));
}

double max_over_ranks(CoordinatorClient& coordinator, const std::string& key, double v) {
  double m = v;
  for (double x : all_gather_doubles(coordinator, key, v)) m = std::max(m, x);
  return m;
}

double bus_factor(const std::string& collective, int world) {
  const double n = world;
  if (collective == "all_reduce") return 2 * (n - 1) / n;
  if (collective == "all_gather" || collective == "reduce_scatter" || collective == "all_to_all")
    return (n - 1) / n;
  if (collective == "broadcast" || collective == "reduce" || collective == "p2p") return 1;
  TF_THROW(Status::InvalidArgument, "no bus-bandwidth factor for collective '" << collective << "'");
}

Stats summarize(std::vector<double> v) {
  TF_REQUIRE(!v.empty(), Status::Internal, "summary of an empty sample");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

int run(Team& team, const RunRequest& req) {
  const bool summary_mode = req.ops.empty();
  const std::vector<std::string> ops = summary_mode ? bench_names() : req.ops;
  const Options& opt = req.options;
  const bool root = team.rank() == 0;
  cudaStream_t s = team.stream();

  // Every op's checks that need the world, before any op runs: a later op's mistake must not cost
  // an earlier op's results.
  struct OpPlan {
    std::string name;
    std::unique_ptr<OpBench> bench;
    std::vector<std::string> all_variants, variants, parts, named_parts;
    std::vector<Case> cases;
  };
  std::vector<OpPlan> plans;
  const bool filtered = !opt.shapes.empty() || opt.min_bytes > 0 || opt.max_bytes > 0;
  for (const auto& name : ops) {
    OpPlan& p = plans.emplace_back();
    p.name = name;
    p.bench = make_bench(name);
    if (team.world() < p.bench->min_ranks()) {
      TF_REQUIRE(summary_mode, Status::InvalidUsage,
                 "op '" << name << "' needs at least " << p.bench->min_ranks() << " ranks (GPUs); this job has "
                        << team.world());
      continue;  // skipped, with a line in the output
    }
    p.all_variants = p.bench->variants();
    p.parts = p.bench->parts();
    // --variant may also name parts (timed, not checked); without it every variant and part runs.
    for (const auto& v : opt.variants.empty() ? p.all_variants : opt.variants) {
      const bool part = std::find(p.parts.begin(), p.parts.end(), v) != p.parts.end();
      TF_REQUIRE(part || std::find(p.all_variants.begin(), p.all_variants.end(), v) != p.all_variants.end(),
                 Status::InvalidArgument, "op '" << name << "' has no variant or part '" << v << "'");
      (part ? p.named_parts : p.variants).push_back(v);
    }
    p.cases = p.bench->cases(opt, team);
    // A named op whose filters select nothing ran nothing and passed: a typo in a --shape value
    // (e.g. a size no sweep takes) must not read as a green run. Without filters, a default sweep
    // may have no shape this world divides (all_gather_matmul at 3 ranks): said in the output.
    TF_REQUIRE(!p.cases.empty() || summary_mode || !filtered, Status::InvalidArgument,
               "op '" << name << "': no case matches the --shape entries and -b/-e sizes given at " << team.world()
                      << " rank(s); an entry of only some keys selects from the default sweep");
  }

  MachineRates rates = measure_rates(team);
  rates.per_launch_s = opt.graph ? rates.graph_launch_s : rates.launch_s;
  if (root)
    std::printf("# measured: HBM copy %.0f GB/s, NVLink copy engine %.0f GB/s, flag one-way %.2f us, launch %.2f us "
                "(graph %.2f us)\n",
                rates.hbm_bytes_per_s * 1e-9, rates.nvlink_bytes_per_s * 1e-9, rates.flag_latency_s * 1e6,
                rates.launch_s * 1e6, rates.graph_launch_s * 1e6);
  // Where clusters land differs between chips of one model (floorsweeping), and with it what the
  // clustered plans choose: every run names its GPU's GPCs (gpc_layout.h).
  const std::string gpcs = to_string(device_gpc_layout(team.device()));
  if (root) std::printf("# GPCs (count x usable SMs, rank 0's GPU): %s\n", gpcs.c_str());

  nlohmann::json results = nlohmann::json::array(), summary = nlohmann::json::array();
  int64_t total_wrong = 0;
  void* flush = nullptr;
  size_t flush_bytes = 0;
  if (opt.cold_l2) {
    cudaDeviceProp p{};
    TF_CUDA(cudaGetDeviceProperties(&p, team.device()));
    flush_bytes = size_t(p.l2CacheSize) * 4;
    TF_CUDA(cudaMalloc(&flush, flush_bytes));
    TF_CUDA(cudaMemset(flush, 0x5a, flush_bytes));  // its dirty lines go back during the first flush
  }
  const auto flush_l2 = [&](cudaStream_t st) {
    l2_evict_kernel<<<team.sm_count() * 4, 256, 0, st>>>(static_cast<const uint4*>(flush), int64_t(flush_bytes / 16),
                                                          static_cast<uint32_t*>(flush));
    TF_CUDA(cudaGetLastError());
  };
  Event ev0, ev1;
  TF_CUDA(cudaHostAlloc(&g_gate, 2 * sizeof(uint32_t), cudaHostAllocMapped));
  g_gate[0] = g_gate[1] = 0;
  g_gate_ticket = 0;
  bool killed_once = false;

  for (OpPlan& plan : plans) {
    const std::string& name = plan.name;
    const std::unique_ptr<OpBench> bench = std::move(plan.bench);  // its buffers go before the next op's
    if (team.world() < bench->min_ranks()) {
      if (root) std::printf("#\n# %s: skipped, needs %d ranks\n", name.c_str(), bench->min_ranks());
      continue;
    }
    if (plan.cases.empty()) {
      if (root) std::printf("#\n# %s: skipped, no case of its default sweep fits %d rank(s)\n", name.c_str(), team.world());
      continue;
    }
    const std::vector<std::string>&all_variants = plan.all_variants, &variants = plan.variants, &parts = plan.parts,
                                    &named_parts = plan.named_parts;
    const std::vector<Case>& cases = plan.cases;
    if (root) print_header(name, team, opt);
    for (const auto& c : cases) {
      bench->setup(team, c, opt);
      // Setup's uploads land before any variant runs on the team's stream: a pageable cudaMemcpy
      // may return with its last DMA in flight, ordered only before later legacy-stream work.
      TF_CUDA(cudaDeviceSynchronize());
      std::map<std::string, double> medians;
      std::vector<Row> rows;
      std::vector<std::string> timed = variants;
      for (const auto& p : summary_mode || opt.variants.empty() ? parts : named_parts) timed.push_back(p);
      // Per variant: check, warm up, and the runs per timed sample. --graph: one run outside a
      // capture, then the checks, warm-up and timing run through captured graphs (the checked
      // outputs are a graph replay's).
      std::vector<Row> pending;
      // --graph, per pending row: one run (checks, warm-up, the untimed run before each round) and
      // the sample's runs (null where that is one run).
      struct Graphs {
        std::unique_ptr<RunGraph> one, sample;
      };
      std::vector<Graphs> graphs;
      // Row vi's one run, or its sample's runs: replayed graphs (--graph) or the runs themselves.
      const auto run_one = [&](size_t vi, const std::string& v) {
        if (opt.graph) graphs[vi].one->launch(s);
        else bench->run(v, s);
      };
      const auto run_sample = [&](size_t vi) {
        if (opt.graph) (graphs[vi].sample ? graphs[vi].sample : graphs[vi].one)->launch(s);
        else
          for (int k = 0; k < pending[vi].reps; ++k) bench->run(pending[vi].variant, s);
      };
      for (const auto& v : timed) {
        if (!bench->applies(c, v)) continue;
        const bool is_part = std::find(variants.begin(), variants.end(), v) == variants.end();
        Row row;
        row.op = name;
        row.variant = v;
        row.c = c;
        const size_t vi = pending.size();
        if (opt.graph) {
          team.device_barrier(s);
          bench->run(v, s);
          TF_CUDA(cudaGetLastError());
          team.sync(s);
          graphs.push_back({std::make_unique<RunGraph>(*bench, name, v, 1, s), nullptr});
        }
        const auto run_once = [&] { run_one(vi, v); };
        if (!is_part && opt.check > 0) {
          int64_t wrong = 0;
          for (int k = 0; k < opt.check; ++k) {
            // Poison writes op buffers peers may still read from the last checked run (decomposed
            // reads its own shard back from a peer's gathered A, with no end barrier).
            team.device_barrier(s);
            bench->poison(s);
            team.device_barrier(s);
            run_once();
            TF_CUDA(cudaGetLastError());
            team.sync(s);
            wrong += bench->check(v, s);
          }
          row.wrong = sum_over_ranks(team, team.coordinator().next_key("bench.wrong"), wrong);
          total_wrong += row.wrong;
        }
        if (req.kill_rank == team.rank() && !killed_once) {
          std::fprintf(stderr, "[taxfree rank %d] --inject kill: killing myself mid-run\n", team.rank());
          std::fflush(stderr);
          ::kill(::getpid(), SIGKILL);
        }
        killed_once = true;
        for (int i = 0; i < opt.warmup; ++i) {
          team.device_barrier(s);
          run_once();
        }
        team.device_barrier(s);
        TF_CUDA(cudaEventRecord(ev0.e, s));
        run_once();
        TF_CUDA(cudaEventRecord(ev1.e, s));
        team.sync(s);
        const int reps = runs_per_sample(opt, elapsed_s(ev0, ev1), bench->launches(v));
        row.reps = int(max_over_ranks(team.coordinator(), team.coordinator().next_key("bench.reps"), reps));
        if (opt.graph && row.reps > 1) graphs[vi].sample = std::make_unique<RunGraph>(*bench, name, v, row.reps, s);
        pending.push_back(std::move(row));
      }
      // Timed samples in interleaved rounds, each round starting one variant later and every other
      // round in reverse order, so no variant always follows the same one: every variant sees the
      // GPUs in the same mix of states (clocks and power after the heavy variants drift by 5-15%
      // over a case: r29/r30 timed one code path 761 and 885 us depending on what ran before).
      const int rounds = std::min(opt.iters, kTimingRounds);
      std::vector<std::vector<double>> samples(pending.size());
      // Host wall time of enqueueing the runs (validation, planning, launches; with --graph a graph's
      // launch): an eager caller pays it per call, and the gated GPU samples hide it. Only run_sample
      // is timed (flushes, barriers and events are the harness's). Per variant, each batch's sum
      // scaled as its samples are; over the sample count at the end: total / runs, not a median.
      std::vector<double> host_s(pending.size());
      const size_t nv = pending.size();
      for (int r = 0; r < rounds; ++r)
        for (size_t j = 0; j < nv; ++j) {
          const size_t vi = ((r % 2 == 0 ? j : nv - 1 - j) + size_t(r)) % nv;
          const std::string& v = pending[vi].variant;
          const int reps_all = pending[vi].reps;
          const int n = opt.iters / rounds + (r < opt.iters % rounds ? 1 : 0);
          // Untimed: the variant's first runs after another's. Cold, kColdSwitchRuns of them, each
          // behind its own flush: the first cold samples after a switch read slow (see kColdSwitchRuns).
          for (int k = 0; k < (flush ? kColdSwitchRuns : 1); ++k) {
            if (flush) flush_l2(s);
            team.device_barrier(s);
            run_one(vi, v);
          }
          std::vector<Event> starts(static_cast<size_t>(n)), stops(static_cast<size_t>(n));
          // Queue the whole batch behind a gate when it fits the stream's queue.
          // A graph's kernels are counted as its runs' launches: nothing says the stream queues them as one.
          const bool gated = double(n) * (3 + reps_all * bench->launches(v)) <= kMaxGatedLaunches;
          // The peers' first barrier of the batch waits for this rank's gate: it opens by itself well
          // within their device deadline (a stalled host then costs a warning, not the job).
          const double gate_s = std::min(20.0, 0.5 * team.timeout_s());
          if (gated) gate_kernel<<<1, 1, 0, s>>>(g_gate, ++g_gate_ticket, uint64_t(gate_s * 1e9));
          double batch_host_s = 0;
          for (int i = 0; i < n; ++i) {
            if (flush) flush_l2(s);
            team.device_barrier(s);
            TF_CUDA(cudaEventRecord(starts[size_t(i)].e, s));
            const auto t0 = std::chrono::steady_clock::now();
            run_sample(vi);
            batch_host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            TF_CUDA(cudaEventRecord(stops[size_t(i)].e, s));
          }
          if (gated) __atomic_store_n(g_gate, g_gate_ticket, __ATOMIC_RELEASE);
          team.sync(s);
          if (gated && __atomic_load_n(g_gate + 1, __ATOMIC_ACQUIRE) == g_gate_ticket)
            std::fprintf(stderr,
                         "[taxfree rank %d] bench %s %s, variant %s: the timing gate opened at its deadline (%g s) "
                         "before the host had queued the batch; these samples include host launch time\n",
                         team.rank(), name.c_str(), pending[vi].c.label.c_str(), v.c_str(), gate_s);
          const double per_run = bench->ops_per_run(c, v);
          for (int i = 0; i < n; ++i) samples[vi].push_back(elapsed_s(starts[size_t(i)], stops[size_t(i)]) / reps_all / per_run);
          host_s[vi] += batch_host_s / reps_all / per_run;
        }
      for (size_t vi = 0; vi < pending.size(); ++vi) {
        Row& row = pending[vi];
        Stats st = summarize(samples[vi]);
        for (double x : samples[vi]) row.samples_us.push_back(x * 1e6);
        // The op's time is the slowest rank's.
        const std::string k = team.coordinator().next_key("bench.time");
        st.median = max_over_ranks(team.coordinator(), k + "m", st.median);
        st.min = max_over_ranks(team.coordinator(), k + "n", st.min);
        st.max = max_over_ranks(team.coordinator(), k + "x", st.max);
        row.host_us = max_over_ranks(team.coordinator(), k + "h", host_s[vi] / double(samples[vi].size())) * 1e6;
        medians[row.variant] = st.median;
        row.fig = bench->figures(c, st.median);
        row.us = {st.median * 1e6, st.min * 1e6, st.max * 1e6};
        const Floor fl = bench->floor(c, rates);
        row.floor_us = fl.seconds * 1e6;
        row.bound = fl.bound;
        rows.push_back(std::move(row));
      }
      graphs.clear();  // before the buffers they captured go
      bench->teardown();
      // The baseline is the fastest of the op's BSP variants that ran.
      const int nbase = bench->baseline_count();
      std::string base_name;
      for (int i = 0; i < nbase && i < int(all_variants.size()); ++i)
        if (medians.count(all_variants[size_t(i)]) && (base_name.empty() || medians[all_variants[size_t(i)]] < medians[base_name]))
          base_name = all_variants[size_t(i)];
      const double base_us = base_name.empty() ? 0 : medians[base_name] * 1e6;
      for (const auto& r : rows) {
        if (root) print_row(r, base_us);
        results.push_back(row_json(r));
      }
      // Summary entry: baseline vs the fastest other variant.
      std::string best;
      const auto base_end = all_variants.begin() + std::min<size_t>(size_t(nbase), all_variants.size());
      for (const auto& v : variants)
        if (medians.count(v) && std::find(all_variants.begin(), base_end, v) == base_end &&
            (best.empty() || medians[v] < medians[best]))
          best = v;
      const Taxes tx = bench->taxes(c, medians, rates);
      nlohmann::json e = {{"op", name}, {"case", c.label}, {"size", c.size_bytes}, {"baseline", base_name},
                          {"baseline_us", base_us}, {"floor_us", rows.empty() ? 0.0 : rows.front().floor_us},
                          {"tax_bulk_synchronous_us", tx.bulk_synchronous * 1e6},
                          {"tax_data_locality_us", tx.data_locality * 1e6}, {"tax_launch_us", tx.launch * 1e6}};
      if (!best.empty()) {
        e["best"] = best;
        e["best_us"] = medians[best] * 1e6;
        e["speedup"] = base_us > 0 ? base_us / (medians[best] * 1e6) : 0.0;
      }
      summary.push_back(e);
    }
  }
  if (flush) cudaFree(flush);
  cudaFreeHost(g_gate);
  g_gate = nullptr;

  if (root && summary_mode) {
    std::printf("#\n# summary (BSP = each op's baseline; taxes in us, '-' where one does not apply)\n");
    std::printf("# %-12s %-34s %10s %-12s %10s %8s %10s %8s %8s %8s\n", "op", "case", "bsp(us)", "best", "best(us)",
                "speedup", "floor(us)", "bsp-tax", "locality", "launch");
    for (const auto& e : summary) {
      auto num = [&](const char* k) { return e.contains(k) ? e[k].get<double>() : 0.0; };
      std::printf("  %-12s %-34s %10s %-12s %10s %8s %10s %8s %8s %8s\n", e["op"].get<std::string>().c_str(),
                  e["case"].get<std::string>().c_str(), fmt(num("baseline_us")).c_str(),
                  e.contains("best") ? e["best"].get<std::string>().c_str() : "-", fmt(num("best_us")).c_str(),
                  e.contains("speedup") ? (fmt(num("speedup")) + "x").c_str() : "-", fmt(num("floor_us")).c_str(),
                  fmt(num("tax_bulk_synchronous_us")).c_str(), fmt(num("tax_data_locality_us")).c_str(),
                  fmt(num("tax_launch_us")).c_str());
    }
  }
  if (root) {
    std::printf("# wrong elements in total: %lld %s\n", static_cast<long long>(total_wrong), total_wrong ? "FAIL" : "OK");
    std::fflush(stdout);
  }
  cudaDeviceProp p{};
  TF_CUDA(cudaGetDeviceProperties(&p, team.device()));
  unsigned char uuid[16];
  std::memcpy(uuid, p.uuid.bytes, sizeof uuid);
  // Each rank's GPU, in rank order, for rank 0's JSON. Gathered whether or not a rank was given a
  // path: only rank 0 writes, so callers may pass the path to rank 0 alone.
  CoordinatorClient& coordinator = team.coordinator();
  const std::vector<std::string> gpus =
      coordinator.all_gather(coordinator.next_key("bench.gpu_uuid"), format_gpu_uuid(uuid), 60);
  if (root && !req.json_path.empty()) {
    int nccl = 0;
    ncclGetVersion(&nccl);
    nlohmann::json env = nlohmann::json::object();
    for (const char* k : {"NCCL_NVLS_ENABLE", "NCCL_PROTO", "NCCL_ALGO", "TAXFREE_TIMEOUT_S", "TAXFREE_HEAP_BYTES",
                          "CUDA_VISIBLE_DEVICES"})
      if (const char* v = std::getenv(k)) env[k] = v;
    nlohmann::json doc = {
        {"config",
         {{"ops", ops}, {"iters", opt.iters}, {"warmup", opt.warmup}, {"check", opt.check}, {"cold_l2", opt.cold_l2}, {"graph", opt.graph},
          {"sample_us", opt.sample_us}, {"dtype", opt.dtype}, {"ranks", team.world()}, {"min_bytes", opt.min_bytes},
          {"max_bytes", opt.max_bytes}, {"step_factor", opt.step_factor}}},
        {"env", env},
        {"nccl_version", nccl},
        {"device", p.name},
        {"device_uuids", gpus},
        {"gpcs", gpcs},
        {"rates",
         {{"hbm_gbs", rates.hbm_bytes_per_s * 1e-9}, {"nvlink_ce_gbs", rates.nvlink_bytes_per_s * 1e-9},
          {"flag_latency_us", rates.flag_latency_s * 1e6}, {"launch_us", rates.launch_s * 1e6},
          {"graph_launch_us", rates.graph_launch_s * 1e6}, {"tax_launch_rate_us", rates.per_launch_s * 1e6}}},
        {"results", results},
        {"summary", summary},
        {"wrong_total", total_wrong}};
    std::ofstream f(req.json_path);
    TF_REQUIRE(f.good(), Status::SystemError, "cannot write JSON to '" << req.json_path << "'");
    f << doc.dump(2) << "\n";
  }
  return total_wrong ? kExitWrongResult : kExitOk;
}

}  // namespace taxfree::bench
