// taxfree command line: a thin front end over the launcher, the Team and the benchmark harness.
#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <sstream>
#include <thread>

#include "taxfree/bench/harness.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/launcher.h"
#include "taxfree/runtime/team.h"
#include "taxfree/version.h"

namespace {

using namespace taxfree;

// Runs `body` with typed errors turned into the exit codes the README lists (a rank's body reports
// its failure to the other ranks itself, before throwing).
int with_exit_codes(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::cerr << e.what() << "\n";
    switch (e.status()) {
      case Status::RemoteError: return kExitRemote;
      case Status::InvalidArgument: return kExitUsage;
      case Status::NotSupported: return kExitNoGpu;
      default: return kExitFailed;
    }
  } catch (const std::exception& e) {
    std::cerr << "[taxfree" << (error_rank() >= 0 ? " rank " + std::to_string(error_rank()) : std::string())
              << "] unexpected error: " << e.what() << "\n";
    return kExitFailed;
  }
}

// In a rank: run. Otherwise: start one rank per GPU (or `gpus`) running this same command line.
int launch_or_run(int argc, char** argv, int gpus, const std::function<int()>& rank_body) {
  // Outside a rank too: a malformed RANK / WORLD_SIZE, a failed fork or socket are typed errors.
  return with_exit_codes([&] {
    if (const auto env = rank_env()) {
      // Started by torchrun / mpirun (or by this launcher, with -g as given): -g must agree.
      TF_REQUIRE(gpus == 0 || gpus == env->world, Status::InvalidArgument,
                 "-g " << gpus << " but " << env->source << " started " << env->world << " rank(s)");
      return rank_body();
    }
    std::string why;
    const int visible = probe_visible_gpus(self_executable(), &why);
    if (visible == 0) {
      std::cerr << "taxfree: no GPU is visible (" << (why.empty() ? "CUDA reports no device" : why)
                << "); this command needs at least one NVIDIA Hopper GPU\n";
      return int(kExitNoGpu);
    }
    if (gpus > visible) {
      std::cerr << "taxfree: -g " << gpus << " asks for more GPUs than the " << visible << " visible\n";
      return int(kExitNoGpu);
    }
    LaunchSpec spec;
    spec.nranks = gpus > 0 ? gpus : visible;
    spec.argv.assign(argv, argv + argc);
    spec.argv[0] = self_executable();
    return run_ranks(spec);
  });
}

// `taxfree gemm-choice`: for each shape, "M N K layout config" (the heuristic's choice), and with
// `candidates` every config it weighed, with its estimate. Shapes from --shape entries, then stdin
// lines "M N K [nk|kn]" when `from_stdin`. Host only: no GPU is touched.
int print_gemm_choices(const std::vector<std::string>& entries, bool from_stdin, int sms, bool candidates) {
  struct Shape {
    int64_t m, n, k;
    gemm::BLayout layout;
  };
  std::vector<Shape> shapes;
  for (const std::string& e : entries) {
    const auto kv = bench::parse_shape_entry(e, {{"M", {}}, {"N", {}}, {"K", {}}, {"layout", {"nk", "kn"}}});
    TF_REQUIRE(kv.count("M") && kv.count("N") && kv.count("K"), Status::InvalidArgument,
               "--shape '" << e << "' needs M, N and K");
    shapes.push_back({bench::shape_int(kv, "M", 0), bench::shape_int(kv, "N", 0), bench::shape_int(kv, "K", 0),
                      kv.count("layout") ? gemm::parse_layout(kv.at("layout"), "--shape layout") : gemm::BLayout::nk});
  }
  std::string line;
  for (int no = 1; from_stdin && std::getline(std::cin, line); ++no) {
    std::istringstream in(line);
    std::vector<std::string> f{std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
    if (f.empty()) continue;
    const std::string what = "stdin line " + std::to_string(no) + " '" + line + "'";
    TF_REQUIRE(f.size() == 3 || f.size() == 4, Status::InvalidArgument, what << ": expected M N K [nk|kn]");
    shapes.push_back({bench::parse_int(what + ": M", f[0], 1, INT32_MAX), bench::parse_int(what + ": N", f[1], 1, INT32_MAX),
                      bench::parse_int(what + ": K", f[2], 1, INT32_MAX),
                      f.size() == 4 ? gemm::parse_layout(f[3], what) : gemm::BLayout::nk});
  }
  TF_REQUIRE(!shapes.empty(), Status::InvalidArgument, "gemm-choice: no shape (give --shape or --stdin)");
  for (const Shape& s : shapes) {
    const gemm::GemmRanking r = gemm::rank_gemm_configs(s.m, s.n, s.k, DType::bf16, s.layout, sms);
    std::cout << s.m << " " << s.n << " " << s.k << " " << gemm::layout_name(s.layout) << " "
              << r.candidates[r.chosen].config.name() << "\n";
    for (size_t i = 0; candidates && i < r.candidates.size(); ++i)
      std::cout << "  " << std::fixed << std::setprecision(2) << r.candidates[i].estimate_s * 1e6 << " us  "
                << r.candidates[i].config.name() << (i == r.chosen ? "  <- chosen" : "") << "\n";
  }
  return 0;
}

// CLI11's Range lets NaN through (every comparison with it is false) and takes inf, and a value
// past what the later uint64 conversions hold (timeout seconds -> ns, heap GiB -> bytes) converts
// to an undefined one: a finite number in [lo, hi], or (lo, hi] when `lo_open`.
CLI::Validator finite_in(double lo, double hi, bool lo_open = false) {
  std::ostringstream os;
  os << std::setprecision(10) << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
  const std::string range = os.str();
  return CLI::Validator(
      [=](std::string& text) {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool ok = end != text.c_str() && *end == '\0' && std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
        return ok ? std::string() : "value " + text + " is not a finite number in " + range;
      },
      "NUMBER in " + range);
}

// CLI11 reads integers with strtoll's base 0 ("010" is 8, "0x10" 16) and saturates past the type:
// plain decimal digits in [lo, hi] only (bench::parse_int), handed on without leading zeros.
CLI::Validator int_in(int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [=](std::string& text) {
        try {
          text = std::to_string(bench::parse_int("value", text, lo, hi));
          return std::string();
        } catch (const Error&) {
          return "value " + text + " is not an integer in " + range + " (decimal digits only)";
        }
      },
      "INT in " + range);
}

// An empty value ("--json ''") would read as the option not given.
const CLI::Validator kNonEmpty(
    [](std::string& text) { return text.empty() ? std::string("an empty value is not allowed") : std::string(); }, "");

// --json's file, checked before any rank starts (rank 0 writes it only after the whole benchmark):
// created and removed again where it does not exist (O_EXCL: never through a link), else opened
// for appending (nothing in it is lost); a link to a file not there yet checks that file. `json` is
// the path as given, for messages.
void require_writable_json(const std::string& path, const std::string& json, int links = 0) {
  const int created = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (created >= 0) {
    ::close(created);
    ::unlink(path.c_str());
    return;
  }
  const int create_error = errno;
  const auto fail = [&](int error) { return "--json '" + json + "' cannot be written: " + std::strerror(error); };
  struct stat st {};
  const bool exists = create_error == EEXIST && ::stat(path.c_str(), &st) == 0;  // through links
  TF_REQUIRE(create_error != EISDIR && !(exists && S_ISDIR(st.st_mode)), Status::InvalidArgument,
             "--json '" << json << "' is a directory");
  TF_REQUIRE(create_error == EEXIST, Status::InvalidArgument, fail(create_error));
  if (exists) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    TF_REQUIRE(fd >= 0, Status::InvalidArgument, fail(errno));
    ::close(fd);
    return;
  }
  // EEXIST, yet nothing there through links: a link to a file not there yet (or a loop of links).
  TF_REQUIRE(links < 8, Status::InvalidArgument, fail(ELOOP));
  std::string target(PATH_MAX, '\0');
  const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
  TF_REQUIRE(n > 0, Status::InvalidArgument, fail(errno));
  target.resize(size_t(n));
  if (target.front() != '/' && path.find('/') != std::string::npos) target = path.substr(0, path.rfind('/') + 1) + target;
  require_writable_json(target, json, links + 1);
}

// --inject's rank must be one of the job's `world` ranks: a fault for a rank past them never fired.
void require_inject_rank(const std::string& inject, int rank, int world) {
  TF_REQUIRE(rank < world, Status::InvalidArgument,
             "--inject '" << inject << "': rank " << rank << " is not in this job of " << world << " rank(s)");
}

std::string version_text(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

}  // namespace

int main(int argc, char** argv) {
  default_multicast_off();
  CLI::App app{"taxfree: multi-GPU LLM kernels without the bulk-synchronous, data-locality and launch taxes"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "show help for every command");

  // bench ---------------------------------------------------------------------------------------
  auto* bench = app.add_subcommand("bench", "benchmark and check ops (no op: every op's default sweep + summary)");
  std::vector<std::string> ops;
  std::string min_b, max_b, json, inject;
  bench::Options opt;
  int gpus = 0;
  double heap_gib = 0, timeout_s = -1;
  bench->add_option("op", ops, "ops to run (see `taxfree list`)");
  bench->add_option("-b,--minbytes", min_b, "smallest size (bytes per rank; K/M/G suffixes)")->check(kNonEmpty);
  bench->add_option("-e,--maxbytes", max_b, "largest size")->check(kNonEmpty);
  bench->add_option("-f,--stepfactor", opt.step_factor, "multiply the size by this each step")->check(finite_in(1.01, 1e6));
  bench->add_option("-n,--iters", opt.iters, "timed iterations per case")->transform(int_in(1, 1000000));
  bench->add_option("-w,--warmup_iters", opt.warmup, "warm-up iterations per case")->transform(int_in(0, 1000000));
  bench->add_option("-c,--check", opt.check, "checked runs per case and variant (0: no check)")->transform(int_in(0, 1000));
  bench->add_option("-g,--ngpus", gpus, "number of GPUs (ranks) to use; default: all visible")->transform(int_in(1, 1024));
  bench->add_flag("--cold", opt.cold_l2, "flush L2 before every timed run (one run per sample)");
  bench->add_flag("--graph", opt.graph,
                  "run every variant as a captured CUDA graph (checks too), as serving engines replay a step");
  bench->add_option("--sample-us", opt.sample_us, "back-to-back runs per timed sample: about this long (1-64 runs; 1 with --cold)")
      ->check(finite_in(1.0, 100000.0));
  bench->add_option("--json", json, "write results as JSON to this file")->check(kNonEmpty);
  // One value per --variant / --shape (repeat the option for more): a greedy option took the op
  // name after it ("bench --shape M=1 gemm") as a second entry.
  bench->add_option("--variant", opt.variants, "only this variant, or part (timed, unchecked: e.g. gemm-only); repeatable")
      ->allow_extra_args(false);
  bench->add_option("--shape", opt.shapes, "op-specific shape filter key=value[,key=value]; repeatable")
      ->allow_extra_args(false);
  bench->add_option("--dtype", opt.dtype, "element type")->check(CLI::IsMember({"bf16", "fp16"}));
  bench->add_option("--heap", heap_gib, "symmetric heap per rank, GiB")->check(finite_in(1.0 / 1024, 1 << 20));
  bench->add_option("--timeout", timeout_s, "device wait deadline, seconds")->check(finite_in(1e-6, 1e6));
  bench->add_option("--seed", opt.seed, "random seed for inputs")->transform(int_in(0, INT64_MAX));
  bench->add_option("--inject", inject, "fault injection for tests: kill:RANK or skip-signal:RANK")->check(kNonEmpty);

  // run -----------------------------------------------------------------------------------------
  auto* run = app.add_subcommand("run", "run a program as N ranks with taxfree's launcher (like torchrun)");
  int nranks = 1;
  std::vector<std::string> prog;
  run->add_option("-n,--nranks", nranks, "number of ranks")->transform(int_in(1, 4096));
  run->add_option("program", prog, "program and its arguments (after --)")->required();

  auto* list = app.add_subcommand("list", "list ops and their variants");

  auto* choice = app.add_subcommand("gemm-choice", "the GEMM config the heuristic picks for a shape (host only, no GPU)");
  std::vector<std::string> choice_shapes;
  bool choice_stdin = false, choice_all = false;
  int choice_sms = 132;
  choice->add_option("--shape", choice_shapes, "M=..,N=..,K=..[,layout=nk|kn] (B as [N, K] or [K, N]; nk if not given); repeatable")
      ->allow_extra_args(false);
  choice->add_flag("--stdin", choice_stdin, "also read shapes from stdin, one a line: M N K [nk|kn]");
  choice->add_option("--sms", choice_sms, "SMs of the GPU ranked for (H100 / H200 SXM: 132)")->transform(int_in(1, 1024));
  choice->add_flag("--candidates", choice_all, "list every config weighed, in the order weighed, with its estimate");
  auto* info = app.add_subcommand("info", "versions and visible GPUs");

  // hidden helpers ------------------------------------------------------------------------------
  auto* probe = app.add_subcommand("_probe-gpus", "")->group("");
  auto* selftest = app.add_subcommand("_rank-selftest", "")->group("");
  int fail_rank = -1;
  std::string mode = "ok";
  selftest->add_option("--fail-rank", fail_rank);
  selftest->add_option("--mode", mode)->check(CLI::IsMember({"ok", "exit", "kill", "error", "hang", "stall", "finish-exit"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports "a subcommand is required" before an unknown first word: name the word.
    const auto words = app.remaining();
    if (app.get_subcommands().empty() && !words.empty()) {
      std::cerr << "taxfree: unknown command or option '" << words.front() << "'; commands:";
      for (const auto* c : app.get_subcommands([](const CLI::App* c) { return !c->get_group().empty(); }))
        std::cerr << " " << c->get_name();
      std::cerr << " (see --help)\n";
      return kExitUsage;
    }
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }

  if (*probe) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) std::cout << "0 " << cudaGetErrorString(e) << "\n";
    else std::cout << n << "\n";
    return 0;
  }

  if (*selftest) {
    // A rank that does no CUDA work: exercises the launcher and coordinator (CPU tests).
    return with_exit_codes([&] {
      auto env = rank_env();
      TF_REQUIRE(env, Status::InvalidUsage, "_rank-selftest must run as a rank");
      set_error_rank(env->rank);
      std::unique_ptr<CoordinatorServer> server;
      if (env->host_coordinator) server = std::make_unique<CoordinatorServer>("0.0.0.0", env->coordinator_port, env->world);
      CoordinatorClient c(env->coordinator_host, env->coordinator_port, env->rank, env->world, 30);
      c.barrier("start", 30);
      if (env->rank == fail_rank) {
        if (mode == "exit") ::_exit(7);
        if (mode == "kill") ::kill(::getpid(), SIGKILL);
        if (mode == "error") {
          c.fail("injected error in rank " + std::to_string(env->rank));
          return int(kExitFailed);
        }
        if (mode == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
        if (mode == "stall") {  // calls with no deadline of their own that never return, under
                                // CallDeadlines: the one armed last expires first
          const CallDeadline outer(c, "an outer call", 100.0);
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the watcher now sleeps for 100 s
          const CallDeadline deadline(c, "a stalled call", 1.0);
          std::this_thread::sleep_for(std::chrono::hours(1));
        }
      }
      c.barrier("end", 10);
      std::cout << "rank " << env->rank << " done\n";
      c.finish();
      if (mode == "finish-exit") {  // the failing rank ends with an exit code after finishing, as a
                                    // benchmark that found wrong elements; the others look for an abort
        if (env->rank == fail_rank) return int(kExitWrongResult);
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        if (c.aborted()) std::cout << "rank " << env->rank << " was told to abort after finishing\n";
      }
      return int(kExitOk);
    });
  }

  if (*info) return with_exit_codes([&] {
    int loaded = 0;
    ncclGetVersion(&loaded);
    std::cout << "taxfree " TAXFREE_VERSION_STRING "\nNCCL headers " << version_text(NCCL_VERSION_CODE) << ", library "
              << version_text(loaded) << "\n";
    std::string why;
    int n = probe_visible_gpus(self_executable(), &why);
    std::cout << "GPUs visible: " << n << (why.empty() ? "" : " (" + why + ")") << "\n";
    return 0;
  });

  if (*choice) return with_exit_codes([&] { return print_gemm_choices(choice_shapes, choice_stdin, choice_sms, choice_all); });

  if (*list) {
    for (const auto& name : bench::bench_names()) {
      auto b = bench::make_bench(name);
      std::cout << name << " (min ranks " << b->min_ranks() << "):";
      for (const auto& v : b->variants()) std::cout << " " << v;
      std::cout << "\n";
    }
    return 0;
  }

  if (*run) {
    return with_exit_codes([&] {
      LaunchSpec spec;
      spec.nranks = nranks;
      spec.argv = prog;
      return run_ranks(spec);
    });
  }

  // bench: validate everything here, before any rank starts, so a bad command fails once.
  bench::RunRequest req;
  int inject_rank = -1;
  TeamOptions team_options;
  team_options.heap_bytes = uint64_t(heap_gib * double(1ull << 30));
  team_options.timeout_s = timeout_s;
  try {
    // No op: every op's default sweep, where one op's --shape keys and --variant names mean nothing.
    TF_REQUIRE(!ops.empty() || (opt.shapes.empty() && opt.variants.empty()), Status::InvalidArgument,
               "--shape and --variant need an op (e.g. taxfree bench gemm --shape M=1,N=4096,K=8192); "
               "without one, bench runs every op's default sweep");
    for (const std::vector<std::string>* names : {&ops, &opt.variants})
      for (auto it = names->begin(); it != names->end(); ++it)
        TF_REQUIRE(std::find(names->begin(), it, *it) == it, Status::InvalidArgument,
                   (names == &ops ? "op '" : "--variant '") << *it << "' named twice");
    opt.ranks = gpus;
    for (const auto& op : ops.empty() ? bench::bench_names() : ops) {
      auto b = bench::make_bench(op);  // throws for unknown ops, naming the known ones
      b->check_options(opt);           // every op's when none is named (e.g. its environment knobs)
      for (const auto& v : opt.variants) {
        const auto vs = b->variants(), ps = b->parts();
        TF_REQUIRE(std::find(vs.begin(), vs.end(), v) != vs.end() || std::find(ps.begin(), ps.end(), v) != ps.end(),
                   Status::InvalidArgument, "op '" << op << "' has no variant or part '" << v << "'");
      }
      if (gpus > 0 && !ops.empty())  // the summary skips ops that need more ranks
        TF_REQUIRE(gpus >= b->min_ranks(), Status::InvalidUsage,
                   "op '" << op << "' needs at least " << b->min_ranks() << " GPUs; -g " << gpus << " given");
    }
    if (!min_b.empty()) opt.min_bytes = bench::parse_bytes(min_b);
    if (!max_b.empty()) opt.max_bytes = bench::parse_bytes(max_b);
    if (!min_b.empty() || !max_b.empty()) {
      if (min_b.empty()) opt.min_bytes = opt.max_bytes;
      if (max_b.empty()) opt.max_bytes = opt.min_bytes;
      TF_REQUIRE(opt.min_bytes > 0, Status::InvalidArgument,
                 (min_b.empty() ? "-e " + max_b : "-b " + min_b) << ": sizes must be > 0 bytes");
      TF_REQUIRE(opt.max_bytes >= opt.min_bytes, Status::InvalidArgument,
                 "-e " << max_b << " is smaller than -b " << min_b);
    }
    if (!inject.empty()) {
      auto colon = inject.find(':');
      TF_REQUIRE(colon != std::string::npos, Status::InvalidArgument, "--inject '" << inject << "' must be kill:RANK or skip-signal:RANK");
      const std::string what = inject.substr(0, colon);
      TF_REQUIRE(what == "kill" || what == "skip-signal", Status::InvalidArgument,
                 "--inject '" << inject << "': unknown fault '" << what << "'");
      inject_rank = int(bench::parse_int("--inject '" + inject + "': rank", inject.substr(colon + 1), 0, INT32_MAX));
      if (gpus > 0) require_inject_rank(inject, inject_rank, gpus);  // else once the ranks know the world
      if (what == "kill") req.kill_rank = inject_rank;
      else opt.skip_signal_rank = inject_rank;
    }
    if (!json.empty()) {
      const auto env = rank_env();  // under torchrun / mpirun: rank 0 checks the file it will write
      if (!env || env->rank == 0) require_writable_json(json, json);
    }
    // What each rank's Team::join reads from the environment (TAXFREE_TIMEOUT_S, TAXFREE_HEAP_BYTES).
    const EnvLookup getenv_lookup = [](const char* name) -> const char* { return std::getenv(name); };
    team_timeout_s(team_options, getenv_lookup);
    team_heap_bytes(team_options, std::max(gpus, 1), getenv_lookup);
  } catch (const Error& e) {
    std::cerr << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "taxfree: bad argument: " << e.what() << "\n";
    return kExitUsage;
  }
  req.ops = ops;
  req.options = opt;
  req.json_path = json;

  return launch_or_run(argc, argv, gpus, [&] {
    auto team = Team::join(team_options);
    int code = kExitOk;
    try {
      if (inject_rank >= 0) require_inject_rank(inject, inject_rank, team->world());
      code = bench::run(*team, req);
    } catch (const Error& e) {
      if (e.status() != Status::RemoteError) team->fail(e.what());
      throw;
    } catch (const std::exception& e) {
      team->fail(std::string("unexpected error: ") + e.what());
      throw;
    }
    team->finish();
    return code;
  });
}
