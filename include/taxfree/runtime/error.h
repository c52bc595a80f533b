// Typed, located errors for the host runtime.
//
// Contract: every failing host call throws taxfree::Error. Its status says what kind of failure it
// is, so callers can tell "not supported here" (fall back) from "failed" (stop); its message names
// the file, line, rank and the offending value. The library ends the process itself in two cases
// only, so that no rank hangs: a rank still alive 5 s after another rank failed is ended by the
// coordinator client's watchdog (_exit(kExitRemote), team.h), and a host call into NCCL that does
// not return within its limit (TeamOptions::nccl_call_timeout_s, bootstrap_timeout_s) by its
// CallDeadline (_exit(kExitFailed), call_deadline.h), after reporting to the coordinator.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace taxfree {

enum class Status {
  InvalidArgument,  // a bad value from the caller: size, alignment, pointer, option
  InvalidUsage,     // a valid value at the wrong time or place (e.g. op needs 2+ ranks)
  NotSupported,     // this machine or build cannot do it; a caller may fall back
  SystemError,      // the OS refused (sockets, fork, files)
  CudaError,        // the CUDA runtime or driver failed
  NcclError,        // NCCL failed
  Timeout,          // a wait passed its deadline (device or host)
  RemoteError,      // another rank failed; this one stops because of it
  OutOfMemory,      // the symmetric heap or the device has too little memory
  Internal,         // a bug in taxfree
};

const char* status_name(Status s);

class Error : public std::runtime_error {
 public:
  Error(Status status, const char* file, int line, const std::string& what);
  Status status() const { return status_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int rank() const { return rank_; }

 private:
  Status status_;
  std::string file_;
  int line_;
  int rank_;
};

// The rank named in every error message of this process (one process per GPU). -1 until a Team
// (or the launcher) sets it.
void set_error_rank(int rank);
int error_rank();

namespace detail {
[[noreturn]] void throw_cuda(int code, const char* expr, const char* file, int line);
[[noreturn]] void throw_cu(int code, const char* expr, const char* file, int line);
[[noreturn]] void throw_nccl(int code, const char* expr, const char* file, int line);
}  // namespace detail

}  // namespace taxfree

// TF_THROW(Status::InvalidArgument, "M=" << m << " must be a multiple of " << w);
#define TF_THROW(status, msg)                                              \
  do {                                                                     \
    std::ostringstream tf_os_;                                             \
    tf_os_ << msg;                                                         \
    throw ::taxfree::Error((status), __FILE__, __LINE__, tf_os_.str());    \
  } while (0)

#define TF_REQUIRE(cond, status, msg) \
  do {                                \
    if (!(cond)) TF_THROW(status, msg); \
  } while (0)

#define TF_CUDA(expr)                                                                     \
  do {                                                                                    \
    auto tf_e_ = (expr);                                                                  \
    if (tf_e_ != 0) ::taxfree::detail::throw_cuda(int(tf_e_), #expr, __FILE__, __LINE__); \
  } while (0)

#define TF_CU(expr)                                                                     \
  do {                                                                                  \
    auto tf_e_ = (expr);                                                                \
    if (tf_e_ != 0) ::taxfree::detail::throw_cu(int(tf_e_), #expr, __FILE__, __LINE__); \
  } while (0)

#define TF_NCCL(expr)                                                                     \
  do {                                                                                    \
    auto tf_e_ = (expr);                                                                  \
    if (tf_e_ != 0) ::taxfree::detail::throw_nccl(int(tf_e_), #expr, __FILE__, __LINE__); \
  } while (0)
