#include "taxfree/runtime/captured_graph.h"

#include "taxfree/runtime/error.h"

namespace taxfree {

void CapturedGraph::begin_capture(cudaStream_t s) {
  TF_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
}

void CapturedGraph::abandon_capture(cudaStream_t s) {
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(s, &graph);  // leaves the stream usable for the error path
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // and no stale error for the next call to find
}

void CapturedGraph::end_capture(cudaStream_t s, const std::string& what) {
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  if (ended != cudaSuccess || !graph) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    TF_THROW(Status::CudaError, what << " could not be captured into a CUDA graph (" << cudaGetErrorString(ended) << ")");
  }
  const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  TF_CUDA(made);
  const cudaError_t uploaded = cudaGraphUpload(exec_, s);  // the first replay does not pay it
  if (uploaded != cudaSuccess) cudaGraphExecDestroy(std::exchange(exec_, nullptr));  // no destructor runs
  TF_CUDA(uploaded);
}

CapturedGraph::~CapturedGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

void CapturedGraph::launch(cudaStream_t s) const { TF_CUDA(cudaGraphLaunch(exec_, s)); }

}  // namespace taxfree
