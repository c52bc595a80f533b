// One benchmark descriptor per op (nccl-tests' testColl, generalised to fused ops).
//
// The harness owns timing, alignment, poisoning, checking, printing and JSON; an op only says what
// its cases are, how to set one up with fresh random inputs, how to run one variant once, and how
// to count wrong elements. Every op joins `taxfree bench` by registering one OpBench.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace taxfree {
class Team;
}

namespace taxfree::bench {

// Sweep options from the command line (nccl-tests letters).
struct Options {
  int64_t min_bytes = -1;  // -b; <0: the op's default sweep
  int64_t max_bytes = -1;  // -e
  double step_factor = 2;  // -f
  int iters = 20;          // -n
  int warmup = 5;          // -w
  int check = 1;           // -c: checked runs per case and variant (0 = no check)
  bool cold_l2 = false;    // --cold: flush L2 before every timed run (one run per sample)
  // --graph: every variant runs as a CUDA graph, as a serving engine replays its captured step:
  // one run captured for the checks, each sample's back-to-back runs captured once and replayed.
  // The kernels' own launch gaps then cost what graph nodes cost, not what stream launches do.
  bool graph = false;
  // --sample-us: each timed sample runs the op back to back until about this long (1-64 runs), so
  // what one sample adds once (the start event behind the barrier kernel: ~1.2 us at 20 us, r127)
  // and run-to-run jitter are spread over several runs.
  double sample_us = 200;
  std::string dtype = "bf16";
  std::vector<std::string> variants;  // --variant; empty = all of the op's
  std::vector<std::string> shapes;    // --shape NAME=V,...; op-specific filters
  uint64_t seed = 0x7A3F'2026;
  int skip_signal_rank = -1;          // --inject skip-signal:R: rank R's ops never signal (tests the timeout path)
  int ranks = 0;  // -g when given (check_options refuses shapes that world cannot split); 0: all visible, not yet known
};

// One row of the sweep.
struct Case {
  std::string label;     // human-readable shape, e.g. "M=8192 N=4096 K=8192"
  int64_t size_bytes;    // the `size` column: total bytes the op produces (nccl-tests convention)
  int64_t count;         // the `count` column: elements per rank passed to the op
  std::string type;      // the `type` column
  nlohmann::json params; // op-specific shape parameters, echoed into the JSON
};

// Throughput figures for one timed case; the harness fills time.
struct Figures {
  double algbw_gbs = 0;   // bytes / time (nccl-tests algbw); 0 where it does not apply
  double busbw_gbs = 0;   // algbw * bus factor; 0 where it does not apply
  double tflops = 0;      // 0 for pure communication
};

// Rates measured by the harness at start, on this machine, in this run.
struct MachineRates {
  double hbm_bytes_per_s = 0;     // device-to-device copy, bytes read + written per second
  double nvlink_bytes_per_s = 0;  // copy engine to one peer, one direction (0 with one rank)
  double flag_latency_s = 0;      // one-way signal latency, half a ping-pong round trip (0 with one rank)
  double launch_s = 0;            // empty kernel, back to back
  double graph_launch_s = 0;      // empty kernel inside a CUDA graph
  // The launch tax's rate for this run, set by the harness: launch_s, or graph_launch_s when the
  // ops run as CUDA graphs (Options::graph).
  double per_launch_s = 0;
};

// Floor for the summary: time no implementation can beat, from the measured rates.
struct Floor {
  double seconds = 0;
  std::string bound;      // "compute", "hbm", "nvlink", "latency"
};

// The three taxes of one case (as the project's DESIGN.md defines them; README, "Design"), in
// seconds; negative = does not apply.
struct Taxes {
  double bulk_synchronous = -1;  // BSP time - max(compute-only, communication-only)
  double data_locality = -1;     // extra HBM round trips of intermediates
  double launch = -1;            // kernels per run x measured launch cost
};

class OpBench {
 public:
  virtual ~OpBench() = default;
  virtual std::string name() const = 0;
  // Variant names; the first baseline_count() are the bulk-synchronous baselines (e.g. NCCL on
  // plain buffers and on a symmetric window); the others are compared with the fastest of those.
  virtual std::vector<std::string> variants() const = 0;
  virtual int baseline_count() const { return 1; }
  // Operations one run() performs (latency benchmarks loop inside one run); times are divided by it.
  virtual double ops_per_run(const Case&, const std::string& variant) const { (void)variant; return 1; }
  // Fewest ranks the op needs; the harness reports "skipped: needs N ranks" below that.
  virtual int min_ranks() const { return 1; }
  virtual std::vector<Case> cases(const Options& opt, const Team& team) const = 0;
  // Whether `variant` (or part) runs on case `c`; one that does not (e.g. a variant for one layout
  // only) gets no row there and is left out of the case's summary.
  virtual bool applies(const Case& c, const std::string& variant) const {
    (void)c, (void)variant;
    return true;
  }
  // Rejects options this op cannot take (e.g. malformed --shape entries, sizes past the op's
  // limits, or, when opt.ranks is known, that many ranks cannot split) with InvalidArgument.
  // Called by the CLI before any rank starts (for every op when none is named), so it must not
  // touch CUDA. Default: no --shape entries at all (an op with shape
  // keys checks its own: check_shape_entries, harness.h).
  virtual void check_options(const Options& opt) const;
  // Allocate buffers and draw fresh random inputs for `c` (never zeros).
  virtual void setup(Team& team, const Case& c, const Options& opt) = 0;
  // Fill every output with a poison pattern so unwritten elements are caught by check().
  virtual void poison(cudaStream_t stream) = 0;
  // Launch `variant` once on `stream`. Must be valid to call back to back without host work, and
  // capturable into a CUDA graph after one run outside a capture (--graph): no synchronisation,
  // allocation or pageable host copy on the second and later calls, and no host-side state that
  // check() relies on (a replayed graph runs without calling run(): count on the device).
  virtual void run(const std::string& variant, cudaStream_t stream) = 0;
  // Compare the last run's outputs with a reference; returns the number of wrong elements.
  virtual int64_t check(const std::string& variant, cudaStream_t stream) = 0;
  virtual Figures figures(const Case& c, double seconds) const = 0;
  virtual Floor floor(const Case&, const MachineRates&) const { return {}; }
  // Extra timed runs that are not variants but feed the tax breakdown (e.g. "comm-only",
  // "compute-only"); run() accepts these names too, check() is not called for them.
  virtual std::vector<std::string> parts() const { return {}; }
  // Tax breakdown from the median times of every variant and part of this case.
  virtual Taxes taxes(const Case& c, const std::map<std::string, double>& seconds, const MachineRates& rates) const {
    (void)seconds;
    Taxes t;
    const std::string& base = variants().front();
    t.launch = launches(base) / ops_per_run(c, base) * rates.per_launch_s;
    return t;
  }
  // Kernels launched per run() of `variant` (launch-tax column; also bounds how many runs the
  // harness queues at once).
  virtual int launches(const std::string& variant) const { (void)variant; return 1; }
  // Release what setup() took.
  virtual void teardown() = 0;
};

// Registry: the list of ops lives in one place, src/bench/registry.cc; each op's bench file
// defines one factory that the registry names.
std::vector<std::string> bench_names();
std::unique_ptr<OpBench> make_bench(const std::string& name);  // throws InvalidArgument if unknown

}  // namespace taxfree::bench
