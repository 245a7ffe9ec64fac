#include "runtime/cpu/moe_mlp.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/gemm/linear.h"
#include "kernels/layers/activation.h"

namespace tandem::runtime {

absl::Status MoeMlp::Route(const ModelConfig& c, const LayerWeights& w, int64_t T) {
  using Router = ModelConfig::MoeRouter;
  if (c.moe_router == Router::kSoftmaxTopK) {
    return kernels::cpu::SoftmaxTopK(router_logits_.data(), T,
                                     {c.num_experts, c.num_experts_per_tok, c.norm_topk_prob},
                                     &routing_);
  }
  const bool v3 = c.moe_router == Router::kDeepseekV3;
  kernels::GroupedRoutingParams p;
  p.num_experts = c.num_experts;
  p.top_k = c.num_experts_per_tok;
  p.scoring = v3 ? kernels::MoeScoring::kSigmoid : kernels::MoeScoring::kSoftmax;
  p.num_groups = c.num_expert_groups;
  p.topk_groups = c.topk_expert_groups;
  p.group_score = v3 ? kernels::MoeGroupScore::kTopTwoSum : kernels::MoeGroupScore::kMax;
  p.correction_bias = v3 ? w.router_bias.data() : nullptr;
  p.renormalize = c.norm_topk_prob;
  p.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  return kernels::cpu::GroupedTopK(router_logits_.data(), T, p, &routing_);
}

absl::Status MoeMlp::RunOwnedExperts(const ModelConfig& c, const kernels::MoeExpertWeights& experts,
                                     const float* x, int64_t T, float* out,
                                     kernels::ThreadPool* pool) {
  const int64_t H = c.hidden_size, k = routing_.top_k;
  if (static_cast<int64_t>(local_slots_.size()) != c.num_experts) {
    local_slots_ = c.expert_placement->LocalSlots(c.expert_rank);
  }
  // Prepare: the (token, expert) rows whose expert this rank holds, in token order.
  owned_token_.clear();
  owned_.expert_ids.clear();
  owned_.weights.clear();
  for (int64_t r = 0; r < T * k; ++r) {
    const int32_t slot = local_slots_[routing_.expert_ids[r]];
    if (slot < 0) continue;  // another rank's expert
    owned_token_.push_back(static_cast<int32_t>(r / k));
    owned_.expert_ids.push_back(slot);
    owned_.weights.push_back(routing_.weights[r]);
  }
  std::fill_n(out, T * H, 0.0f);
  const auto rows = static_cast<int64_t>(owned_token_.size());
  if (rows == 0) return absl::OkStatus();  // no token for this rank's experts: a zero part
  owned_.num_tokens = rows;
  owned_.top_k = 1;
  owned_x_.resize(rows * H);
  owned_out_.resize(rows * H);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(x + owned_token_[r] * H, H, &owned_x_[r * H]);
  // Experts: the same kernel as without EP, on the owned rows; finalize: add into the tokens.
  RETURN_IF_ERROR(
      kernels::cpu::FusedMoe(owned_x_.data(), owned_, experts, owned_out_.data(), pool, &scratch_));
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + owned_token_[r] * H;
    const float* src = &owned_out_[r * H];
    for (int64_t h = 0; h < H; ++h) dst[h] += src[h];
  }
  return absl::OkStatus();
}

absl::Status MoeMlp::Run(const ModelConfig& c, const LayerWeights& w, const float* x, int64_t T,
                         float* out, kernels::ThreadPool* pool) {
  const int64_t H = c.hidden_size, E = c.num_experts;
  if (static_cast<int64_t>(w.router.size()) != E * H ||
      (c.moe_router == ModelConfig::MoeRouter::kDeepseekV3 &&
       static_cast<int64_t>(w.router_bias.size()) != E)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe layer: router weights do not hold ", E, " experts"));
  }
  // The router sees the whole (replicated) hidden state on every rank, so all ranks route alike
  // (under data-parallel attention each rank routes its own tokens, maybe none).
  router_logits_.resize(T * E);
  routing_.num_tokens = 0;
  routing_.top_k = c.num_experts_per_tok;
  routing_.expert_ids.clear();
  routing_.weights.clear();
  if (T > 0) {
    kernels::cpu::Linear(x, w.router.data(), nullptr, T, E, H, router_logits_.data(), pool);
    RETURN_IF_ERROR(Route(c, w, T));
  }
  expert_tokens_.resize(E, 0);
  for (int32_t e : routing_.expert_ids) ++expert_tokens_[e];
  kernels::MoeExpertWeights experts{w.experts_gate_up.data(), w.experts_down.data(),
                                    c.NumHeldExperts(), H, c.moe_intermediate_size};
  if (!w.experts_gate_up_fp8.empty()) {  // FP8 checkpoints: e4m3 experts (weight_fp8.cc)
    experts.gate_up_fp8 = w.experts_gate_up_fp8.View();
    experts.down_fp8 = w.experts_down_fp8.View();
  }
  if (all_to_all_ != nullptr) {
    if (c.expert_placement == nullptr) {
      return absl::InternalError("moe layer: the all-to-all needs the expert placement");
    }
    RETURN_IF_ERROR(all_to_all_->Run(routing_, *c.expert_placement, experts, x, H, out, pool));
  } else if (c.expert_placement != nullptr) {
    RETURN_IF_ERROR(RunOwnedExperts(c, experts, x, T, out, pool));
  } else {
    RETURN_IF_ERROR(kernels::cpu::FusedMoe(x, routing_, experts, out, pool, &scratch_));
  }
  const int64_t I = c.shared_expert_intermediate_size;
  if (I == 0 || T == 0) return absl::OkStatus();
  gate_up_.resize(T * 2 * I);
  act_.resize(T * I);
  shared_.resize(T * H);
  if (w.shared_gate_up_fp8.empty()) {
    kernels::cpu::Linear(x, w.shared_gate_up.data(), nullptr, T, 2 * I, H, gate_up_.data(), pool);
  } else {
    RETURN_IF_ERROR(
        kernels::cpu::Fp8Linear(x, w.shared_gate_up_fp8.View(), nullptr, T, gate_up_.data(), pool));
  }
  kernels::cpu::SiluAndMul(gate_up_.data(), T, I, act_.data());
  if (w.shared_down_fp8.empty()) {
    kernels::cpu::Linear(act_.data(), w.shared_down.data(), nullptr, T, H, I, shared_.data(), pool);
  } else {
    RETURN_IF_ERROR(kernels::cpu::Fp8Linear(act_.data(), w.shared_down_fp8.View(), nullptr, T,
                                            shared_.data(), pool));
  }
  if (!w.shared_expert_gate.empty()) {
    // Qwen2-MoE: out += sigmoid(shared_expert_gate . x) * SharedMlp(x).
    kernels::cpu::AddSigmoidGated(x, w.shared_expert_gate.data(), shared_.data(), T, H, out);
  } else {
    for (int64_t i = 0; i < T * H; ++i) out[i] += shared_[i];  // DeepSeek: ungated
  }
  return absl::OkStatus();
}

absl::Status MoeMlp::RunIdle(const ModelConfig& c, const ModelWeights& weights,
                             kernels::ThreadPool* pool) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.IsMoeLayer(l)) RETURN_IF_ERROR(Run(c, weights.layers[l], nullptr, 0, nullptr, pool));
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime
