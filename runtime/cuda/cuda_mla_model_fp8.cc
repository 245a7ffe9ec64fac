// CudaMlaModel's FP8 projections (issue 38; cuda_fp8_linear.h): a DeepSeek-V3 FP8 checkpoint's
// q_a_proj, q_b_proj (q_proj), kv_a_proj_with_mqa, o_proj and the dense layers' gate_up / down
// stay e4m3 with their 128 x 128 block scales (per-row 128-column groups as the loader holds
// them) and run through CudaFp8Linear with 1 x 128 activation quantization, as on the CPU
// backend (runtime/cpu/mla_model.cc). kv_b_proj is dequantized at load for the absorbed
// attention (runtime/model/weight_fp8.cc, as vLLM does); the experts are CudaMoeMlp's
// (cuda_moe_fp8.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/cuda/cuda_mla_model.h"
#include "runtime/cuda/cuda_moe_fp8.h"

namespace tandem::runtime::cuda {

absl::Status CudaMlaModel::UploadFp8(LayerWeights* src, Layer* dst) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, Rq = c.q_lora_rank;
  const int64_t Hq = dims_.num_heads, L = dims_.kv_lora_rank, Dr = dims_.qk_rope_head_dim;
  const int64_t T = options_.max_tokens, q_in = Rq > 0 ? Rq : H;
  auto up = [&](Fp8LinearWeight* w, int64_t rows, int64_t cols, const char* what,
                CudaFp8Weight* out) -> absl::Status {
    if (w->empty()) return absl::OkStatus();  // 16-bit in this checkpoint
    ASSIGN_OR_RETURN(*out, UploadFp8Weight(w, rows, cols, T, what));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(up(&src->q_a_fp8, Rq, H, "q_a_proj", &dst->q_a_fp8));
  RETURN_IF_ERROR(up(&src->q_fp8, Hq * dims_.QkHeadDim(), q_in, "q_proj", &dst->q_fp8));
  if (!src->kv_a_fp8.empty()) {  // its c_kv rows and its k_pe rows, two products
    if (src->kv_a_fp8.grid.rows != L + Dr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FP8 kv_a_proj_with_mqa has ", src->kv_a_fp8.grid.rows, " rows, expected ", L + Dr));
    }
    Fp8LinearWeight ckv = Fp8Rows(src->kv_a_fp8, 0, L), kpe = Fp8Rows(src->kv_a_fp8, L, Dr);
    src->kv_a_fp8 = Fp8LinearWeight();
    RETURN_IF_ERROR(up(&ckv, L, H, "kv_a_proj_with_mqa (c_kv rows)", &dst->kv_a_c_fp8));
    RETURN_IF_ERROR(up(&kpe, Dr, H, "kv_a_proj_with_mqa (k_pe rows)", &dst->kv_a_pe_fp8));
  }
  RETURN_IF_ERROR(
      up(&src->o_fp8, H, Hq / options_.dcp.size * dims_.v_head_dim, "o_proj", &dst->o_fp8));
  RETURN_IF_ERROR(up(&src->gate_up_fp8, 2 * I, H, "gate_up_proj", &dst->gate_up_fp8));
  RETURN_IF_ERROR(up(&src->down_fp8, H, I, "down_proj", &dst->down_fp8));
  for (const CudaFp8Weight* w : {&dst->q_a_fp8, &dst->q_fp8, &dst->kv_a_c_fp8, &dst->kv_a_pe_fp8,
                                 &dst->o_fp8, &dst->gate_up_fp8, &dst->down_fp8}) {
    weight_bytes_ += w->bytes();
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaMlaModel::Project(const CudaFp8Weight& fp8, const T* w, const T* a, int64_t m,
                                   int64_t n, int64_t k, T* out, cudaStream_t stream) {
  if (fp8.empty()) return gemm_->Linear<T, T>(a, w, nullptr, m, n, k, out, stream);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (fp8_ != nullptr) return fp8_->Linear(a, fp8, nullptr, m, out, stream);
  }
  return absl::FailedPreconditionError("FP8 projections run with bf16 activations only");
}

template absl::Status CudaMlaModel::Project<__nv_bfloat16>(const CudaFp8Weight&,
                                                           const __nv_bfloat16*,
                                                           const __nv_bfloat16*, int64_t, int64_t,
                                                           int64_t, __nv_bfloat16*, cudaStream_t);
template absl::Status CudaMlaModel::Project<__half>(const CudaFp8Weight&, const __half*,
                                                    const __half*, int64_t, int64_t, int64_t,
                                                    __half*, cudaStream_t);

}  // namespace tandem::runtime::cuda
