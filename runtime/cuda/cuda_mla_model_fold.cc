// CudaMlaModel's decoder layer with the residual add + RMSNorm folded into its GEMVs
// (CudaModelOptions::mla_fold_norm; kernels/gemm/cuda/gemv_cuda.h), as CudaLlamaModel's
// FoldedLayer: a batch-1 step on one GPU runs per layer q_a_proj (or q_proj) and
// kv_a_proj_with_mqa each with the input RMSNorm of residual_ in its prologue
// (SmallMLinearNormIn) -> the latent attention (cuda_mla_model.cc: Attention) -> o_proj adding
// into residual_ (SmallMLinearAddTo) -> gate_up + SiLU*up with the post-attention norm in its
// prologue -> down_proj adding into residual_; MoE layers: o_proj (adds into residual_) ->
// RMSNorm -> the MoE MLP with its combine adding into residual_ (CudaMoeMlp::Forward's
// add_to_out). The same bits in residual_ and in every product as the unfolded layer (each fused
// kernel is bit-identical to the pair it replaces); 2 kernels fewer a dense layer, 1 a MoE layer.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

#include "common/status_macros.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "runtime/cuda/cuda_mla_model.h"
#include "runtime/cuda/dense_linear.h"

namespace tandem::runtime::cuda {

namespace kc = ::tandem::kernels::cuda;

bool CudaMlaModel::FoldsNorms(int64_t Tn) const {
  if (!options_.mla_fold_norm || Tn != 1 || comm() != nullptr || options_.moe_comm != nullptr ||
      options_.dcp.size > 1 || dcp_exchange_ != nullptr || input_embeds_ != nullptr ||
      fp8_ != nullptr || layers_.empty()) {
    return false;
  }
  if (config_.IsMoe() && (options_.dtype != ActDtype::kBf16 || moe_ == nullptr ||
                          config_.expert_placement != nullptr)) {
    return false;
  }
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  const int64_t Rq = config_.q_lora_rank, Nq = dims_.num_heads * dims_.QkHeadDim();
  const int64_t L = dims_.kv_lora_rank, Dr = dims_.qk_rope_head_dim;
  const Layer& w = layers_[0];  // every layer's attention weights are allocated alike
  const void* x = residual_.data();
  // The products that read residual_ with the input norm: q_a_proj (or q_proj), kv_a_proj_with_mqa.
  const std::pair<const void*, int64_t> firsts[] = {
      {Rq > 0 ? w.q_a_proj.data() : w.q_proj.data(), Rq > 0 ? Rq : Nq},
      {w.kv_a_proj.data(), L + Dr}};
  for (const auto& [proj, rows] : firsts) {
    if (proj == nullptr || !UseGemv(x, proj, Tn, rows, H) ||
        !kc::SmallMLinearNormInSupported(x, w.input_layernorm.data(), proj, Tn, rows, H)) {
      return false;
    }
  }
  if (!UseGemv(attn_.data(), w.o_proj.data(), Tn, H, dims_.num_heads * dims_.v_head_dim)) {
    return false;
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (config_.IsMoeLayer(l)) continue;  // a plain RMSNorm and the MoE MLP
    const Layer& d = layers_[l];          // the dense MLPs' weights are allocated alike
    return kc::SmallMLinearNormInSupported(x, d.post_attention_layernorm.data(),
                                           d.gate_up_proj.data(), Tn, 2 * I, H) &&
           UseGemv(act_.data(), d.down_proj.data(), Tn, H, I);
  }
  return true;
}

template <typename T>
absl::Status CudaMlaModel::FoldedLayer(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                       int64_t l, const kc::MlaPlan& plan, cudaStream_t stream) {
  const int64_t Tn = step.num_tokens, H = config_.hidden_size, I = config_.intermediate_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool pdl = options_.programmatic_launch;
  const Layer& w = layers_[l];
  T* residual = residual_.get<T>();
  RETURN_IF_ERROR(Attention<T>(step, cache, l, plan, /*fold=*/true, stream));
  RETURN_IF_ERROR(kc::SmallMLinearAddTo<T>(attn_.get<T>(), w.o_proj.get<T>(), nullptr, Tn, H,
                                           dims_.num_heads * dims_.v_head_dim, residual, stream,
                                           pdl));
  if (config_.IsMoeLayer(l)) {  // FusedAddRmsNorm's norm of the residual o_proj just updated
    T* hidden = hidden_.get<T>();
    RETURN_IF_ERROR(kc::RmsNorm<T>(residual, w.post_attention_layernorm.get<T>(), Tn, H, eps,
                                   hidden, stream, pdl));
    return moe_->Forward<T>(w.moe, hidden, Tn, l, residual, *gemm_, stream, /*add_to_out=*/true);
  }
  RETURN_IF_ERROR(kc::SmallMLinearNormInSiluMul<T>(residual, w.post_attention_layernorm.get<T>(),
                                                   eps, w.gate_up_proj.get<T>(), nullptr, Tn, I, H,
                                                   act_.get<T>(), stream, pdl));
  return kc::SmallMLinearAddTo<T>(act_.get<T>(), w.down_proj.get<T>(), nullptr, Tn, H, I, residual,
                                  stream, pdl);
}

template absl::Status CudaMlaModel::FoldedLayer<__nv_bfloat16>(const DeviceStep&,
                                                               const kc::DeviceKvCache&, int64_t,
                                                               const kc::MlaPlan&, cudaStream_t);
template absl::Status CudaMlaModel::FoldedLayer<__half>(const DeviceStep&, const kc::DeviceKvCache&,
                                                        int64_t, const kc::MlaPlan&, cudaStream_t);

}  // namespace tandem::runtime::cuda
