// ReplayGraphMs: how the benchmarks time a captured CUDA graph (the decode steps' form): the graph
// instantiated, replayed once untimed, then `replays` times between two events. EventTimeUs: how
// they time eager launches on the default stream.
#ifndef TANDEM_KERNELS_CUDA_GRAPH_TIMING_H_
#define TANDEM_KERNELS_CUDA_GRAPH_TIMING_H_

#include <cuda_runtime.h>

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace tandem::kernels::cuda {

// Milliseconds of `replays` back-to-back replays of `graph` on `stream` (after one untimed
// replay). Takes ownership of `graph` and destroys it, with its executable, on every path. A CUDA
// error of any step as a status.
inline absl::StatusOr<float> ReplayGraphMs(cudaGraph_t graph, cudaStream_t stream, int replays) {
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  float ms = 0;
  absl::Status st = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    for (int i = 0; i < replays; ++i) CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    return absl::OkStatus();
  }();
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (!st.ok()) return st;
  return ms;
}

// Microseconds per call of `call(i)` (i = 0 .. calls - 1, each an absl::Status-returning launch
// sequence on `stream`) as serving replays decode: the calls captured in one CUDA graph (relaxed
// capture), replayed once untimed, then `replays` times (ReplayGraphMs).
template <typename Call>
absl::StatusOr<double> CapturedCallsUs(Call&& call, cudaStream_t stream, int calls = 20,
                                       int replays = 5) {
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  absl::Status st;
  for (int i = 0; i < calls && st.ok(); ++i) st = call(i);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  RETURN_IF_ERROR(st);
  CUDA_RETURN_IF_ERROR(end);
  ASSIGN_OR_RETURN(const float ms, ReplayGraphMs(graph, stream, replays));
  return ms * 1e3 / (calls * replays);
}

// Microseconds per call of `fn` (launches on the default stream): `warmup` untimed calls, then
// `iters` between two events. Launch-bound where a call's kernels are shorter than its host cost.
inline double EventTimeUs(int iters, const std::function<void()>& fn, int warmup = 10) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < iters; ++i) fn();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1000.0 * ms / iters;
}

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_CUDA_GRAPH_TIMING_H_
