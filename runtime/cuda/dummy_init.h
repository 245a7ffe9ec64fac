// Device-side random weights for --load_format=dummy on the CUDA backend: multi-GB models are
// generated where they live instead of on the host, and a tensor-parallel rank draws only its
// own slices (runtime/model/dummy_draw.h: the values the whole tensor has at those indices).
#ifndef TANDEM_RUNTIME_CUDA_DUMMY_INIT_H_
#define TANDEM_RUNTIME_CUDA_DUMMY_INIT_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/model/dummy_draw.h"

namespace tandem::runtime::cuda {

// out[i] = T(DummyValue(seed, stream_id, slice.GlobalIndex(i), mean)) for i < slice.numel(),
// rounded to nearest from the fp32 value (as the host upload converts RandomModelWeights).
// T is float, __nv_bfloat16 or __half. Enqueued on `stream`.
template <typename T>
absl::Status FillDummySlice(T* out, const DummySlice& slice, float mean, uint64_t seed,
                            uint64_t stream_id, cudaStream_t stream);

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_DUMMY_INIT_H_
