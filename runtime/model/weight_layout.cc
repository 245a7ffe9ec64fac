#include "runtime/model/weight_layout.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace tandem::runtime::internal {
namespace {

// SplitMix64 (Steele, Lea, Flood 2014): a tiny generator with a fixed, documented output, so
// dummy weights stay identical across compilers and standard libraries (std::normal_distribution
// is implementation-defined).
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(absl::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (char c : text) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

constexpr double kStddev = 0.02;

}  // namespace

int64_t HfTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<HfTensor> HfTensorLayout(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim;
  const int64_t inter = c.intermediate_size;
  std::vector<HfTensor> out;
  auto add = [&out](std::string name, std::vector<int64_t> shape, WeightSlot slot, int64_t layer,
                    int64_t offset, bool is_norm = false) {
    out.push_back({std::move(name), std::move(shape), slot, layer, offset, is_norm});
  };
  add("model.embed_tokens.weight", {c.vocab_size, h}, WeightSlot::kEmbedTokens, -1, 0);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    add(p + "input_layernorm.weight", {h}, WeightSlot::kInputLayernorm, i, 0, true);
    add(p + "self_attn.q_proj.weight", {q, h}, WeightSlot::kQkvProj, i, 0);
    add(p + "self_attn.k_proj.weight", {kv, h}, WeightSlot::kQkvProj, i, q * h);
    add(p + "self_attn.v_proj.weight", {kv, h}, WeightSlot::kQkvProj, i, (q + kv) * h);
    if (c.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q}, WeightSlot::kQkvBias, i, 0);
      add(p + "self_attn.k_proj.bias", {kv}, WeightSlot::kQkvBias, i, q);
      add(p + "self_attn.v_proj.bias", {kv}, WeightSlot::kQkvBias, i, q + kv);
    }
    add(p + "self_attn.o_proj.weight", {h, q}, WeightSlot::kOProj, i, 0);
    if (c.o_bias) add(p + "self_attn.o_proj.bias", {h}, WeightSlot::kOBias, i, 0);
    add(p + "post_attention_layernorm.weight", {h}, WeightSlot::kPostAttentionLayernorm, i, 0,
        true);
    add(p + "mlp.gate_proj.weight", {inter, h}, WeightSlot::kGateUpProj, i, 0);
    add(p + "mlp.up_proj.weight", {inter, h}, WeightSlot::kGateUpProj, i, inter * h);
    add(p + "mlp.down_proj.weight", {h, inter}, WeightSlot::kDownProj, i, 0);
    if (c.mlp_bias) {
      add(p + "mlp.gate_proj.bias", {inter}, WeightSlot::kGateUpBias, i, 0);
      add(p + "mlp.up_proj.bias", {inter}, WeightSlot::kGateUpBias, i, inter);
      add(p + "mlp.down_proj.bias", {h}, WeightSlot::kDownBias, i, 0);
    }
  }
  add("model.norm.weight", {h}, WeightSlot::kNorm, -1, 0, true);
  if (!c.tie_word_embeddings) {
    add("lm_head.weight", {c.vocab_size, h}, WeightSlot::kLmHead, -1, 0);
  }
  return out;
}

void AllocateModelWeights(const ModelConfig& c, ModelWeights* w) {
  const auto h = static_cast<size_t>(c.hidden_size);
  const auto q = static_cast<size_t>(c.num_attention_heads * c.head_dim);
  const auto kv = static_cast<size_t>(c.num_key_value_heads * c.head_dim);
  const auto inter = static_cast<size_t>(c.intermediate_size);
  const auto vocab = static_cast<size_t>(c.vocab_size);
  w->embed_tokens.assign(vocab * h, 0.0f);
  w->norm.assign(h, 0.0f);
  w->lm_head.clear();
  if (!c.tie_word_embeddings) w->lm_head.assign(vocab * h, 0.0f);
  w->layers.assign(static_cast<size_t>(c.num_hidden_layers), LayerWeights());
  for (LayerWeights& layer : w->layers) {
    layer.input_layernorm.assign(h, 0.0f);
    layer.qkv_proj.assign((q + 2 * kv) * h, 0.0f);
    if (c.qkv_bias) layer.qkv_bias.assign(q + 2 * kv, 0.0f);
    layer.o_proj.assign(h * q, 0.0f);
    if (c.o_bias) layer.o_bias.assign(h, 0.0f);
    layer.post_attention_layernorm.assign(h, 0.0f);
    layer.gate_up_proj.assign(2 * inter * h, 0.0f);
    if (c.mlp_bias) layer.gate_up_bias.assign(2 * inter, 0.0f);
    layer.down_proj.assign(h * inter, 0.0f);
    if (c.mlp_bias) layer.down_bias.assign(h, 0.0f);
  }
}

float* SlotData(ModelWeights* w, const HfTensor& t) {
  std::vector<float>* target = nullptr;
  LayerWeights* layer = t.layer >= 0 ? &w->layers[static_cast<size_t>(t.layer)] : nullptr;
  switch (t.slot) {
    case WeightSlot::kEmbedTokens:
      target = &w->embed_tokens;
      break;
    case WeightSlot::kNorm:
      target = &w->norm;
      break;
    case WeightSlot::kLmHead:
      target = &w->lm_head;
      break;
    case WeightSlot::kInputLayernorm:
      target = &layer->input_layernorm;
      break;
    case WeightSlot::kQkvProj:
      target = &layer->qkv_proj;
      break;
    case WeightSlot::kQkvBias:
      target = &layer->qkv_bias;
      break;
    case WeightSlot::kOProj:
      target = &layer->o_proj;
      break;
    case WeightSlot::kOBias:
      target = &layer->o_bias;
      break;
    case WeightSlot::kPostAttentionLayernorm:
      target = &layer->post_attention_layernorm;
      break;
    case WeightSlot::kGateUpProj:
      target = &layer->gate_up_proj;
      break;
    case WeightSlot::kGateUpBias:
      target = &layer->gate_up_bias;
      break;
    case WeightSlot::kDownProj:
      target = &layer->down_proj;
      break;
    case WeightSlot::kDownBias:
      target = &layer->down_bias;
      break;
  }
  return target->data() + t.offset;
}

TensorRandomStream::TensorRandomStream(uint64_t seed, const HfTensor& tensor)
    : is_norm_(tensor.is_norm) {
  // Mixing the name hash through one SplitMix64 step decorrelates neighbouring seeds.
  uint64_t mix = seed ^ Fnv1a(tensor.name);
  state_ = SplitMix64(mix);
}

uint64_t TensorRandomStream::NextBits() { return SplitMix64(state_); }

double TensorRandomStream::NextNormal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // Box-Muller; u1 in (0, 1] keeps log() finite.
  const double u1 = (static_cast<double>(NextBits() >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(NextBits() >> 11) * 0x1.0p-53;
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

void TensorRandomStream::Fill(float* out, int64_t count) {
  const double center = is_norm_ ? 1.0 : 0.0;
  for (int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<float>(center + kStddev * NextNormal());
  }
}

}  // namespace tandem::runtime::internal
