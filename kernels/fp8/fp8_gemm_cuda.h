// FP8 GEMM for prefill through cuBLASLt's FP8 matmul (issue 38 item 4): e4m3 activations and
// weights, fp32 accumulation, bf16 output:
//   * kTensor: one scale per matrix (per-tensor weights, static activations), applied by
//     cuBLASLt through its scale pointers, bf16 written by cuBLASLt;
//   * kTokenChannel: a per-token scale vector for the activations and a per-channel one for the
//     weights. cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F has no kernel on sm_90
//     (0 algorithms for every shape on an H200, CUDA 13), so by default this is cuBLASLt's FP8
//     matmul with unit scales writing the fp32 product into a preallocated accumulator, then one
//     epilogue kernel (ScaleFp8Accumulator: acc * a_scale[i] * w_scale[j] (+ bias), one rounding
//     to bf16). m is cut into chunks of rows whose fp32 product fits the accumulator. Create
//     asks cuBLASLt once whether it has outer-vector FP8 kernels (a heuristic query on one
//     shape); where it has (newer GPUs), kTokenChannel uses them, and any shape they lack falls
//     back to the epilogue path.
// 128x128-block weights with 1x128 activations (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F /
// VEC128_32F, declared by this CUDA 13 header) are not wired yet: UNIMPLEMENTED.
// Status: kTensor ran on an H200 (the outer-vector mode found no kernel there); the epilogue
// path and the Create-time query are built but NOT yet run on a GPU (README.md).
//
// Thread safety: not thread-safe (plan cache, descriptor scale pointers, the accumulator), like
// CublasLtGemm.
// CUDA graphs: allocates nothing on the device after Create and never synchronizes; warm each
// shape up first (plans are built on first use).
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
  // The fp32 product of the kTokenChannel epilogue path: 256 MiB holds 2,340 rows of Llama-3-8B's
  // fused gate_up (n = 28672) or 16,384 rows of n = 4096 per cuBLASLt call.
  static constexpr int64_t kDefaultAccumulatorBytes = int64_t{256} << 20;

  // The cuBLASLt handle, a device workspace and the fp32 accumulator on the current device.
  // RESOURCE_EXHAUSTED when they do not fit. try_outer_vector: ask cuBLASLt once whether it has
  // outer-vector FP8 kernels and use them for kTokenChannel where it does (false: always the
  // epilogue path, as tests force it).
  static absl::StatusOr<std::unique_ptr<CublasLtFp8Gemm>> Create(
      int64_t workspace_bytes = kDefaultWorkspaceBytes,
      int64_t accumulator_bytes = kDefaultAccumulatorBytes, bool try_outer_vector = true);

  CublasLtFp8Gemm(const CublasLtFp8Gemm&) = delete;
  CublasLtFp8Gemm& operator=(const CublasLtFp8Gemm&) = delete;
  ~CublasLtFp8Gemm();

  // out[m, n] = sum_k (a[i, c] * a_scale) * (w[j, c] * w_scale) in fp32 (+ bias[j]), rounded
  // to bf16 (once on the epilogue path; the bias is a second rounding on the cuBLASLt-scaled
  // paths). a_codes: [m, k] e4m3, row-major; w_codes: [n, k] e4m3 (nn.Linear layout); both
  // 16-byte aligned, k a multiple of 16 (n a multiple of 8 or cuBLASLt may have no kernel:
  // UNIMPLEMENTED). Scales are device fp32: kTensor one
  // each; kTokenChannel a_scales [m] and w_scales [n]. bias: [n] bf16 or null. Asynchronous on
  // `stream`. m == 0 or n == 0: OK, nothing launched. INVALID_ARGUMENT for bad sizes or pointers;
  // UNIMPLEMENTED for kBlock128 or when cuBLASLt has no kernel for the shape (named).
  absl::Status Linear(const uint8_t* a_codes, const float* a_scales, const uint8_t* w_codes,
                      const float* w_scales, Fp8GemmScaling scaling, int64_t m, int64_t n,
                      int64_t k, __nv_bfloat16* out, cudaStream_t stream,
                      const __nv_bfloat16* bias = nullptr);

  // Whether kTokenChannel runs on cuBLASLt's outer-vector scale mode (false on sm_90).
  bool outer_vector_scales() const { return outer_vector_; }
  // Rows per cuBLASLt call on the epilogue path for n output columns (0: not even one fits).
  int64_t EpilogueChunkRows(int64_t n) const;

 private:
  struct Plan;
  // The plan kinds: cuBLASLt-scaled per tensor (bf16 out), outer vectors (bf16 out), or unit
  // scales with the fp32 product out (the epilogue path).
  enum PlanKind : int { kTensorPlan = 0, kOuterVectorPlan = 1, kUnscaledF32Plan = 2 };
  using PlanKey = std::tuple<int64_t, int64_t, int64_t, int>;

  CublasLtFp8Gemm(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes,
                  float* accumulator, int64_t accumulator_bytes);
  absl::StatusOr<Plan*> GetPlan(const PlanKey& key);
  absl::Status EpilogueLinear(const uint8_t* a_codes, const float* a_scales, const uint8_t* w_codes,
                              const float* w_scales, int64_t m, int64_t n, int64_t k,
                              __nv_bfloat16* out, const __nv_bfloat16* bias, cudaStream_t stream);

  cublasLtHandle_t handle_;
  void* workspace_;
  int64_t workspace_bytes_;
  float* accumulator_;
  int64_t accumulator_bytes_;
  bool outer_vector_ = false;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_FP8_GEMM_CUDA_H_
