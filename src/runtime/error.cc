#include "taxfree/runtime/error.h"

#include "taxfree/runtime/driver_api.h"
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstring>

namespace taxfree {
namespace {
std::atomic<int> g_rank{-1};

std::string locate(const char* file, int line, const std::string& what) {
  const char* base = std::strrchr(file, '/');
  std::ostringstream os;
  os << "[taxfree";
  if (g_rank.load() >= 0) os << " rank " << g_rank.load();
  os << " " << (base ? base + 1 : file) << ":" << line << "] " << what;
  return os.str();
}
}  // namespace

const char* status_name(Status s) {
  switch (s) {
    case Status::InvalidArgument: return "invalid argument";
    case Status::InvalidUsage: return "invalid usage";
    case Status::NotSupported: return "not supported";
    case Status::SystemError: return "system error";
    case Status::CudaError: return "CUDA error";
    case Status::NcclError: return "NCCL error";
    case Status::Timeout: return "timeout";
    case Status::RemoteError: return "remote rank failed";
    case Status::OutOfMemory: return "out of memory";
    case Status::Internal: return "internal error";
  }
  return "unknown";
}

Error::Error(Status status, const char* file, int line, const std::string& what)
    : std::runtime_error(locate(file, line, std::string(status_name(status)) + ": " + what)),
      status_(status),
      file_(file),
      line_(line),
      rank_(g_rank.load()) {}

void set_error_rank(int rank) { g_rank.store(rank); }
int error_rank() { return g_rank.load(); }

namespace detail {
void throw_cuda(int code, const char* expr, const char* file, int line) {
  auto e = static_cast<cudaError_t>(code);
  // Reported by this throw: a later cudaGetLastError check (after a launch) must not name it again
  // (errors that corrupt the context stay sticky whatever this does).
  (void)cudaGetLastError();
  Status s = (e == cudaErrorMemoryAllocation) ? Status::OutOfMemory
             : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) ? Status::NotSupported
                                                                             : Status::CudaError;
  throw Error(s, file, line,
              std::string(expr) + " -> " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
void throw_cu(int code, const char* expr, const char* file, int line) {
  auto r = static_cast<CUresult>(code);
  Status s = r == CUDA_ERROR_OUT_OF_MEMORY ? Status::OutOfMemory
             : r == CUDA_ERROR_NOT_SUPPORTED ? Status::NotSupported
                                             : Status::CudaError;
  throw Error(s, file, line, std::string(expr) + " -> " + driver::error_name(r));
}
void throw_nccl(int code, const char* expr, const char* file, int line) {
  auto r = static_cast<ncclResult_t>(code);
  // ncclRemoteError (a peer or the network, as NCCL saw it) is NcclError: this rank reports it.
  // RemoteError means the coordinator announced another rank's failure, which a rank does not report.
  Status s = r == ncclInvalidArgument ? Status::InvalidArgument
             : r == ncclInvalidUsage  ? Status::InvalidUsage
                                      : Status::NcclError;
  throw Error(s, file, line, std::string(expr) + " -> " + ncclGetErrorString(r));
}
}  // namespace detail
}  // namespace taxfree
