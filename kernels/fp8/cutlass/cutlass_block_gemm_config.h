// Internal to :cutlass_block_gemm: the configurations' entry points, each defined in its own
// .cu file (cutlass_block_gemm_coop128.cu, cutlass_block_gemm_pingpong64.cu) from
// cutlass_block_gemm_kernel.cuh, called by cutlass_block_gemm.cu after it checked the problem.
#ifndef TANDEM_KERNELS_FP8_CUTLASS_CUTLASS_BLOCK_GEMM_CONFIG_H_
#define TANDEM_KERNELS_FP8_CUTLASS_CUTLASS_BLOCK_GEMM_CONFIG_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda::cutlass_block {

// A checked problem (CutlassFp8BlockGemmArgs after validation): k a multiple of 128, a_scales
// [k / 128, a_scale_ld] with a_scale_ld = m rounded up to 4, w_scales [ceil(n / 128),
// w_scale_ld]; every size fits an int.
struct Problem {
  const uint8_t* a = nullptr;
  const float* a_scales = nullptr;
  int64_t a_scale_ld = 0;
  const uint8_t* w = nullptr;
  const float* w_scales = nullptr;
  int64_t w_scale_ld = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  __nv_bfloat16* out = nullptr;
  int device = 0;
  int sm_count = 0;  // 0: CUTLASS asks the device
  int swizzle = 1;   // the tile scheduler's max_swizzle_size (1, 2, 4, 8)
  int raster = 0;    // 0 heuristic, 1 along m, 2 along n
};

// CUTLASS's own workspace for the problem (the scale copy not included).
size_t Cooperative128WorkspaceBytes(const Problem& p);
absl::Status Cooperative128Init();
absl::Status Cooperative128Run(const Problem& p, void* workspace, cudaStream_t stream);

size_t Pingpong64WorkspaceBytes(const Problem& p);
absl::Status Pingpong64Init();
absl::Status Pingpong64Run(const Problem& p, void* workspace, cudaStream_t stream);

}  // namespace tandem::kernels::cuda::cutlass_block

#endif  // TANDEM_KERNELS_FP8_CUTLASS_CUTLASS_BLOCK_GEMM_CONFIG_H_
