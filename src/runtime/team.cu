#include "taxfree/runtime/team.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <optional>
#include <sstream>
#include <thread>

#include "taxfree/device/barrier.cuh"
#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/stream_release.h"

namespace taxfree {

namespace {

std::atomic<int> g_live_teams{0};  // Teams of this process not yet destroyed (at most 1)
// `name` from the environment as a number in [lo, hi] (a whole one when `whole`), or `fallback` when unset.
double env_number(const EnvLookup& env, const char* name, double lo, double hi, double fallback, bool whole = false) {
  const char* v = env(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  TF_REQUIRE(end != v && *end == '\0' && x >= lo && x <= hi && (!whole || x == std::floor(x)),
             Status::InvalidArgument,
             "environment variable " << name << "='" << v << "' must be a " << (whole ? "whole " : "")
                                     << "number in [" << std::setprecision(16) << lo << ", " << hi << "]");
  return x;
}

std::string version_text(int code) {
  std::ostringstream os;
  os << code / 10000 << "." << (code / 100) % 100 << "." << code % 100;
  return os.str();
}

using Clock = std::chrono::steady_clock;

// Polls `stream` until its work ends or fails, `limit_s` passes or `stop()` holds; returns the last
// cudaStreamQuery (cudaErrorNotReady: deadline or stop).
template <class Stop>
cudaError_t poll_stream(cudaStream_t stream, double limit_s, Stop stop) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(limit_s);
  cudaError_t e = cudaStreamQuery(stream);
  for (; e == cudaErrorNotReady && !stop() && Clock::now() < deadline; e = cudaStreamQuery(stream))
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  return e;
}

__global__ void barrier_kernel(dev::SymmetricView view, uint64_t* slots, dev::LaunchSequence seq,
                               dev::FaultContext fc) {
  const uint64_t epoch = dev::sequence_begin(seq);
  dev::block_barrier(view, slots, epoch, fc);  // on failure the record is filled; the host reports it
  dev::sequence_end(seq, epoch);
}
}  // namespace

void check_nccl_version() {
  int loaded = 0;
  TF_NCCL(ncclGetVersion(&loaded));
  if (loaded == NCCL_VERSION_CODE) return;
  Dl_info info{};
  std::string path = dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) && info.dli_fname ? info.dli_fname : "?";
  TF_THROW(Status::NotSupported, "NCCL library " << version_text(loaded) << " (" << path
                                                 << ") is loaded, but taxfree was compiled against NCCL "
                                                 << version_text(NCCL_VERSION_CODE)
                                                 << " headers; NCCL's device API is not ABI-stable across releases: "
                                                    "put the matching libnccl.so.2 first on LD_LIBRARY_PATH");
}

const char* wait_site_name(dev::WaitSite site) {
  switch (site) {
    case dev::WaitSite::none: return "none";
    case dev::WaitSite::test_signal: return "test signal";
    case dev::WaitSite::barrier: return "device barrier";
    case dev::WaitSite::all_gather_ready: return "all_gather: peer buffer free";
    case dev::WaitSite::all_gather_data: return "all_gather: peer shard arrived";
    case dev::WaitSite::ping_pong: return "signal ping-pong";
    case dev::WaitSite::gemm_a_ready: return "gemm: A tile ready";
    case dev::WaitSite::decode_partial: return "flash_decode: peer partial arrived";
    case dev::WaitSite::ksplit_partial: return "all_gather_matmul ksplit: peer partial arrived";
    case dev::WaitSite::nsplit_block: return "all_gather_matmul nsplit: peer C block arrived";
    case dev::WaitSite::ksplit_sum: return "all_gather_matmul ksplit: owner's C slice arrived";
    case dev::WaitSite::decode_cluster_rows: return "flash_decode: the cluster's split rows reached this CTA";
    case dev::WaitSite::ksplit_a_lines: return "all_gather_matmul ksplit: peer A_shard lines arrived";
  }
  return "unknown site";
}

std::string describe_wait_record(const dev::WaitRecord& r, const SymmetricHeap* heap) {
  std::ostringstream os;
  // waited 0: a value check failed, nothing timed out (direct_merge.h: a split count outside
  // [1, expected] read from a peer's line).
  const bool bad_count = r.waited_ns == 0;
  os << "rank " << r.rank << (bad_count ? " stopped at '" : " gave up waiting at '")
     << wait_site_name(dev::WaitSite(r.site)) << "'";
  if (r.peer >= 0) os << (bad_count ? " from rank " : " for rank ") << r.peer;
  os << ": " << (bad_count ? "line" : "flag");
  if (r.flag_offset != ~0ull) {
    os << " at heap offset " << r.flag_offset;
    const std::string name = heap ? heap->describe_offset(r.flag_offset) : "";
    if (!name.empty()) os << " (" << name << ")";
  }
  if (bad_count)
    os << " holds " << r.observed << " where a count in [1, " << r.expected << "] was due (a corrupt or stale line)";
  else
    os << " expected >= " << r.expected << ", observed " << r.observed << " after " << double(r.waited_ns) * 1e-9 << " s";
  os << " (block " << r.block << ", thread " << r.thread << ")";
  return os.str();
}

std::unique_ptr<Team> Team::join(const TeamOptions& options) {
  std::unique_ptr<Team> team(new Team());
  try {
    team->init(options);
  } catch (const Error& e) {
    if (team->client_ && e.status() != Status::RemoteError) team->client_->fail(e.what());
    throw;
  } catch (const std::exception& e) {
    if (team->client_) team->client_->fail(std::string("Team start: ") + e.what());
    throw;
  }
  return team;
}

double team_timeout_s(const TeamOptions& options, const EnvLookup& env) {
  constexpr double kMin = 1e-6, kMax = 1e6;  // s: a microsecond to far past any wait (exact in ns)
  // The bootstrap's and NCCL calls' deadlines too (CallDeadlines): NaN or inf would end a healthy rank.
  for (const auto& [name, v] : {std::pair<const char*, double>{"bootstrap_timeout_s", options.bootstrap_timeout_s},
                                 {"nccl_call_timeout_s", options.nccl_call_timeout_s}})
    TF_REQUIRE(v >= 1e-3 && v <= kMax, Status::InvalidArgument,
               "TeamOptions::" << name << "=" << v << " must be in [0.001, " << kMax << "] s");
  if (options.timeout_s < 0) return env_number(env, "TAXFREE_TIMEOUT_S", kMin, kMax, 10.0);
  TF_REQUIRE(options.timeout_s >= kMin && options.timeout_s <= kMax, Status::InvalidArgument,
             "TeamOptions::timeout_s=" << options.timeout_s << " must be in [" << kMin << ", " << kMax
                                       << "] s (< 0: the default)");
  return options.timeout_s;
}

uint64_t team_heap_bytes(const TeamOptions& options, int world, const EnvLookup& env) {
  constexpr uint64_t kMin = 1ull << 20, kMax = 1ull << 50;
  uint64_t bytes = options.heap_bytes;
  if (bytes == 0) bytes = uint64_t(env_number(env, "TAXFREE_HEAP_BYTES", double(kMin), double(kMax), 0, true));
  if (bytes == 0) return std::max<uint64_t>(4ull << 30, (uint64_t(world) + 2) << 30);
  TF_REQUIRE(bytes >= kMin && bytes <= kMax, Status::InvalidArgument,
             "TeamOptions::heap_bytes=" << bytes << " must be in [2^20, 2^50] (0: the default)");
  return bytes;
}

void Team::init(const TeamOptions& options) {
  auto env = rank_env();
  if (env) {
    env_ = *env;
  } else {
    env_.source = "single process";
  }
  set_error_rank(env_.rank);
  // A second live Team would join its rank's peers as a new generation while they are still in the
  // first: startup would wait out the bootstrap deadline and name something else.
  counted_live_ = true;
  TF_REQUIRE(g_live_teams.fetch_add(1) == 0, Status::InvalidUsage,
             "Team::join: this process's earlier Team (" << env_.source << ", rank " << env_.rank
                                                        << ") is still alive: one Team per process at a time "
                                                           "(finish() and destroy it first)");
  // Under torchrun/mpirun rank 0's Team hosts the coordinator and takes it down with itself, so a
  // later Team's ranks could reach the old one and lose it. The launcher's coordinator (and a
  // single process's own) has no such race.
  static std::atomic<int> teams_joined{0};
  TF_REQUIRE(teams_joined++ == 0 || !env || env_.launcher_coordinator, Status::NotSupported,
             "a second Team in one process started by " << env_.source
                                                        << ": keep one Team for the process's life, or start the "
                                                           "job with the taxfree launcher, whose ranks may join Teams "
                                                           "one after another");
  const EnvLookup env_of = [](const char* name) -> const char* { return std::getenv(name); };
  timeout_s_ = team_timeout_s(options, env_of);  // both checked before anything starts
  nccl_call_timeout_s_ = options.nccl_call_timeout_s;
  const uint64_t heap_bytes = team_heap_bytes(options, env_.world, env_of);

  if (!env || env_.host_coordinator) {
    server_ = std::make_unique<CoordinatorServer>(env ? "0.0.0.0" : "127.0.0.1", env ? env_.coordinator_port : 0,
                                                  env_.world);
    if (!env) env_.coordinator_port = server_->port();
  }
  client_ = std::make_unique<CoordinatorClient>(env_.coordinator_host, env_.coordinator_port, env_.rank, env_.world,
                                                options.bootstrap_timeout_s);

  check_nccl_version();

  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  TF_REQUIRE(e == cudaSuccess && count > 0, Status::NotSupported,
             "no CUDA GPU visible (" << (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) << ")");
  TF_REQUIRE(env_.local_rank < count, Status::NotSupported,  // too few GPUs: the launcher's exit 4 too
             "LOCAL_RANK=" << env_.local_rank << " but only " << count << " GPU(s) are visible to this process");
  device_ = env_.local_rank;
  TF_CUDA(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  TF_CUDA(cudaGetDeviceProperties(&prop, device_));
  TF_REQUIRE(prop.major == 9 && prop.minor == 0, Status::NotSupported,
             "GPU " << device_ << " (" << prop.name << ") is compute capability " << prop.major << "." << prop.minor
                    << "; taxfree is built for Hopper (sm_90a) only");
  sm_count_ = prop.multiProcessorCount;
  // Every rank gets here, on the same kind of GPU, before NCCL's init, which waits for every rank
  // without a deadline of its own; the plans each rank makes from its SM count must agree.
  require_same_call(*client_, "team-gpu", "GPU check at Team start", 0,
                    std::string(prop.name) + " with " + std::to_string(sm_count_) + " SMs",
                    options.bootstrap_timeout_s);
  TF_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

  void* host = nullptr;
  TF_CUDA(cudaHostAlloc(&host, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(host, 0, 4096);
  abort_flag_ = static_cast<uint32_t*>(host);
  record_ = reinterpret_cast<dev::WaitRecord*>(static_cast<char*>(host) + 256);
  client_->on_abort([flag = abort_flag_] { __atomic_store_n(flag, 1u, __ATOMIC_RELEASE); });

  ncclUniqueId id{};
  if (env_.rank == 0) {
    TF_NCCL(ncclGetUniqueId(&id));
    client_->set("nccl-id", std::string(reinterpret_cast<const char*>(&id), sizeof id));
  } else {
    std::string v = client_->get("nccl-id", options.bootstrap_timeout_s);
    TF_REQUIRE(v.size() == sizeof id, Status::Internal,
               "rank " << env_.rank << ": the NCCL id from the coordinator has " << v.size() << " bytes, not "
                       << sizeof id);
    std::memcpy(&id, v.data(), sizeof id);
  }
  {
    const CallDeadline deadline(*client_, "ncclCommInitRank", options.bootstrap_timeout_s);
    TF_NCCL(ncclCommInitRank(&comm_, env_.world, id, env_.rank));
  }

  const auto env_on = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  };
  const bool check = options.check_heap || env_on("TAXFREE_CHECK_HEAP");
  check_launches_ = options.check_launches || env_on("TAXFREE_CHECK_LAUNCHES");
  {
    const CallDeadline deadline(*client_, "the symmetric heap's NCCL window registration", options.bootstrap_timeout_s);
    heap_ = std::make_unique<SymmetricHeap>(comm_, *client_, env_.rank, env_.world, heap_bytes, check);
  }

  barrier_slots_ = heap_->allocate_array<uint64_t>(uint64_t(env_.world), "team.barrier");
  TF_CUDA(cudaMemset(barrier_slots_, 0, sizeof(uint64_t) * size_t(env_.world)));
  barrier_seq_ = heap_->allocate_sequence("team.barrier_sequence");
  TF_CUDA(cudaDeviceSynchronize());
  host_barrier("team-ready");
}

Team::~Team() {
  bool clean = finished_ && !client_->aborted();
  // Torn down unfinished (an exception unwinding): the other ranks learn it now, not when the client
  // closes after the teardown below (a no-op where the failure was reported already); this rank's
  // kernels that still wait stop now, not at their deadline.
  if (!finished_ && client_ && !client_->aborted())
    client_->fail("Team destroyed before finish() (an exception unwinding?)");
  if (!clean && abort_flag_) __atomic_store_n(abort_flag_, 1u, __ATOMIC_RELEASE);
  if (device_ >= 0) cudaSetDevice(device_);
  if (clean && stream_) {
    // finish() drained the stream; work queued on it since gets sync()'s deadline, then the
    // teardown of a failure (our kernels stop at the abort flag).
    const cudaError_t e = poll_stream(stream_, default_sync_limit_s(), [] { return false; });
    if (e == cudaSuccess) {
      run_stream_release_hooks(stream_);  // e.g. the GEMM workspace ops kept for it (after a failure
                                          // the process ends anyway: nothing to tidy)
    } else {
      const std::string why = e == cudaErrorNotReady
                                  ? "did not end within " + std::to_string(default_sync_limit_s()) + " s"
                                  : std::string("failed: ") + cudaGetErrorString(e);
      std::fprintf(stderr, "[taxfree rank %d] Team teardown: work queued on its stream after finish() %s; tearing down "
                   "as after a failure\n", env_.rank, why.c_str());
      __atomic_store_n(abort_flag_, 1u, __ATOMIC_RELEASE);
      clean = false;
    }
  }
  if (!clean && stream_) {
    // After a failure this rank's waiting kernels stop at the abort flag within microseconds: give
    // its stream a moment before the heap is unmapped under them (a kernel that ignores the flag is
    // not waited out; the process is ending).
    poll_stream(stream_, 2.0, [] { return false; });
  }
  {
    // NCCL's teardown may wait for peers (window deregistration) without a deadline of its own.
    // After a failure the peers are ended exit_grace_s after the abort (the rank that reported it
    // gets no ABORT, so no exit timer): a teardown still waiting on them past sync's limit never
    // returns, so it is not given nccl_call_timeout_s (600 s by default) to find that out.
    std::optional<CallDeadline> deadline;
    if (client_ && (heap_ || comm_))
      deadline.emplace(*client_,
                       clean ? "the Team's NCCL teardown (window deregistration, communicator destroy)"
                             : "the Team's NCCL teardown after a failure (window deregistration, communicator abort)",
                       clean ? nccl_call_timeout_s_ : std::min(nccl_call_timeout_s_, default_sync_limit_s()));
    heap_.reset();
    if (comm_) {
      if (clean) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
  }
  if (stream_) cudaStreamDestroy(stream_);
  client_.reset();  // first: its watchdog's abort callback writes the flag
  if (abort_flag_) cudaFreeHost(abort_flag_);
  server_.reset();
  if (counted_live_) g_live_teams.fetch_sub(1);
}

dev::FaultContext Team::fault() const {
  dev::FaultContext f;
  f.abort = abort_flag_;
  f.record = record_;
  f.heap_base = heap_ ? heap_->view().local_base : nullptr;
  f.timeout_ns = uint64_t(timeout_s_ * 1e9);
  f.rank = env_.rank;
  return f;
}

RankShare Team::share() {
  RankShare s;
  s.rank = env_.rank, s.world = env_.world, s.sm_count = sm_count_;
  s.heap = heap_.get();
  s.fault = fault();
  s.comm = comm_;
  s.coordinator = client_.get();
  s.nccl_call_limit_s = nccl_call_timeout_s_;
  s.host_barrier = [this](const std::string& name) { host_barrier(name); };
  if (check_launches_)
    s.check_launch = [this](const std::string& what) {
      require_same_call(*client_, "launch", "op launch", launches_checked_++, what, std::max(60.0, 2 * timeout_s_));
    };
  return s;
}

void Team::check_device_faults() {
  if (__atomic_load_n(&record_->complete, __ATOMIC_ACQUIRE) == 1u) {
    dev::WaitRecord r;
    std::memcpy(&r, record_, sizeof r);
    const std::string msg = describe_wait_record(r, heap_.get());
    client_->fail(msg);
    TF_THROW(Status::Timeout, msg);
  }
}

void Team::sync(cudaStream_t stream, double timeout_s) {
  const double limit = timeout_s > 0 ? timeout_s : default_sync_limit_s();
  const cudaError_t e = poll_stream(stream, limit, [this] { return client_->aborted(); });
  if (e != cudaSuccess && e != cudaErrorNotReady) {
    check_device_faults();
    cudaGetLastError();
    client_->fail(std::string("CUDA error: ") + cudaGetErrorString(e));
    TF_CUDA(e);
  }
  if (e == cudaErrorNotReady) {  // stopped by another rank's abort or by the deadline
    __atomic_store_n(abort_flag_, 1u, __ATOMIC_RELEASE);
    client_->throw_if_aborted();
    check_device_faults();
    std::ostringstream os;
    os << "rank " << env_.rank << ": stream work did not finish within " << limit << " s";
    client_->fail(os.str());
    TF_THROW(Status::Timeout, os.str());
  }
  check_device_faults();
  if (__atomic_load_n(abort_flag_, __ATOMIC_ACQUIRE) != 0u) {
    // Kernels that saw the flag stopped early: their work is not done. The coordinator's thread
    // raises it just before it marks the client aborted (start_abort): wait that moment out.
    for (const auto until = Clock::now() + std::chrono::seconds(1); !client_->aborted() && Clock::now() < until;)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    client_->throw_if_aborted();
    TF_THROW(Status::RemoteError, "rank " << env_.rank << ": the abort flag is raised (an earlier failure); "
                                                           "the stream's kernels may have stopped early");
  }
  client_->throw_if_aborted();
}

void Team::device_barrier(cudaStream_t stream) {
  barrier_kernel<<<1, 32, 0, stream>>>(heap_->view(), barrier_slots_, barrier_seq_, fault());
  TF_CUDA(cudaGetLastError());
}

void Team::host_barrier(const std::string& name) {
  try {
    client_->barrier(name, std::max(60.0, 2 * timeout_s_));
  } catch (const Error& e) {
    if (e.status() == Status::Timeout) client_->fail(e.what());
    throw;
  }
}

void Team::finish() {
  if (finished_) return;
  if (!client_->aborted()) {
    sync(stream_);
    host_barrier("team-finish");
  }
  finished_ = true;
  client_->finish();
  client_->throw_if_aborted();  // a rank of a failed job does not end as if it succeeded
}

}  // namespace taxfree
