// GPU smoke workload for the test bundle: a two-pass float32 sum reduction.
//
// It exists to prove the GPU toolchain end to end (nvcc objects linked into a Bazel test,
// static cudart, bundle staging, run on an H200) with real work checked against a CPU
// reference, and to report the achieved read bandwidth.
#ifndef TANDEM_TESTS_GPU_REDUCE_SUM_H_
#define TANDEM_TESTS_GPU_REDUCE_SUM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::gpu_smoke {

// Bytes of device workspace ReduceSumF32 needs (independent of n).
int64_t ReduceSumWorkspaceBytes();

// *d_out = sum of d_in[0..n) with fp32 per-thread accumulation and fp64 block/grid combination.
// d_in: [n] float (device, any alignment); d_out: one double (device);
// d_workspace: ReduceSumWorkspaceBytes() bytes (device). Asynchronous on `stream`.
// REQUIRES: n >= 0.
absl::Status ReduceSumF32(const float* d_in, int64_t n, double* d_out, void* d_workspace,
                          cudaStream_t stream);

}  // namespace tandem::gpu_smoke

#endif  // TANDEM_TESTS_GPU_REDUCE_SUM_H_
