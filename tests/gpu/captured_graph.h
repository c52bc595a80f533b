// A CUDA graph of the work a callable enqueues on one stream, for the tests that replay ops as
// serving engines replay a captured step. The ops must have run once outside a capture (plans,
// kernel attributes, cuBLASLt's kernels loaded), so the capture records only stream work.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "taxfree/runtime/error.h"

namespace taxfree::test {

class CapturedGraph {
 public:
  // Captures (thread-locally) what `enqueue()` puts on `s`, instantiates it and uploads it on `s`,
  // so the first replay does not pay the upload. A throw inside the capture ends it and rethrows.
  template <class Enqueue>
  CapturedGraph(cudaStream_t s, Enqueue&& enqueue) {
    TF_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      enqueue();
    } catch (...) {
      cudaStreamEndCapture(s, &graph);  // leaves the stream usable
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    TF_CUDA(cudaStreamEndCapture(s, &graph));
    const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    TF_CUDA(made);
    const cudaError_t uploaded = cudaGraphUpload(exec_, s);
    if (uploaded != cudaSuccess) cudaGraphExecDestroy(std::exchange(exec_, nullptr));  // no destructor runs
    TF_CUDA(uploaded);
  }
  CapturedGraph(CapturedGraph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  CapturedGraph& operator=(CapturedGraph&&) = delete;
  CapturedGraph(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
  }

  // Enqueues one replay on `s`.
  void launch(cudaStream_t s) const { TF_CUDA(cudaGraphLaunch(exec_, s)); }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace taxfree::test
