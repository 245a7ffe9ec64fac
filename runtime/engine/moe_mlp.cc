#include "runtime/engine/moe_mlp.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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

absl::Status MoeMlp::Run(const ModelConfig& c, const LayerWeights& w, const float* x, int64_t T,
                         float* out, kernels::ThreadPool* pool) {
  const int64_t H = c.hidden_size, E = c.num_experts;
  if (static_cast<int64_t>(w.router.size()) != E * H ||
      (c.moe_router == ModelConfig::MoeRouter::kDeepseekV3 &&
       static_cast<int64_t>(w.router_bias.size()) != E)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe layer: router weights do not hold ", E, " experts"));
  }
  // The router sees the whole (replicated) hidden state on every rank, so all ranks route alike.
  router_logits_.resize(T * E);
  kernels::cpu::Linear(x, w.router.data(), nullptr, T, E, H, router_logits_.data(), pool);
  RETURN_IF_ERROR(Route(c, w, T));
  const kernels::MoeExpertWeights experts{w.experts_gate_up.data(), w.experts_down.data(), E, H,
                                          c.moe_intermediate_size};
  RETURN_IF_ERROR(kernels::cpu::FusedMoe(x, routing_, experts, out, pool, &scratch_));
  const int64_t I = c.shared_expert_intermediate_size;
  if (I == 0) return absl::OkStatus();
  gate_up_.resize(T * 2 * I);
  act_.resize(T * I);
  shared_.resize(T * H);
  kernels::cpu::Linear(x, w.shared_gate_up.data(), nullptr, T, 2 * I, H, gate_up_.data(), pool);
  kernels::cpu::SiluAndMul(gate_up_.data(), T, I, act_.data());
  kernels::cpu::Linear(act_.data(), w.shared_down.data(), nullptr, T, H, I, shared_.data(), pool);
  if (!w.shared_expert_gate.empty()) {
    // Qwen2-MoE: out += sigmoid(shared_expert_gate . x) * SharedMlp(x).
    kernels::cpu::AddSigmoidGated(x, w.shared_expert_gate.data(), shared_.data(), T, H, out);
  } else {
    for (int64_t i = 0; i < T * H; ++i) out[i] += shared_[i];  // DeepSeek: ungated
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime
