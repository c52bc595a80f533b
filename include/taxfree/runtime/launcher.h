// Starting the ranks of a job, and reading which rank this process is.
//
// `taxfree` starts one process per GPU itself (fork + exec before any CUDA call in the parent:
// CUDA is not fork-safe) and hosts the coordinator; or it joins ranks started by torchrun or
// mpirun. Either way a rank learns who it is from the environment (rank_env()).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace taxfree {

struct RankEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string coordinator_host = "127.0.0.1";
  int coordinator_port = 0;
  bool host_coordinator = false;  // rank 0 of a torchrun/mpirun job hosts the coordinator
  bool launcher_coordinator = false;  // the taxfree launcher hosts it: it outlives this process's Teams
  std::string source;             // which launcher's variables were read, for messages
};

using EnvLookup = std::function<const char*(const char*)>;

// The job this process belongs to, from (in order): the taxfree launcher (TAXFREE_COORDINATOR,
// RANK, WORLD_SIZE, LOCAL_RANK), torchrun or a user (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT; the coordinator listens on MASTER_PORT+1 unless TAXFREE_COORDINATOR_PORT is set,
// because torchrun's own store holds MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*), MPICH/Hydra
// (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID). std::nullopt when none is set: a single-process job.
// Throws InvalidArgument naming the variable for malformed or inconsistent values (RANK or
// WORLD_SIZE without the other, too).
std::optional<RankEnv> rank_env(const EnvLookup& lookup);
std::optional<RankEnv> rank_env();  // from the process environment

struct LaunchSpec {
  int nranks = 1;
  std::vector<std::string> argv;  // program and arguments each rank runs
  double grace_s = 5.0;           // after a failure, how long the others get to stop by themselves
};

// Runs `spec.argv` as `nranks` ranks on this host and waits for them. If a rank fails, exits
// non-zero or is killed, every other rank is told at once (through the coordinator), and any still
// running after the grace period is killed. Prints what ended the job to stderr. Returns the exit
// code for the launcher: 0 if all ranks succeeded, else the first failing rank's code that is not
// kExitRemote (a rank that stopped because another failed; 128 + signal number for a killed rank),
// or kExitRemote if that is all there is; 128 + the signal if the launcher itself was interrupted.
int run_ranks(const LaunchSpec& spec);

// Number of GPUs visible to CUDA, asked of a child process (`argv0 _probe-gpus`) so the caller
// never initialises CUDA before forking ranks. 0 when there is none; `why` then says what CUDA
// reported, or that the probe did not answer within `timeout_s` (it is then killed).
int probe_visible_gpus(const std::string& self_exe, std::string* why, double timeout_s = 120);

// Absolute path of the running executable.
std::string self_executable();

// Multicast (NVLS) off unless the environment says otherwise: sets NCCL_NVLS_ENABLE=0,
// NVSHMEM_DISABLE_NVLS=1 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 where they are unset. taxfree's
// ops never use multicast; NCCL would set it up by default where the NVLink fabric offers it.
// Call at the start of main, before any thread starts (setenv); the ranks a launcher starts
// inherit it. The taxfree CLI and the GPU test binary do.
void default_multicast_off();

}  // namespace taxfree
