// Small device kernels around the cuBLASLt FP8 GEMM (fp8_gemm_cuda.h): the layout change its
// block-scaled mode needs.
//
// Thread safety: stateless; asynchronous on `stream`; usable inside CUDA graph capture.
#ifndef TANDEM_KERNELS_FP8_FP8_GEMM_KERNELS_H_
#define TANDEM_KERNELS_FP8_FP8_GEMM_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// out[g * m + i] = scales[i * groups + g]: QuantizeActivations' kDynamicGroup128 scales
// [m, groups] (row-major) as cuBLASLt's VEC128_32F mode reads them, [groups, m]. `out` must not
// alias `scales`. INVALID_ARGUMENT for null buffers, m < 0 or groups < 1; m == 0 launches
// nothing.
absl::Status TransposeGroupScales(const float* scales, int64_t m, int64_t groups, float* out,
                                  cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_FP8_GEMM_KERNELS_H_
