// Timed choice among cuBLASLt's heuristic algorithms, shared by the bf16 GEMM (gemm_cuda.h) and
// the FP8 GEMM (kernels/fp8/fp8_gemm_cuda.h): for a product whose shape recurs, cuBLASLt's first
// heuristic answer can leave a good part of the GPU unused; running its top candidates once on
// the real buffers and keeping the fastest costs a few dozen launches per shape.
//
// The owner asks the heuristic for up to kCublasLtTuneCandidates results (TuneCandidates keeps
// the usable ones), runs the first while it has not tuned, and once, outside any stream capture
// (StreamIsCapturing), calls FastestCandidate with a closure that enqueues its product with a
// given algorithm.
//
// Thread safety: stateless functions; the closure's object is the caller's to guard.
#ifndef TANDEM_KERNELS_GEMM_CUDA_CUBLASLT_ALGO_TUNER_H_
#define TANDEM_KERNELS_GEMM_CUDA_CUBLASLT_ALGO_TUNER_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

// Heuristic candidates timed per tuned shape.
inline constexpr int kCublasLtTuneCandidates = 8;

// set_autotune_max_m's value that tunes every m (benchmarks: tuned vs heuristic-first).
inline constexpr int64_t kAutotuneAllM = std::numeric_limits<int64_t>::max();

// The heuristic's usable results (state CUBLAS_STATUS_SUCCESS), best first, from `found`
// results; empty when found <= 1 (nothing to choose between).
std::vector<cublasLtMatmulAlgo_t> TuneCandidates(const cublasLtMatmulHeuristicResult_t* results,
                                                 int found);

// Whether work enqueued on `stream` is being captured into a CUDA graph now (timing must not
// run then: it synchronizes).
absl::StatusOr<bool> StreamIsCapturing(cudaStream_t stream);

// Enqueues one product with `algo` on the stream given to FastestCandidate.
using CublasLtAlgoLaunch = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t& algo)>;

// Times each candidate on `stream`: 2 warm-up launches (a failing one skips the candidate: the
// heuristic offered it but it cannot run these buffers), then 10 launches between two events,
// synchronized once per candidate. Returns the index of the fastest (the earliest among equal
// times), or -1 when none ran. A failing timed launch or CUDA event call is returned as its
// status. The launches overwrite whatever the product writes.
absl::StatusOr<int> FastestCandidate(const std::vector<cublasLtMatmulAlgo_t>& candidates,
                                     const CublasLtAlgoLaunch& launch, cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_GEMM_CUDA_CUBLASLT_ALGO_TUNER_H_
