// CUDA twin of kernels/gemm/linear.h: dense nn.Linear on the device through cuBLASLt, bf16/fp16
// inputs with fp32 accumulation and a bf16/fp16 or fp32 (logits) output.
//
// Thread safety: a CublasLtGemm is NOT thread-safe (Linear updates the plan cache and the
// matmul descriptor's bias pointer); use one per thread or stream, or lock around it. Calls on
// different streams through one instance must not overlap in time, since they share the
// device workspace.
//
// CUDA graphs: Linear allocates nothing on the device, never synchronizes and only enqueues
// work on `stream`, so it may be called inside stream capture. Its first call for a new shape
// only adds a host-side plan (cuBLASLt heuristic query; no device work), so even that call is
// capturable, but warm every shape up once before capture anyway, so capture pays no host
// latency.
#ifndef TANDEM_KERNELS_GEMM_CUDA_GEMM_CUDA_H_
#define TANDEM_KERNELS_GEMM_CUDA_GEMM_CUDA_H_

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

class CublasLtGemm {
 public:
  static constexpr int64_t kDefaultWorkspaceBytes = int64_t{32} << 20;

  // Creates the cuBLASLt handle and a device workspace of workspace_bytes (>= 0; larger lets
  // cuBLASLt pick split-K and stream-K kernels) on the current device; Linear must run on that
  // device. RESOURCE_EXHAUSTED when the workspace does not fit.
  static absl::StatusOr<std::unique_ptr<CublasLtGemm>> Create(
      int64_t workspace_bytes = kDefaultWorkspaceBytes);

  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;
  ~CublasLtGemm();

  // out[m, n] = sum_k a[m, k] * w[n, k] (+ bias[n] when bias != nullptr), fp32 accumulation,
  // rounded once to TOut. Row-major; a: [m, k]; w: [n, k] (nn.Linear weight layout
  // [out_features, in_features]); bias: [n] or null; out: [m, n], not overlapping the inputs.
  // T is __nv_bfloat16 or __half; TOut is T or float (fp32 logits). All pointers are device
  // pointers. Asynchronous on `stream`.
  //
  // Bias: for TOut = T it is added in cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS, fp32, before
  // the one rounding; where cuBLASLt has no such kernel for the shape, AddBias runs after the
  // product, one more rounding). For TOut = float, cuBLASLt 13 rejects a bf16/fp16 bias with
  // fp32 D (INVALID_VALUE, seen on H200), so the T bias is added by a separate AddBias kernel in
  // fp32 after the product (one more fp32 rounding).
  //
  // Cost: the first call per (m, n, k, T, TOut, bias on/off, pointer alignments) queries
  // cuBLASLt's heuristic on the host and caches the algorithm; later calls only launch.
  //
  // m == 0 or n == 0: OK, nothing launched. INVALID_ARGUMENT (nothing launched) for negative
  // sizes, k < 1 (unlike cpu::Linear, which fills bias for k == 0) or null a / w / out.
  // UNIMPLEMENTED when cuBLASLt offers no algorithm for the shape, types and pointer alignments (k
  // or n not a multiple of 8 makes rows that are not 16-byte multiples, which may hit that); other
  // cuBLAS errors convert per common/cublas_status.h.
  template <typename T, typename TOut>
  absl::Status Linear(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                      TOut* out, cudaStream_t stream);

  // Plans for m <= max_m (decode-sized products, where cuBLASLt's first heuristic choice can
  // leave 30-40% of the weight-read bandwidth unused) are chosen by timing up to 8 heuristic
  // candidates on the plan's first call, when that call is not being captured into a CUDA graph
  // (a captured first call keeps the heuristic's choice). The timing runs the product on
  // `stream` with the caller's buffers (out is overwritten anyway) and synchronizes it once.
  // 0 (default): never time.
  void set_autotune_max_m(int64_t max_m) { autotune_max_m_ = max_m; }

  // Number of cached plans (distinct shapes/types/alignments seen so far).
  size_t num_cached_plans() const { return plans_.size(); }
  int64_t workspace_bytes() const { return workspace_bytes_; }

 private:
  struct PlanKey {
    int64_t m, n, k;
    int32_t in_type, out_type;  // cudaDataType_t
    bool bias;
    // Largest power of two (<= 256) dividing each pointer: cuBLASLt algorithms need a minimum
    // alignment, so a plan chosen for 256-byte aligned buffers is not reused for a view at an
    // odd offset.
    uint16_t align_a, align_w, align_out, align_bias;
    bool operator==(const PlanKey&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const PlanKey& key) {
      return H::combine(std::move(h), key.m, key.n, key.k, key.in_type, key.out_type, key.bias,
                        key.align_a, key.align_w, key.align_out, key.align_bias);
    }
  };
  struct Plan;

  CublasLtGemm(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes);
  absl::StatusOr<Plan*> GetPlan(const PlanKey& key, const void* bias);
  // Times plan's candidates on `stream` and keeps the fastest (see set_autotune_max_m).
  absl::Status Tune(Plan* plan, const void* a, const void* w, void* out, cudaStream_t stream);

  cublasLtHandle_t handle_;
  void* workspace_;
  int64_t workspace_bytes_;
  int64_t autotune_max_m_ = 0;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans_;
};

#define TANDEM_GEMM_CUDA_EXTERN(T, TOut)                      \
  extern template absl::Status CublasLtGemm::Linear<T, TOut>( \
      const T*, const T*, const T*, int64_t, int64_t, int64_t, TOut*, cudaStream_t);
TANDEM_GEMM_CUDA_EXTERN(__nv_bfloat16, __nv_bfloat16)
TANDEM_GEMM_CUDA_EXTERN(__nv_bfloat16, float)
TANDEM_GEMM_CUDA_EXTERN(__half, __half)
TANDEM_GEMM_CUDA_EXTERN(__half, float)
#undef TANDEM_GEMM_CUDA_EXTERN

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_GEMM_CUDA_GEMM_CUDA_H_
