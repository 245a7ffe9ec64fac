// The experts' GEMMs on cuBLAS.
//   Run(): prefill-sized batches: every expert's rows of the permuted batch against that
//     expert's weights, as ONE cublasGemmGroupedBatchedEx call (one group per expert with rows;
//     CUDA >= 12.5), or one cublasGemmEx per expert (kPerExpert). cuBLAS takes these problem
//     sizes on the host, so ReadOffsets() copies the expert offsets back and waits for them: the
//     MoE layer's one host sync, never taken under CUDA graph capture.
//   RunPadded(): mid-sized decode batches: every expert against `cap` rows of the padded layout
//     (MoePadRows), one cublasGemmStridedBatchedEx of fixed shapes: no host read, capturable.
//   Dense(): one plain product of any widths (cublasGemmEx).
// The handle has its own workspace, so cuBLAS allocates nothing during graph capture.
//
// Thread safety: not thread-safe (one cuBLAS handle, host pointer tables); one caller.
#ifndef TANDEM_KERNELS_MOE_MOE_GEMM_CUDA_H_
#define TANDEM_KERNELS_MOE_MOE_GEMM_CUDA_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

class MoeGroupedGemm {
 public:
  enum class Mode { kGrouped, kPerExpert };
  enum class Dtype { kBf16, kFp16 };

  // Tables for up to `max_experts` experts.
  static absl::StatusOr<std::unique_ptr<MoeGroupedGemm>> Create(int64_t max_experts);
  ~MoeGroupedGemm();
  MoeGroupedGemm(const MoeGroupedGemm&) = delete;
  MoeGroupedGemm& operator=(const MoeGroupedGemm&) = delete;

  // Copies expert_offsets [num_experts + 1] (device) to the host and waits for `stream`.
  absl::Status ReadOffsets(const int32_t* expert_offsets, int64_t num_experts, cudaStream_t stream);
  // The offsets of the last ReadOffsets.
  const std::vector<int32_t>& offsets() const { return offsets_; }

  // For every expert e with rows [o[e], o[e+1]) (o = offsets()):
  //   out[o[e]:o[e+1], :n] = a[o[e]:o[e+1], :k] . w[e]^T,
  // a [rows, k], w [E, n, k] (nn.Linear per expert), out [rows, n], all of `dtype`, fp32
  // accumulation. `table` (0 or 1) names the device pointer table: two calls in flight
  // (gate_up, then down) use different ones. Enqueued on `stream`.
  absl::Status Run(const void* a, const void* w, int64_t n, int64_t k, void* out, Dtype dtype,
                   int table, Mode mode, cudaStream_t stream);

  // out[e] = a[e] . w[e]^T for every e < num_experts: a [E, cap, k], w [E, n, k], out
  // [E, cap, n]. Rows past an expert's count are computed from whatever a holds and ignored.
  absl::Status RunPadded(const void* a, const void* w, int64_t num_experts, int64_t cap, int64_t n,
                         int64_t k, void* out, Dtype dtype, cudaStream_t stream);

  // out [m, n] = a [m, k] . w [n, k]^T, fp32 accumulation, any m, n, k >= 1.
  absl::Status Dense(const void* a, const void* w, int64_t m, int64_t n, int64_t k, void* out,
                     Dtype dtype, cudaStream_t stream);

 private:
  MoeGroupedGemm() = default;
  absl::Status Bind(cudaStream_t stream);
  static constexpr size_t kWorkspaceBytes = 32 << 20;

  int64_t max_experts_ = 0;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;  // kWorkspaceBytes, set after every cublasSetStream
  std::vector<int32_t> offsets_;
  int32_t* offsets_host_ = nullptr;  // pinned [max_experts + 1]
  // Per table: pinned host and device arrays of 3 * max_experts pointers (A, B, C), and the
  // event of its last upload (the host table is rewritten only after it).
  const void** host_ptrs_[2] = {nullptr, nullptr};
  void** dev_ptrs_[2] = {nullptr, nullptr};
  cudaEvent_t uploaded_[2] = {nullptr, nullptr};
};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MOE_MOE_GEMM_CUDA_H_
