// Stream release hooks: how a layer above the runtime frees what it keeps per stream (the GEMM
// workspace of ops/gemm.h) before the runtime destroys a stream it owns (Team's stream). The
// runtime cannot name the ops layer; the ops layer registers a hook the first time it keeps
// something for a stream.
//
// A hook is called with the stream on the current device, after the runtime has synchronised it,
// before cudaStreamDestroy. It may enqueue stream-ordered frees on it. Hooks run in registration
// order; adding one twice keeps one. Both calls are thread-safe.
#pragma once

#include <cuda_runtime_api.h>

namespace taxfree {

using StreamReleaseHook = void (*)(cudaStream_t stream);

void add_stream_release_hook(StreamReleaseHook hook);

// Runs every hook on `stream`. Never throws (it serves destructors): a hook's error is written to
// stderr, naming the stream, and the other hooks still run. Returns false if any hook failed.
bool run_stream_release_hooks(cudaStream_t stream) noexcept;

}  // namespace taxfree
