// Team: this process's rank of a job, one process per GPU.
//
// Owns the NCCL communicator, the symmetric heap, the fault state the device waits poll (abort
// flag, wait record) and the connection to the coordinator. Every host wait has a deadline and
// ends early when another rank fails.
//
// Failure contract: when anything fails in a rank, that rank reports it to the coordinator (which
// tells every other rank at once) and throws. Other ranks see RemoteError from their next Team
// call, and their device waits stop (the abort flag is raised from the coordinator's thread). A
// process still alive `exit_grace_s` after an abort is ended with kExitRemote by the watchdog, so
// no rank is ever left hanging, even inside NCCL. A Team destroyed before finish() (an exception
// unwinding) reports that and raises its own abort flag first, so the other ranks learn it before
// its teardown and this rank's waiting kernels stop at once. A rank whose process ends with a
// non-zero code after finish() fails the job without aborting the ranks that finished too.
//
// One Team per process at a time: Team::join while this process's Team is alive throws
// InvalidUsage before it contacts anyone (the live Team and the job go on); another process
// claiming a live rank fails the job ("two processes claim rank R"). Under the taxfree launcher
// (and in a single process) a rank may join a new Team after the last one was destroyed; under
// torchrun/mpirun, where rank 0's Team hosts the coordinator, a second Team in a process is
// NotSupported.
//
// Threads: a Team, and every op built on it, is driven from one host thread at a time. The ops of
// one Team share its NCCL communicator (NCCL allows one thread at a time per communicator) and
// their collective launches must reach every rank in the same order; an op's launch also keeps
// host state of its own (streams, events, warm-up mode). Concurrent launches from several threads
// are undefined, not merely slower.
//
// A collective op's launch validates its arguments before it enqueues anything, so a launch that
// throws leaves this rank's epochs where they were, and the peers' launches of that step still
// wait for this rank's: make it again with valid arguments, or their waits give up at the deadline
// and the job fails, naming this rank. Skipping it on one rank is not recoverable.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "taxfree/device/fault.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/symmetric_view.cuh"
#include "taxfree/runtime/coordinator.h"
#include "taxfree/runtime/launcher.h"
#include "taxfree/runtime/rank_share.h"
#include "taxfree/runtime/symmetric_heap.h"

namespace taxfree {

struct TeamOptions {
  uint64_t heap_bytes = 0;         // in [2^20, 2^50]; 0: TAXFREE_HEAP_BYTES, else max(4 GiB, (world + 2) GiB)
  double timeout_s = -1;           // device wait deadline in [1e-6, 1e6] s; <0: TAXFREE_TIMEOUT_S, else 10 s
  // Connecting ranks, the GPU check (every rank reaches NCCL's init on the same GPU kind and SM
  // count, InvalidUsage naming the rank that differs), the NCCL id exchange, and each of NCCL's
  // init and the heap's window registration (which have no deadline of their own: past this one
  // the process ends, CallDeadline).
  double bootstrap_timeout_s = 120;
  // Each NCCL host call after the start that may wait for the peers: a collective's first use of
  // an algorithm sets up its connections inside the call, until every rank makes it; the teardown's
  // window deregistration and communicator destroy. No deadline of their own: past this one the
  // process ends (CallDeadline). Generous (PyTorch's NCCL default): a peer may be busy elsewhere
  // (a checkpoint) before its first collective. In [0.001, 1e6] s.
  double nccl_call_timeout_s = 600;
  bool check_heap = false;         // also on with TAXFREE_CHECK_HEAP=1
  // Compare every collective op launch across ranks before it enqueues (RankShare::check_launch):
  // a host round trip per launch, for debugging runs. Also on with TAXFREE_CHECK_LAUNCHES=1. In a
  // CUDA graph the check runs at capture, not at replay.
  bool check_launches = false;
};

class Team {
 public:
  // Joins the job described by the environment (see rank_env()); a process with no launcher
  // variables forms a job of one. Selects GPU LOCAL_RANK. Throws NotSupported without a Hopper GPU,
  // with LOCAL_RANK past the GPUs visible to the process, or with an NCCL library whose version
  // differs from the headers taxfree was built with.
  static std::unique_ptr<Team> join(const TeamOptions& options = {});
  ~Team();
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  int rank() const { return env_.rank; }
  int world() const { return env_.world; }
  int device() const { return device_; }
  int sm_count() const { return sm_count_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  SymmetricHeap& heap() { return *heap_; }
  const dev::SymmetricView& view() const { return heap_->view(); }
  dev::FaultContext fault() const;
  CoordinatorClient& coordinator() { return *client_; }
  double timeout_s() const { return timeout_s_; }
  double nccl_call_timeout_s() const { return nccl_call_timeout_s_; }  // TeamOptions::nccl_call_timeout_s

  // This rank's whole GPU as an op's share (rank_share.h); refers to this Team.
  RankShare share();

  // Waits for `stream` with a deadline (default: twice the device deadline + 10 s). Throws Timeout
  // with the device's diagnostic (rank, peer, site, flag, expected, observed) if a device wait gave
  // up, RemoteError if another rank failed or the abort flag is up (kernels that saw it stopped
  // early), CudaError for CUDA failures.
  void sync(cudaStream_t stream, double timeout_s = -1);
  // Throws if a device wait has recorded a timeout (without waiting for any stream).
  void check_device_faults();
  // Device-side barrier of all ranks on `stream` (one tiny kernel, graph-capturable). Every call
  // (graph replays too) takes the next epoch of one per-Team counter on the device, as an op's
  // launches take theirs: order them all on one stream per rank (any stream, but one at a time).
  // Two in flight at once on different streams can take each other's epochs, and the barrier
  // passes early or waits out its deadline.
  void device_barrier(cudaStream_t stream);
  // Host barrier through the coordinator. Past max(60 s, 2 x the device wait deadline) it fails
  // the job and throws Timeout naming the barrier; RemoteError if another rank failed.
  void host_barrier(const std::string& name);

  // Report this rank's failure to every rank (call before exiting on an error).
  void fail(const std::string& message) { client_->fail(message); }
  // Clean end of this rank's work: drains stream() (sync's deadline), then a host barrier. A
  // finished Team's destructor waits for work queued on stream() since within the same deadline;
  // past it, it says so on stderr and tears down as after a failure (abort flag raised). Once this
  // rank knows of another rank's failure it skips both, ends this rank's part and throws
  // RemoteError; its own failures surface from the drain (sync's errors). The NCCL teardown in the
  // destructor (window deregistration, communicator destroy or abort) has no deadline of its own:
  // past TeamOptions::nccl_call_timeout_s (after a failure, past sync's default limit if sooner) it
  // ends the process as a CallDeadline does, naming them.
  void finish();

 private:
  Team() = default;
  double default_sync_limit_s() const { return 2 * timeout_s_ + 10; }
  void init(const TeamOptions& options);

  RankEnv env_;
  int device_ = -1;
  int sm_count_ = 0;
  double timeout_s_ = 10;
  double nccl_call_timeout_s_ = 600;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<CoordinatorClient> client_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<SymmetricHeap> heap_;
  uint32_t* abort_flag_ = nullptr;  // host-mapped
  dev::WaitRecord* record_ = nullptr;  // host-mapped
  uint64_t* barrier_slots_ = nullptr;  // heap
  dev::LaunchSequence barrier_seq_{};
  bool check_launches_ = false;
  std::atomic<uint64_t> launches_checked_{0};
  bool finished_ = false;
  bool counted_live_ = false;  // holds the process's one live Team (given back by ~Team)
};

// The device wait deadline (s) and the heap size (bytes) a Team takes from `options` and the
// environment (TAXFREE_TIMEOUT_S, TAXFREE_HEAP_BYTES, read through `env`). InvalidArgument naming
// the option or variable for a value out of the ranges of TeamOptions (NaN, inf, 0 included);
// team_timeout_s also checks bootstrap_timeout_s and nccl_call_timeout_s, in [0.001, 1e6] s.
double team_timeout_s(const TeamOptions& options, const EnvLookup& env);
uint64_t team_heap_bytes(const TeamOptions& options, int world, const EnvLookup& env);

// Human-readable name of a device wait site.
const char* wait_site_name(dev::WaitSite site);
// The diagnostic the host prints for a filled WaitRecord; with the waiting rank's heap, the flag's
// allocation is named too (SymmetricHeap::describe_offset).
std::string describe_wait_record(const dev::WaitRecord& r, const SymmetricHeap* heap = nullptr);

// Checks that the NCCL library loaded at run time is the one the headers were compiled for;
// throws NotSupported naming both versions (and the library path) otherwise.
void check_nccl_version();

}  // namespace taxfree
