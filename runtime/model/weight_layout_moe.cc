// The checkpoint tensors of the model families beyond dense Llama (weight_layout.h): Qwen3's
// per-head q/k norms and the mixture-of-experts layers of Mixtral, Qwen2-MoE and Qwen3-MoE in
// the hub's per-expert layout. Tensor parallelism splits every expert like a dense MLP: rank r
// keeps rows [r*Ie/N, (r+1)*Ie/N) of each expert's gate/up and those columns of its down
// projection (tensor_parallel.h); the router and the shared expert's gate are replicated. Under
// expert parallelism a rank keeps its own experts whole, stacked in placement order, and checks
// but does not store the others.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/model/weight_layout.h"

namespace tandem::runtime::internal {
namespace {

HfTensor Tensor(std::string name, std::vector<int64_t> shape, WeightSlot slot, int64_t layer,
                int64_t offset, int slice_dim = -1, int64_t begin = 0, int64_t count = 0) {
  HfTensor t{std::move(name), std::move(shape), slot, layer, offset};
  t.slice_dim = slice_dim;
  t.slice_begin = begin;
  t.slice_count = count;
  return t;
}

}  // namespace

void AppendFamilyLayerTensors(const ModelConfig& c, const TpDims& d, int64_t i,
                              std::vector<HfTensor>* out) {
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const int64_t h = c.hidden_size;
  if (c.qk_norm) {
    for (auto [name, slot] : {std::pair<const char*, WeightSlot>{"q_norm", WeightSlot::kQNorm},
                              {"k_norm", WeightSlot::kKNorm}}) {
      out->push_back(
          Tensor(absl::StrCat(p, "self_attn.", name, ".weight"), {c.head_dim}, slot, i, 0));
      out->back().is_norm = true;
    }
  }
  if (!c.IsMoeLayer(i)) return;
  const bool mixtral = c.MixtralExpertNames();
  const std::string m = p + (mixtral ? "block_sparse_moe." : "mlp.");
  const int64_t e_count = c.num_experts, ie = c.moe_intermediate_size;
  const int64_t li = d.moe_intermediate, i0 = d.moe_intermediate_begin;
  out->push_back(Tensor(m + "gate.weight", {e_count, h}, WeightSlot::kRouter, i, 0));
  if (c.moe_router == ModelConfig::MoeRouter::kDeepseekV3) {
    out->push_back(
        Tensor(m + "gate.e_score_correction_bias", {e_count}, WeightSlot::kRouterBias, i, 0));
  }
  // Expert parallelism: the rank's experts whole at their slot, the others not kept.
  const std::vector<int32_t> slots = d.expert_placement != nullptr
                                         ? d.expert_placement->LocalSlots(d.shard.rank)
                                         : std::vector<int32_t>();
  for (int64_t e = 0; e < e_count; ++e) {
    const std::string x = absl::StrCat(m, "experts.", e, ".");
    const int64_t slot = slots.empty() ? e : std::max(slots[e], 0);
    const int rows = slots.empty() ? 0 : -1, cols = slots.empty() ? 1 : -1;  // -1: whole
    const size_t first = out->size();
    const int64_t gate_up = slot * 2 * li * h;
    out->push_back(Tensor(x + (mixtral ? "w1" : "gate_proj") + ".weight", {ie, h},
                          WeightSlot::kExpertsGateUp, i, gate_up, rows, i0, li));
    out->push_back(Tensor(x + (mixtral ? "w3" : "up_proj") + ".weight", {ie, h},
                          WeightSlot::kExpertsGateUp, i, gate_up + li * h, rows, i0, li));
    out->push_back(Tensor(x + (mixtral ? "w2" : "down_proj") + ".weight", {h, ie},
                          WeightSlot::kExpertsDown, i, slot * h * li, cols, i0, li));
    if (!slots.empty() && slots[e] < 0) {
      for (size_t k = first; k < out->size(); ++k) (*out)[k].keep = false;
    }
  }
  if (c.shared_expert_intermediate_size > 0) {
    const int64_t is = c.shared_expert_intermediate_size;
    const int64_t ls = d.shared_intermediate, s0 = d.shared_intermediate_begin;
    const std::string s = p + (c.DeepseekMoe() ? "mlp.shared_experts." : "mlp.shared_expert.");
    out->push_back(
        Tensor(s + "gate_proj.weight", {is, h}, WeightSlot::kSharedGateUp, i, 0, 0, s0, ls));
    out->push_back(
        Tensor(s + "up_proj.weight", {is, h}, WeightSlot::kSharedGateUp, i, ls * h, 0, s0, ls));
    out->push_back(
        Tensor(s + "down_proj.weight", {h, is}, WeightSlot::kSharedDown, i, 0, 1, s0, ls));
    if (!c.DeepseekMoe()) {  // Qwen2-MoE's sigmoid gate; DeepSeek's shared experts have none
      out->push_back(
          Tensor(p + "mlp.shared_expert_gate.weight", {1, h}, WeightSlot::kSharedExpertGate, i, 0));
    }
  }
}

void AllocateFamilyWeights(const ModelConfig& c, const TpDims& d, ModelWeights* w) {
  const auto h = static_cast<size_t>(c.hidden_size);
  for (size_t i = 0; i < w->layers.size(); ++i) {
    LayerWeights& layer = w->layers[i];
    if (c.qk_norm) {
      layer.q_norm.assign(static_cast<size_t>(c.head_dim), 0.0f);
      layer.k_norm.assign(static_cast<size_t>(c.head_dim), 0.0f);
    }
    if (!c.IsMoeLayer(static_cast<int64_t>(i))) continue;
    const auto experts = static_cast<size_t>(
        d.expert_placement != nullptr ? d.expert_placement->experts_of(d.shard.rank).size()
                                      : c.num_experts);
    const auto li = static_cast<size_t>(d.moe_intermediate);
    const auto ls = static_cast<size_t>(d.shared_intermediate);
    layer.gate_up_proj.clear();
    layer.gate_up_bias.clear();
    layer.down_proj.clear();
    layer.down_bias.clear();
    layer.router.assign(static_cast<size_t>(c.num_experts) * h, 0.0f);  // replicated
    // FP8 checkpoints: the experts' e4m3 codes land in the *_fp8 slots (weight_fp8.cc).
    const size_t f = c.quantization.FromCheckpoint() ? 0 : 1;
    layer.experts_gate_up.assign(f * experts * 2 * li * h, 0.0f);
    layer.experts_down.assign(f * experts * h * li, 0.0f);
    if (c.shared_expert_intermediate_size > 0) {
      layer.shared_gate_up.assign(f * 2 * ls * h, 0.0f);
      layer.shared_down.assign(f * h * ls, 0.0f);
      if (!c.DeepseekMoe()) layer.shared_expert_gate.assign(h, 0.0f);
    }
    if (c.moe_router == ModelConfig::MoeRouter::kDeepseekV3)
      layer.router_bias.assign(static_cast<size_t>(c.num_experts), 0.0f);
  }
}

std::vector<float>* FamilySlotVector(LayerWeights* layer, WeightSlot slot) {
  switch (slot) {
    case WeightSlot::kQNorm:
      return &layer->q_norm;
    case WeightSlot::kKNorm:
      return &layer->k_norm;
    case WeightSlot::kRouter:
      return &layer->router;
    case WeightSlot::kExpertsGateUp:
      return &layer->experts_gate_up;
    case WeightSlot::kExpertsDown:
      return &layer->experts_down;
    case WeightSlot::kSharedGateUp:
      return &layer->shared_gate_up;
    case WeightSlot::kSharedDown:
      return &layer->shared_down;
    case WeightSlot::kSharedExpertGate:
      return &layer->shared_expert_gate;
    case WeightSlot::kRouterBias:
      return &layer->router_bias;
    default:
      return nullptr;  // the dense slots live in weight_layout.cc's SlotVector
  }
}

}  // namespace tandem::runtime::internal
