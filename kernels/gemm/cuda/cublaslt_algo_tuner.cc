#include "kernels/gemm/cuda/cublaslt_algo_tuner.h"

#include "common/cublas_status.h"
#include "common/cuda_status.h"

namespace tandem::kernels::cuda {

std::vector<cublasLtMatmulAlgo_t> TuneCandidates(const cublasLtMatmulHeuristicResult_t* results,
                                                 int found) {
  std::vector<cublasLtMatmulAlgo_t> candidates;
  for (int i = 0; found > 1 && i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) candidates.push_back(results[i].algo);
  }
  return candidates;
}

absl::StatusOr<bool> StreamIsCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

absl::StatusOr<int> FastestCandidate(const std::vector<cublasLtMatmulAlgo_t>& candidates,
                                     const CublasLtAlgoLaunch& launch, cudaStream_t stream) {
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  struct EventDeleter {
    cudaEvent_t* e;
    ~EventDeleter() {
      if (*e != nullptr) cudaEventDestroy(*e);
    }
  } start_deleter{&start}, stop_deleter{&stop};
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  constexpr int kWarmup = 2, kReps = 10;
  float best_ms = 0;
  int best = -1;
  for (int c = 0; c < static_cast<int>(candidates.size()); ++c) {
    const cublasLtMatmulAlgo_t& algo = candidates[c];
    bool ok = true;
    for (int i = 0; i < kWarmup && ok; ++i) ok = launch(algo) == CUBLAS_STATUS_SUCCESS;
    if (!ok) continue;  // a candidate the heuristic offered but cannot run: skip it
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    for (int i = 0; i < kReps; ++i) CUBLAS_RETURN_IF_ERROR(launch(algo));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    if (best < 0 || ms < best_ms) {
      best_ms = ms;
      best = c;
    }
  }
  return best;
}

}  // namespace tandem::kernels::cuda
