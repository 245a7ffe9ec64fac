// FP8 GEMM for prefill through cuBLASLt's FP8 matmul (issue 38 item 4): e4m3 activations and
// weights, fp32 accumulation, bf16 output, scales applied by cuBLASLt:
//   * kTensor: one scale per matrix (per-tensor weights, static activations), scale pointers;
//   * kTokenChannel: a per-token scale vector for the activations and a per-channel one for the
//     weights (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on both, CUDA 12.9+ cuBLASLt).
// 128x128-block weights with 1x128 activations (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F /
// VEC128_32F, declared by this CUDA 13 header) are not wired yet: UNIMPLEMENTED.
// Status: built; NOT yet run on a GPU in this tree (README.md).
//
// Thread safety: not thread-safe (plan cache, descriptor scale pointers), like CublasLtGemm.
// CUDA graphs: allocates nothing on the device and never synchronizes; warm each shape up first.
#ifndef TANDEM_KERNELS_FP8_FP8_GEMM_CUDA_H_
#define TANDEM_KERNELS_FP8_FP8_GEMM_CUDA_H_

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

enum class Fp8GemmScaling { kTensor, kTokenChannel, kBlock128 };

class CublasLtFp8Gemm {
 public:
  static constexpr int64_t kDefaultWorkspaceBytes = int64_t{32} << 20;

  // The cuBLASLt handle and a device workspace on the current device. RESOURCE_EXHAUSTED when
  // the workspace does not fit.
  static absl::StatusOr<std::unique_ptr<CublasLtFp8Gemm>> Create(
      int64_t workspace_bytes = kDefaultWorkspaceBytes);

  CublasLtFp8Gemm(const CublasLtFp8Gemm&) = delete;
  CublasLtFp8Gemm& operator=(const CublasLtFp8Gemm&) = delete;
  ~CublasLtFp8Gemm();

  // out[m, n] = sum_k (a[i, c] * a_scale) * (w[j, c] * w_scale) in fp32, rounded once to bf16.
  // a_codes: [m, k] e4m3, row-major; w_codes: [n, k] e4m3 (nn.Linear layout); both 16-byte
  // aligned, k a multiple of 16. Scales are device fp32: kTensor one each; kTokenChannel
  // a_scales [m] and w_scales [n]. Asynchronous on `stream`. m == 0 or n == 0: OK, nothing
  // launched. INVALID_ARGUMENT for bad sizes or pointers; UNIMPLEMENTED for kBlock128 or when
  // cuBLASLt has no kernel for the shape and scaling (named).
  absl::Status Linear(const uint8_t* a_codes, const float* a_scales, const uint8_t* w_codes,
                      const float* w_scales, Fp8GemmScaling scaling, int64_t m, int64_t n,
                      int64_t k, __nv_bfloat16* out, cudaStream_t stream);

 private:
  struct Plan;
  using PlanKey = std::tuple<int64_t, int64_t, int64_t, int>;

  CublasLtFp8Gemm(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes);
  absl::StatusOr<Plan*> GetPlan(const PlanKey& key);

  cublasLtHandle_t handle_;
  void* workspace_;
  int64_t workspace_bytes_;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_FP8_GEMM_CUDA_H_
