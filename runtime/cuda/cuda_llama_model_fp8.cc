// CudaLlamaModel's FP8 projections (issue 38; cuda_fp8_linear.h): upload from the loader's
// *_fp8 slots, allocation for device dummy weights, the slot a dummy fill lands in, and the
// producers of per-token FP8 inputs with the quantization fused in
// (kernels/fp8/fp8_fused_quant_cuda.h).
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8_fused_quant_cuda.h"
#include "runtime/cuda/cuda_llama_model.h"

namespace tandem::runtime::cuda {

absl::Status CudaLlamaModel::UploadFp8(LayerWeights* src, Layer* dst) {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, D = config_.head_dim;
  const int64_t qkv_dim = (config_.num_attention_heads + 2 * config_.num_key_value_heads) * D;
  const int64_t o_dim = config_.num_attention_heads / options_.dcp.size * D;
  const int64_t T = options_.max_tokens;
  ASSIGN_OR_RETURN(dst->qkv_fp8, UploadFp8Weight(&src->qkv_fp8, qkv_dim, H, T, "qkv_proj"));
  ASSIGN_OR_RETURN(dst->o_fp8, UploadFp8Weight(&src->o_fp8, H, o_dim, T, "o_proj"));
  if (!src->gate_up_fp8.empty() || !src->down_fp8.empty()) {
    ASSIGN_OR_RETURN(dst->gate_up_fp8,
                     UploadFp8Weight(&src->gate_up_fp8, 2 * I, H, T, "gate_up_proj"));
    ASSIGN_OR_RETURN(dst->down_fp8, UploadFp8Weight(&src->down_fp8, H, I, T, "down_proj"));
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::AllocateFp8(Layer* l) {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, D = config_.head_dim;
  const int64_t qkv_dim = (config_.num_attention_heads + 2 * config_.num_key_value_heads) * D;
  const int64_t o_dim = config_.num_attention_heads / options_.dcp.size * D;
  const WeightQuantization& q = config_.quantization;
  const auto grid = [&](int64_t n, int64_t k) { return Fp8QuantizedGrid(q, n, k); };
  const int64_t T = options_.max_tokens;
  ASSIGN_OR_RETURN(l->qkv_fp8, AllocateFp8Weight(grid(qkv_dim, H), q.activation, 0.0f, T));
  ASSIGN_OR_RETURN(l->o_fp8, AllocateFp8Weight(grid(H, o_dim), q.activation, 0.0f, T));
  if (!config_.IsMoeLayer(l - layers_.data())) {  // a MoE layer's experts: AllocateMoeWeights
    ASSIGN_OR_RETURN(l->gate_up_fp8, AllocateFp8Weight(grid(2 * I, H), q.activation, 0.0f, T));
    ASSIGN_OR_RETURN(l->down_fp8, AllocateFp8Weight(grid(H, I), q.activation, 0.0f, T));
  }
  weight_bytes_ +=
      l->qkv_fp8.bytes() + l->o_fp8.bytes() + l->gate_up_fp8.bytes() + l->down_fp8.bytes();
  return absl::OkStatus();
}

CudaFp8Weight* CudaLlamaModel::Fp8Slot(WeightSlot slot, int64_t layer) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) return nullptr;
  Layer& l = layers_[static_cast<size_t>(layer)];
  CudaFp8Weight* w = slot == WeightSlot::kQkvProj      ? &l.qkv_fp8
                     : slot == WeightSlot::kOProj      ? &l.o_fp8
                     : slot == WeightSlot::kGateUpProj ? &l.gate_up_fp8
                     : slot == WeightSlot::kDownProj   ? &l.down_fp8
                                                       : nullptr;
  return w != nullptr && !w->empty() ? w : nullptr;
}

bool CudaLlamaModel::FusesFp8Quant(const CudaFp8Weight& fp8, int64_t Tn, int64_t width,
                                   bool reduce) const {
  return !reduce && fp8_ != nullptr && options_.dtype == ActDtype::kBf16 &&
         fp8_->TakesTokenCodes(fp8, Tn) && kernels::cuda::Fp8FusedQuantSupported(width);
}

absl::Status CudaLlamaModel::AddNormQuantFp8(bool add, const DeviceBuffer& weight, int64_t Tn,
                                             float eps, cudaStream_t stream) {
  using bf16 = __nv_bfloat16;
  bf16* hidden = hidden_.get<bf16>();
  bf16* residual = residual_.get<bf16>();
  // As ReduceAddNorm: with the add, residual += hidden and hidden = norm in place; without,
  // hidden = norm(residual).
  return kernels::cuda::RmsNormQuantFp8(add ? hidden : residual, add ? residual : nullptr,
                                        weight.get<bf16>(), Tn, config_.hidden_size, eps, hidden,
                                        fp8_->token_codes(), stream, options_.programmatic_launch);
}

absl::Status CudaLlamaModel::SiluAndMulQuantFp8(int64_t Tn, cudaStream_t stream) {
  return kernels::cuda::SiluAndMulQuantFp8(gate_up_.get<__nv_bfloat16>(), Tn,
                                           config_.intermediate_size, nullptr, fp8_->token_codes(),
                                           stream, options_.programmatic_launch);
}

}  // namespace tandem::runtime::cuda
