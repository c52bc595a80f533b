// The benchmark driver behind `taxfree bench` (nccl-tests conventions, the benchmark protocol of
// the project's DESIGN.md, kept beside the repository):
// ranks aligned by a device barrier before every timed iteration, warm-up, CUDA-event timing,
// median (min/max) per rank and the slowest rank's median reported, optional cold L2, every case
// checked against a reference, JSON beside the table.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "taxfree/bench/op_bench.h"

namespace taxfree {
class Team;
class CoordinatorClient;
}

namespace taxfree::bench {

struct RunRequest {
  std::vector<std::string> ops;  // empty: every registered op, default sweeps, with the summary
  Options options;
  std::string json_path;         // empty: no JSON; rank 0's is written (the others' are not read)
  int kill_rank = -1;            // --inject kill:R: rank R kills itself mid-run (tests fault handling)
};

// Runs the request on this rank (all ranks call it). Rank 0 prints. Returns the process exit code:
// kExitWrongResult if any element was wrong, kExitOk otherwise; errors are thrown.
int run(Team& team, const RunRequest& request);

// nccl-tests' bus-bandwidth factor for a collective over `world` ranks.
double bus_factor(const std::string& collective, int world);

// Median / min / max of a sample (the sample is reordered).
struct Stats {
  double median = 0, min = 0, max = 0;
};
Stats summarize(std::vector<double> samples);

// Every rank's `v` (collective: all ranks call it with the same key), exact: each value travels as
// text that reads back to the same double (std::to_string's "%f" kept 6 decimals, so a time in
// seconds came back in whole microseconds: before f74dfd9 every cross-rank median, min, max and the
// flag latency were rounded that way). max_over_ranks: the largest of them (the slowest rank's).
std::vector<double> all_gather_doubles(CoordinatorClient& coordinator, const std::string& key, double v);
double max_over_ranks(CoordinatorClient& coordinator, const std::string& key, double v);

// Back-to-back runs in one timed sample, for a run that took `run_s` alone and makes `launches`
// launches: about o.sample_us worth (so what a sample adds once and the launch gaps of small ops do
// not dominate; nccl-tests also times back-to-back runs), 1-64, no more than lets a round's batch of
// samples queue behind the gate (each sample: 3 items + runs x launches, at most 600 items), and 1
// with a cold L2 (every run follows its own flush; a round then starts with four untimed flushed
// runs, see harness.cu).
int runs_per_sample(const Options& o, double run_s, int launches);

// The largest size (-b/-e, a bytes --shape key): 1 PiB, past any GPU's memory, so a size times
// the world or a sweep step, and every allocation computed from it, stays inside int64.
inline constexpr int64_t kMaxBytes = int64_t(1) << 50;

// Parse "-b 1K", "64M", "1G" (powers of 1024) into bytes, at most kMaxBytes; throws InvalidArgument
// naming the text.
int64_t parse_bytes(const std::string& text);

// `text` as an integer in [min, max], written in plain decimal digits (no sign, space, exponent or
// suffix: strtoll's "+5", " 5" and "5abc" are typos here, and its saturation at ERANGE a wrong
// value). Throws InvalidArgument "<what>=<text> is not an integer in [min, max]"; `what` names the
// option or variable (e.g. "--shape entry 'M=x': M", "TAXFREE_AGMM_PUSH_CTAS").
int64_t parse_int(const std::string& what, const std::string& text, int64_t min, int64_t max);

// Whether a case of `bytes` is inside -b/-e (either unset: no bound on that side).
bool within_size_bounds(const Options& o, int64_t bytes);

// Sizes from -b/-e/-f, or [def_min, def_max] by -f when not given; each rounded down to a multiple
// of `multiple` (at least `multiple`).
std::vector<int64_t> size_sweep(const Options& o, int64_t def_min, int64_t def_max, int64_t multiple);

// One --shape entry "k=v,k=v" of an op with a fixed set of keys. A key with `choices` takes one of
// them; one without takes an integer in [1, max] (parse_int: decimal digits only). Each key at most
// once; no empty entry or item ("", "M=1,", "M=1,,N=2"). Throws InvalidArgument naming the entry,
// the key and what it accepts.
struct ShapeKey {
  std::string name;
  std::vector<std::string> choices;
  int64_t max = INT32_MAX;  // numeric keys: the op's documented limit (ops keep shapes in int32)
};
std::map<std::string, std::string> parse_shape_entry(const std::string& entry, const std::vector<ShapeKey>& keys);

// Numeric key `key` of a parse_shape_entry result (already checked against its range), or `def`
// when the entry does not name it.
int64_t shape_int(const std::map<std::string, std::string>& kv, const std::string& key, int64_t def);

// check_options of an op whose --shape entries only filter its cases: every entry must parse with
// `keys` (an unknown key would otherwise select no case and "pass").
void check_shape_entries(const std::vector<std::string>& entries, const std::vector<ShapeKey>& keys);

// A GPU's 16-byte UUID (cudaDeviceProp::uuid) as nvidia-smi prints it:
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". The bench JSON names every rank's GPU this way: the
// same binary's times differ between physical GPUs (e.g. how a clustered grid lands on the GPCs).
std::string format_gpu_uuid(const unsigned char (&bytes)[16]);

// Shape filters: each Options::shapes entry is "k=v,k=v"; a case matches if any entry's keys all
// equal the case's params (numbers compared as numbers). No entries: everything matches.
bool matches_shape_filters(const nlohmann::json& params, const std::vector<std::string>& filters);

}  // namespace taxfree::bench
