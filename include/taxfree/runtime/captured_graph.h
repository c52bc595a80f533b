// CapturedGraph: a CUDA graph of the work a callable enqueues on one stream, instantiated and
// uploaded, replayed by launch() -- as serving engines replay a captured step.
//
// Contract:
//  - Capture is thread-local (cudaStreamCaptureModeThreadLocal): other threads' CUDA calls are
//    not affected. What `enqueue` puts on the stream must be capturable: no synchronisation, no
//    allocation (run the work once outside a capture first, so plans, kernel attributes and
//    workspaces exist).
//  - A throw from `enqueue` ends the capture (the stream is usable again, no stale CUDA error
//    left) and is rethrown; a capture CUDA refuses throws CudaError naming `what`.
//  - launch() enqueues one replay on any stream and does not block. Move-only; the destructor frees
//    the graph (the caller keeps its replays' buffers alive until they complete).
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

namespace taxfree {

class CapturedGraph {
 public:
  template <class Enqueue>
  CapturedGraph(cudaStream_t s, Enqueue&& enqueue, const std::string& what = "a CUDA graph") {
    begin_capture(s);
    try {
      enqueue();
    } catch (...) {
      abandon_capture(s);
      throw;
    }
    end_capture(s, what);
  }
  CapturedGraph(CapturedGraph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  CapturedGraph& operator=(CapturedGraph&&) = delete;
  CapturedGraph(const CapturedGraph&) = delete;
  ~CapturedGraph();

  // Enqueues one replay on `s`.
  void launch(cudaStream_t s) const;

 private:
  static void begin_capture(cudaStream_t s);
  static void abandon_capture(cudaStream_t s);
  void end_capture(cudaStream_t s, const std::string& what);  // instantiates and uploads

  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace taxfree
