// The coordinator: a small TCP service every rank of a job stays connected to.
//
// It carries the bootstrap (NCCL unique id, heap-consistency records, host barriers) and, above
// all, liveness: a rank that dies closes its connection, a rank that fails says so, and the
// coordinator tells every other rank at once, so no rank is ever left waiting for a dead peer.
// The launcher hosts it (`taxfree ...`); under torchrun/mpirun rank 0 hosts it.
//
// Thread safety: a CoordinatorClient may be used from several threads. Every blocking call has a
// timeout and returns early (throwing RemoteError) when the job is aborting. Connections use TCP
// keepalive, so a rank or coordinator host that vanishes without closing (power, network) is
// noticed ~11 s after it last answered, like one that exits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace taxfree {

// Process exit codes of ranks and of the launcher.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailed = 1,        // this rank failed (error, timeout)
  kExitUsage = 2,         // bad command line
  kExitRemote = 3,        // another rank failed; this one stopped because of it
  kExitNoGpu = 4,         // no (or too few) GPUs for what was asked
  kExitWrongResult = 5,   // a benchmark or check found wrong elements
};

class CoordinatorServer {
 public:
  // Listens on host:port (port 0: any free port) for `world` ranks. Throws SystemError (socket,
  // bind, listen), InvalidArgument (world < 1, a port outside [0, 65535], a host that is not an
  // IPv4 address).
  CoordinatorServer(const std::string& host, int port, int world);
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  int port() const { return port_; }
  // The launcher saw rank `rank` end abnormally (exit code or signal, in words). The job's first
  // failure either way; the other ranks are told unless the rank `exited` (not by a signal) after
  // its latest connection said it finished (e.g. a benchmark's "wrong elements" exit code): its
  // peers finished too and are tearing down, which an abort would turn into a failed teardown.
  void rank_ended_abnormally(int rank, const std::string& how, bool exited);
  // "rank R: message" of the first failure, or empty.
  std::string first_failure() const;

 private:
  struct Conn;
  void serve();
  void handle_line(Conn& c, const std::string& line);
  // Appends `n` received bytes to c's input and handles its complete lines.
  void take_bytes_locked(Conn& c, const char* data, size_t n);
  // Keeps "rank R: message" as the job's first failure unless there is one.
  void record_failure_locked(int rank, const std::string& message);
  // Records the job's first failure and, unless an abort went out already, tells every connection
  // but `source` (the one that reported it, if any). rank -1: the coordinator itself.
  void fail_locked(int rank, const std::string& message, const Conn* source);
  void send_locked(Conn& c, const std::string& line);
  void close_locked(Conn& c);

  int world_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::map<std::string, std::string> kv_;
  std::map<std::string, std::set<int>> barriers_;
  std::string first_failure_;
  bool abort_sent_ = false;  // under mu_: the ranks were told (not after a finished rank's exit code)
  std::thread thread_;
};

class CoordinatorClient {
 public:
  // Connects (retrying until `connect_timeout_s`) and says hello. Throws Timeout (no connection by
  // then), InvalidArgument (a host name that does not resolve).
  CoordinatorClient(const std::string& host, int port, int rank, int world, double connect_timeout_s);
  ~CoordinatorClient();
  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }

  // Keys and barrier names must be non-empty without spaces or line breaks (InvalidArgument). A key
  // is set once per job: setting it again with another value fails the job (every rank is told,
  // naming the key), since a rank that has read it keeps the first value. Values may be any bytes.
  // A rank that connects again after its earlier connection finished (a second Team, one after the
  // other, under the taxfree launcher) starts with fresh keys and barrier names, shared with the
  // other ranks' connections of the same order.
  void set(const std::string& key, const std::string& value);
  // A key for an exchange that repeats within a job: `stem` + "#" + a count kept by this client.
  // Collective in the sense that ranks calling it in the same order get the same keys.
  std::string next_key(const std::string& stem);
  // Blocks until some rank has set `key`. Throws Timeout (naming the key) or RemoteError.
  std::string get(const std::string& key, double timeout_s);
  // Every rank contributes `value`; returns all of them indexed by rank.
  std::vector<std::string> all_gather(const std::string& key, const std::string& value, double timeout_s);
  // Host barrier. On timeout the job is aborted with the names of the ranks that did not arrive.
  void barrier(const std::string& name, double timeout_s);

  // Tell every rank that this one failed (first failure wins). Idempotent.
  void fail(const std::string& message);
  // This rank finished cleanly: closing the connection afterwards is not a failure.
  void finish();

  bool aborted() const { return aborted_.load(); }
  std::string abort_message() const;
  // Throws RemoteError if the job is aborting.
  void throw_if_aborted() const;
  // Called once, from the watchdog thread, when the job starts aborting (a remote failure or the
  // coordinator vanishing), before aborted() turns true and before any waiter in get() / barrier()
  // wakes with RemoteError. Used to raise the device abort flag, so whoever sees the abort on the
  // host finds the GPUs already told.
  void on_abort(std::function<void()> callback);
  // After an abort, the watchdog ends this process with kExitRemote if it is still alive after
  // `seconds` (the main thread normally exits first). Default 5 s; <= 0 disables.
  void set_exit_grace(double seconds) { exit_grace_s_ = seconds; }

 private:
  void watch();
  void send(const std::string& line);
  void start_abort(const std::string& message);

  int rank_, world_;
  int fd_ = -1;
  std::mutex send_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
  std::set<std::string> passed_;
  std::atomic<bool> aborted_{false};
  bool aborting_ = false;  // under mu_: start_abort began (its callback may still be running)
  std::atomic<bool> finished_{false};
  std::atomic<bool> failed_sent_{false};
  std::atomic<bool> closing_{false};  // the destructor runs
  std::atomic<uint64_t> keys_made_{0};
  std::string abort_message_;
  std::function<void()> on_abort_;
  std::atomic<double> exit_grace_s_{5.0};
  std::thread watchdog_;
};

// hex encoding for binary values (NCCL ids) on the line protocol
std::string to_hex(const void* data, size_t n);
std::string from_hex(const std::string& hex);

// The check modes' comparison (symmetric heap calls, op launches): every rank passes `what` for
// call number `index` of one kind, published under "<key>-<index>". Returns when every rank's is
// the same; throws InvalidUsage "<kind> #<index> differs across ranks: rank 0 did <what>, rank r did
// <what>" naming the first rank that differs from rank 0, Timeout naming a rank that made no such
// call within timeout_s (with this rank's), RemoteError if the job aborts. Keeps world values in
// the coordinator and in this client for good: meant for debugging runs.
void require_same_call(CoordinatorClient& c, const std::string& key, const std::string& kind, uint64_t index,
                       const std::string& what, double timeout_s);

}  // namespace taxfree
