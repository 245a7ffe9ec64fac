// CudaLlamaModel's decoder layer with the residual add + RMSNorm folded into its GEMVs
// (CudaModelOptions::fold_norm; kernels/gemm/cuda/gemv_cuda.h): a batch-1 step on one GPU runs
// per layer qkv (input norm in its prologue) -> RoPE + KV write -> attention -> o_proj (adds
// into residual_) -> gate_up + SiLU*up (post-attention norm in its prologue) -> down_proj (adds
// into residual_), 2 kernels fewer than the unfused layer, the same bits in residual_ and in
// every product. MoE layers (CudaModelOptions::fold_moe): o_proj (adds into residual_) -> RMSNorm
// -> the MoE MLP with its combine adding into residual_, 1 kernel fewer. FP8 weights: the same
// dense layer on the weight-only FP8 GEMVs (FoldedLayerFp8).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/status_macros.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "runtime/cuda/cuda_llama_model.h"

namespace tandem::runtime::cuda {

namespace kc = ::tandem::kernels::cuda;

kernels::cuda::GemvRopeKv CudaLlamaModel::RopeKvArgs(const DeviceStep& step,
                                                     const kernels::cuda::DeviceKvCache& cache,
                                                     int64_t l, void* q_out) const {
  const kernels::KvCacheLayout& kv = cache.layout;
  kernels::cuda::GemvRopeKv rope;
  rope.positions = step.positions;
  rope.slot_mapping = step.slot_mapping;
  rope.inv_freq = inv_freq_.get<float>();
  rope.head_dim = static_cast<int>(config_.head_dim);
  rope.num_q_heads = static_cast<int>(config_.num_attention_heads);
  rope.num_kv_heads = static_cast<int>(config_.num_key_value_heads);
  rope.q_out = q_out;
  rope.pool = cache.data;
  if (cache.dtype == kernels::cuda::KvDtype::kFp8E4m3) {  // per tensor (the runner's kv_scales_)
    rope.k_scale = cache.k_scale;
    rope.v_scale = cache.v_scale;
  }
  rope.num_slots = kv.NumSlots();
  rope.block_size = kv.block_size;
  rope.layer_tile_offset = kv.TileOffset(0, l, 0);
  rope.block_stride = kv.BlockElems();
  rope.kv_stride = kv.TileElems();
  return rope;
}

template <typename T>
absl::Status CudaLlamaModel::FoldedLayer(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                         int64_t l, const StepAttentionPlan& plan,
                                         void* attn_workspace, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (fp8_ != nullptr) return FoldedLayerFp8(step, cache, l, plan, attn_workspace, stream);
  }
  const int64_t Tn = step.num_tokens, H = config_.hidden_size, I = config_.intermediate_size;
  const int64_t q_dim = config_.num_attention_heads * config_.head_dim;
  const int64_t qkv_dim = q_dim + 2 * config_.num_key_value_heads * config_.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool pdl = options_.programmatic_launch;
  const Layer& w = layers_[l];
  T* residual = residual_.get<T>();
  const T* o_in;
  if (FoldsRope(Tn)) {  // RoPE + KV write in the qkv GEMV: q_ and the pool written, not qkv_
    const kc::GemvRopeKv rope = RopeKvArgs(step, cache, l, q_.get<T>());
    RETURN_IF_ERROR(kc::SmallMLinearNormInRopeKv<T>(residual, w.input_layernorm.get<T>(), eps,
                                                    w.qkv_proj.get<T>(), w.qkv_bias.get<T>(), Tn, H,
                                                    rope, stream, pdl));
    ASSIGN_OR_RETURN(o_in, Attention<T>(step, cache, l, plan, attn_workspace, stream));
  } else {
    RETURN_IF_ERROR(kc::SmallMLinearNormIn<T>(residual, w.input_layernorm.get<T>(), eps,
                                              w.qkv_proj.get<T>(), w.qkv_bias.get<T>(), Tn, qkv_dim,
                                              H, qkv_.get<T>(), stream, pdl));
    ASSIGN_OR_RETURN(o_in, AttendFromQkv<T>(step, cache, l, plan, attn_workspace, stream));
  }
  RETURN_IF_ERROR(kc::SmallMLinearAddTo<T>(o_in, w.o_proj.get<T>(), w.o_bias.get<T>(), Tn, H, q_dim,
                                           residual, stream, pdl));
  if (config_.IsMoeLayer(l)) {  // FoldsNorms: options.fold_moe, bf16, one GPU
    // FusedAddRmsNorm's norm of the residual o_proj just updated, then the MoE MLP adding its
    // output into residual_ as the next FusedAddRmsNorm would (MoeCombineAddTo).
    T* hidden = hidden_.get<T>();
    RETURN_IF_ERROR(kc::RmsNorm<T>(residual, w.post_attention_layernorm.get<T>(), Tn, H, eps,
                                   hidden, stream, pdl));
    return moe_->Forward<T>(w.moe, hidden, Tn, l, residual, *gemm_, stream, /*add_to_out=*/true);
  }
  RETURN_IF_ERROR(kc::SmallMLinearNormInSiluMul<T>(
      residual, w.post_attention_layernorm.get<T>(), eps, w.gate_up_proj.get<T>(),
      w.gate_up_bias.get<T>(), Tn, I, H, act_.get<T>(), stream, pdl));
  return kc::SmallMLinearAddTo<T>(act_.get<T>(), w.down_proj.get<T>(), w.down_bias.get<T>(), Tn, H,
                                  I, residual, stream, pdl);
}

template absl::Status CudaLlamaModel::FoldedLayer<__nv_bfloat16>(const DeviceStep&,
                                                                 const kc::DeviceKvCache&, int64_t,
                                                                 const StepAttentionPlan&, void*,
                                                                 cudaStream_t);
template absl::Status CudaLlamaModel::FoldedLayer<__half>(const DeviceStep&,
                                                          const kc::DeviceKvCache&, int64_t,
                                                          const StepAttentionPlan&, void*,
                                                          cudaStream_t);

}  // namespace tandem::runtime::cuda
