// Device-side random weights for --load_format=dummy on the CUDA backend: multi-GB models are
// generated where they live instead of on the host.
#ifndef TANDEM_RUNTIME_CUDA_DUMMY_INIT_H_
#define TANDEM_RUNTIME_CUDA_DUMMY_INIT_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::runtime::cuda {

// out[i] = mean + stddev * N(0, 1), the normal drawn by Box-Muller from Philox4x32-10 with
// key = seed and counter = {i / 2, stream_id low, stream_id high, 0}: deterministic in
// (seed, stream_id, i), independent of the launch shape. T is float, __nv_bfloat16 or __half.
template <typename T>
absl::Status FillNormal(T* out, int64_t n, float mean, float stddev, uint64_t seed,
                        uint64_t stream_id, cudaStream_t stream);

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_DUMMY_INIT_H_
