// Internal to fp8_block_gemm_cuda: the overlapped forms of Fp8BlockGemmWgmma
// (Fp8BlockOverlap::k128 / k192 / kAuto, fp8_block_gemm_cuda.h), built in
// fp8_block_gemm_overlap.cu; Fp8BlockGemmWgmma checks the arguments and calls in here.
#ifndef TANDEM_KERNELS_FP8_FP8_BLOCK_GEMM_OVERLAP_H_
#define TANDEM_KERNELS_FP8_FP8_BLOCK_GEMM_OVERLAP_H_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/fp8/fp8_block_gemm_cuda.h"

namespace tandem::kernels::cuda::fp8_block_overlap {

// A row-major [rows][k] byte matrix as a TMA tensor map: boxes of 128 columns x box_rows rows,
// 128-byte swizzle (wgmma's K-major layout), zeros past the ends (fp8_block_gemm_cuda.cu).
absl::StatusOr<CUtensorMap> EncodeCodes(const uint8_t* base, int64_t rows, int64_t k, int box_rows);

// The kernels' shared-memory opt-in (sm_90 devices only; the caller checks).
absl::Status Init();

// Launches the overlapped kernel of `overlap` (not kNone) on validated arguments (m, n > 0).
absl::Status Launch(Fp8BlockOverlap overlap, const uint8_t* a_codes, const float* a_scales,
                    const uint8_t* w_codes, const float* w_scales, int64_t m, int64_t n, int64_t k,
                    __nv_bfloat16* out, const __nv_bfloat16* bias, cudaStream_t stream);

}  // namespace tandem::kernels::cuda::fp8_block_overlap

#endif  // TANDEM_KERNELS_FP8_FP8_BLOCK_GEMM_OVERLAP_H_
