#include "runtime/model/weight_layout_mla.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::runtime::internal {

std::vector<HfTensor> MlaTensorLayout(const ModelConfig& c, const TpDims& d) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, inter = c.intermediate_size;
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim, lat = c.kv_lora_rank;
  const int64_t kvb = c.qk_nope_head_dim + c.v_head_dim;
  // Tensor parallelism splits the heads (q rows, kv_b_proj rows, o_proj columns), the dense MLP
  // and the vocabulary as for Llama; q_a / kv_a (the latent) are replicated.
  const int64_t h0 = d.q_head_begin, lh = d.q_heads, o0 = d.o_head_begin, lo = d.o_heads;
  const int64_t i0 = d.intermediate_begin, li = d.intermediate;
  const int64_t vocab_count =
      std::max<int64_t>(0, std::min(d.vocab_rows, c.vocab_size - d.vocab_begin));
  std::vector<HfTensor> out;
  auto add = [&out](std::string name, std::vector<int64_t> shape, WeightSlot slot, int64_t layer,
                    int64_t offset = 0, bool is_norm = false, int slice_dim = -1, int64_t begin = 0,
                    int64_t count = 0) {
    HfTensor t{std::move(name), std::move(shape), slot, layer, offset, is_norm};
    // A slice covering the whole tensor is the whole tensor (TP=1 loads take the fast path).
    const bool whole = slice_dim < 0 || (begin == 0 && count == t.shape[slice_dim]);
    t.slice_dim = whole ? -1 : slice_dim;
    t.slice_begin = begin;
    t.slice_count = count;
    out.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", {c.vocab_size, h}, WeightSlot::kEmbedTokens, -1, 0, false, 0,
      d.vocab_begin, vocab_count);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const std::string a = p + "self_attn.";
    add(p + "input_layernorm.weight", {h}, WeightSlot::kInputLayernorm, i, 0, true);
    if (c.q_lora_rank > 0) {
      add(a + "q_a_proj.weight", {c.q_lora_rank, h}, WeightSlot::kMlaQAProj, i);
      add(a + "q_a_layernorm.weight", {c.q_lora_rank}, WeightSlot::kMlaQALayernorm, i, 0, true);
      add(a + "q_b_proj.weight", {heads * qk, c.q_lora_rank}, WeightSlot::kMlaQProj, i, 0, false, 0,
          h0 * qk, lh * qk);
    } else {
      add(a + "q_proj.weight", {heads * qk, h}, WeightSlot::kMlaQProj, i, 0, false, 0, h0 * qk,
          lh * qk);
    }
    add(a + "kv_a_proj_with_mqa.weight", {lat + c.qk_rope_head_dim, h}, WeightSlot::kMlaKvAProj, i);
    add(a + "kv_a_layernorm.weight", {lat}, WeightSlot::kMlaKvALayernorm, i, 0, true);
    add(a + "kv_b_proj.weight", {heads * kvb, lat}, WeightSlot::kMlaKvBProj, i, 0, false, 0,
        h0 * kvb, lh * kvb);
    add(a + "o_proj.weight", {h, heads * c.v_head_dim}, WeightSlot::kOProj, i, 0, false, 1,
        o0 * c.v_head_dim, lo * c.v_head_dim);
    add(p + "post_attention_layernorm.weight", {h}, WeightSlot::kPostAttentionLayernorm, i, 0,
        true);
    AppendFamilyLayerTensors(c, d, i, &out);  // DeepSeek MoE layers: weight_layout_moe.cc
    if (c.IsMoeLayer(i)) continue;
    add(p + "mlp.gate_proj.weight", {inter, h}, WeightSlot::kGateUpProj, i, 0, false, 0, i0, li);
    add(p + "mlp.up_proj.weight", {inter, h}, WeightSlot::kGateUpProj, i, li * h, false, 0, i0, li);
    add(p + "mlp.down_proj.weight", {h, inter}, WeightSlot::kDownProj, i, 0, false, 1, i0, li);
  }
  add("model.norm.weight", {h}, WeightSlot::kNorm, -1, 0, true);
  if (!c.tie_word_embeddings) {
    add("lm_head.weight", {c.vocab_size, h}, WeightSlot::kLmHead, -1, 0, false, 0, d.vocab_begin,
        vocab_count);
  }
  return out;
}

void AllocateMlaWeights(const ModelConfig& c, const TpDims& d, ModelWeights* w) {
  const auto h = static_cast<size_t>(c.hidden_size);
  const auto heads = static_cast<size_t>(d.q_heads);
  const auto o_heads = static_cast<size_t>(d.o_heads);
  const auto inter = static_cast<size_t>(d.intermediate);
  const auto vocab = static_cast<size_t>(d.vocab_rows);
  const auto qk = static_cast<size_t>(c.qk_nope_head_dim + c.qk_rope_head_dim);
  const auto lat = static_cast<size_t>(c.kv_lora_rank);
  const auto rq = static_cast<size_t>(c.q_lora_rank);
  w->embed_tokens.assign(vocab * h, 0.0f);
  w->norm.assign(h, 0.0f);
  w->lm_head.clear();
  if (!c.tie_word_embeddings) w->lm_head.assign(vocab * h, 0.0f);
  w->layers.assign(static_cast<size_t>(c.num_hidden_layers), LayerWeights());
  // FP8 checkpoints keep the projections in the *_fp8 slots (weight_fp8.cc); kv_b_proj is
  // dequantized into its fp32 vector there.
  const size_t f = c.quantization.FromCheckpoint() ? 0 : 1;
  for (LayerWeights& layer : w->layers) {
    layer.input_layernorm.assign(h, 0.0f);
    if (rq > 0) {
      layer.q_a_proj.assign(f * rq * h, 0.0f);
      layer.q_a_layernorm.assign(rq, 0.0f);
      layer.q_proj.assign(f * heads * qk * rq, 0.0f);
    } else {
      layer.q_proj.assign(f * heads * qk * h, 0.0f);
    }
    layer.kv_a_proj.assign(f * (lat + static_cast<size_t>(c.qk_rope_head_dim)) * h, 0.0f);
    layer.kv_a_layernorm.assign(lat, 0.0f);
    layer.kv_b_proj.assign(f * heads * static_cast<size_t>(c.qk_nope_head_dim + c.v_head_dim) * lat,
                           0.0f);
    layer.o_proj.assign(f * h * o_heads * static_cast<size_t>(c.v_head_dim), 0.0f);
    layer.post_attention_layernorm.assign(h, 0.0f);
    layer.gate_up_proj.assign(f * 2 * inter * h, 0.0f);
    layer.down_proj.assign(f * h * inter, 0.0f);
  }
  AllocateFamilyWeights(c, d, w);  // MoE layers' experts instead of the dense MLP
}

std::vector<float>* MlaSlotVector(LayerWeights* layer, WeightSlot slot) {
  switch (slot) {
    case WeightSlot::kMlaQAProj:
      return &layer->q_a_proj;
    case WeightSlot::kMlaQALayernorm:
      return &layer->q_a_layernorm;
    case WeightSlot::kMlaQProj:
      return &layer->q_proj;
    case WeightSlot::kMlaKvAProj:
      return &layer->kv_a_proj;
    case WeightSlot::kMlaKvALayernorm:
      return &layer->kv_a_layernorm;
    case WeightSlot::kMlaKvBProj:
      return &layer->kv_b_proj;
    default:
      return nullptr;  // the other slots live in weight_layout.cc's SlotVector
  }
}

}  // namespace tandem::runtime::internal
