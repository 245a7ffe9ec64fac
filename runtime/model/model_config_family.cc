#include "runtime/model/model_config_family.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tandem::runtime {
namespace internal {
namespace {

using json = nlohmann::json;
using Window = ArchitectureInfo::Window;

// transformers' defaults per config class (LlamaConfig, Qwen2Config, MistralConfig,
// Qwen3Config, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig).
// clang-format off
// name, model_type, vocab, hidden, intermediate, layers, heads, kv heads (0: = heads), head_dim
// (0: hidden / heads), max positions, rms eps, rope theta, bos 1 / eos 2, biases, mlp_bias key,
// q/k norm, sliding window rule, experts, top-k, expert width, shared expert width, Mixtral MoE.
constexpr ArchitectureInfo kArchitectures[] = {
    {"LlamaForCausalLM", "llama", 32000, 4096, 11008, 32, 32, 0, 0, 2048, 1e-6, 1e4, true,
     AttentionBias::kLlama, true, false, Window::kNone, 0, 0, 0, 0, false},
    {"Qwen2ForCausalLM", "qwen2", 151936, 4096, 22016, 32, 32, 0, 0, 32768, 1e-6, 1e4, false,
     AttentionBias::kQwen2, false, false, Window::kQwen2, 0, 0, 0, 0, false},
    {"MistralForCausalLM", "mistral", 32000, 4096, 14336, 32, 32, 8, 0, 4096 * 32, 1e-6, 1e4, true,
     AttentionBias::kNone, false, false, Window::kMistral, 0, 0, 0, 0, false},
    {"Qwen3ForCausalLM", "qwen3", 151936, 4096, 22016, 32, 32, 32, 128, 32768, 1e-6, 1e4, false,
     AttentionBias::kLlama, false, true, Window::kQwen, 0, 0, 0, 0, false},
    {"MixtralForCausalLM", "mixtral", 32000, 4096, 14336, 32, 32, 8, 0, 4096 * 32, 1e-5, 1e6, true,
     AttentionBias::kNone, false, false, Window::kMistral, 8, 2, 0, 0, true},
    {"Qwen2MoeForCausalLM", "qwen2_moe", 151936, 2048, 5632, 24, 16, 16, 0, 32768, 1e-6, 1e4, false,
     AttentionBias::kQkvFlag, false, false, Window::kQwen, 60, 4, 1408, 5632, false},
    {"Qwen3MoeForCausalLM", "qwen3_moe", 151936, 2048, 6144, 24, 32, 4, 0, 32768, 1e-6, 1e4, false,
     AttentionBias::kLlama, false, true, Window::kQwen, 128, 8, 768, 0, false},
};
// clang-format on

std::string Show(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = absl::StrCat(text.substr(0, 77), "...");
  return text;
}

const json* Field(const json& object, absl::string_view key) {
  auto it = object.find(std::string(key));
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> AsInt(const json& value) {
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return std::nullopt;
}

absl::Status TypeError(absl::string_view key, absl::string_view expected, const json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field '", key, "' must be ", expected, ", got ", Show(got)));
}

absl::StatusOr<int64_t> Int(const json& root, absl::string_view key, int64_t fallback) {
  const json* value = Field(root, key);
  if (value == nullptr) return fallback;
  std::optional<int64_t> i = AsInt(*value);
  if (!i.has_value()) return TypeError(key, "an integer", *value);
  return *i;
}

absl::StatusOr<bool> Bool(const json& root, absl::string_view key, bool fallback) {
  const json* value = Field(root, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return TypeError(key, "true or false", *value);
  return value->get<bool>();
}

absl::Status ParseWindow(const json& root, const ArchitectureInfo& arch, ModelConfig* c) {
  if (arch.window == Window::kMistral) {
    // MistralConfig / MixtralConfig: `sliding_window` (null = full attention). Attention over a
    // window W equals full attention while a sequence has at most W tokens, so the model is
    // served exactly with its context limited to W.
    ASSIGN_OR_RETURN(int64_t window, Int(root, "sliding_window", 0));
    if (window < 0) return TypeError("sliding_window", "null or a positive integer", window);
    if (window > 0 && window < c->max_position_embeddings) c->max_position_embeddings = window;
  } else if (arch.window == Window::kQwen) {
    ASSIGN_OR_RETURN(bool sliding, Bool(root, "use_sliding_window", false));
    if (sliding) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported sliding-window attention: use_sliding_window is true (", arch.name, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const ArchitectureInfo* FindArchitecture(absl::string_view name) {
  for (const ArchitectureInfo& arch : kArchitectures) {
    if (arch.name == name) return &arch;
  }
  return nullptr;
}

const ArchitectureInfo* FindArchitectureByModelType(absl::string_view model_type) {
  for (const ArchitectureInfo& arch : kArchitectures) {
    if (arch.model_type == model_type) return &arch;
  }
  return nullptr;
}

std::string SupportedArchitectures() {
  std::vector<absl::string_view> names;
  for (const ArchitectureInfo& arch : kArchitectures) names.push_back(arch.name);
  return absl::StrJoin(names, ", ");
}

std::string SupportedModelTypes() {
  std::vector<absl::string_view> names;
  for (const ArchitectureInfo& arch : kArchitectures) names.push_back(arch.model_type);
  return absl::StrJoin(names, ", ");
}

absl::Status ParseFamilyFields(const json& root, const ArchitectureInfo& arch, ModelConfig* c) {
  c->qk_norm = arch.qk_norm;
  RETURN_IF_ERROR(ParseWindow(root, arch, c));
  if (arch.num_experts == 0) return absl::OkStatus();
  // MixtralConfig spells the count num_local_experts; the Qwen MoE configs num_experts.
  ASSIGN_OR_RETURN(c->num_experts, Int(root, "num_local_experts", arch.num_experts));
  ASSIGN_OR_RETURN(c->num_experts, Int(root, "num_experts", c->num_experts));
  ASSIGN_OR_RETURN(c->num_experts_per_tok,
                   Int(root, "num_experts_per_tok", arch.num_experts_per_tok));
  if (arch.mixtral_moe) {
    // MixtralSparseMoeBlock: every layer sparse, experts of intermediate_size, top-k
    // probabilities always renormalised, no shared expert.
    c->moe_intermediate_size = c->intermediate_size;
    c->norm_topk_prob = true;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(c->moe_intermediate_size,
                   Int(root, "moe_intermediate_size", arch.moe_intermediate_size));
  ASSIGN_OR_RETURN(c->norm_topk_prob, Bool(root, "norm_topk_prob", false));
  if (arch.shared_expert_intermediate_size > 0) {
    ASSIGN_OR_RETURN(
        c->shared_expert_intermediate_size,
        Int(root, "shared_expert_intermediate_size", arch.shared_expert_intermediate_size));
  }
  ASSIGN_OR_RETURN(c->decoder_sparse_step, Int(root, "decoder_sparse_step", 1));
  c->mlp_only_layers.clear();
  if (const json* list = Field(root, "mlp_only_layers"); list != nullptr) {
    if (!list->is_array()) return TypeError("mlp_only_layers", "a list of layer indices", *list);
    for (const json& entry : *list) {
      std::optional<int64_t> layer = AsInt(entry);
      if (!layer.has_value()) return TypeError("mlp_only_layers", "a list of layer indices", *list);
      c->mlp_only_layers.push_back(*layer);
    }
  }
  return absl::OkStatus();
}

// The bias / norm flags `c` may have as an `arch` model.
absl::Status CheckFamilyFlags(const ModelConfig& c, const ArchitectureInfo& arch) {
  if (arch.bias == AttentionBias::kQwen2 && (!c.qkv_bias || c.o_bias || c.mlp_bias)) {
    return absl::InvalidArgumentError(
        "Qwen2ForCausalLM has q/k/v biases and no o_proj or MLP biases");
  }
  if (arch.bias == AttentionBias::kLlama && c.qkv_bias != c.o_bias) {
    return absl::InvalidArgumentError(absl::StrCat(
        arch.name, "'s attention_bias covers q/k/v and o_proj alike (qkv_bias != o_bias)"));
  }
  if ((arch.bias == AttentionBias::kNone && (c.qkv_bias || c.o_bias)) ||
      (arch.bias == AttentionBias::kQkvFlag && c.o_bias) || (c.mlp_bias && !arch.mlp_bias_flag)) {
    return absl::InvalidArgumentError(absl::StrCat(arch.name, " cannot have these biases (qkv ",
                                                   c.qkv_bias, ", o_proj ", c.o_bias, ", mlp ",
                                                   c.mlp_bias, ")"));
  }
  if (c.qk_norm != arch.qk_norm) {
    return absl::InvalidArgumentError(absl::StrCat(arch.name, (arch.qk_norm ? " has" : " has no"),
                                                   " per-head q/k norms (qk_norm)"));
  }
  if ((arch.num_experts > 0) != c.IsMoe()) {
    return absl::InvalidArgumentError(
        absl::StrCat(arch.name, " is ", arch.num_experts > 0 ? "" : "not ",
                     "a mixture of experts (num_experts ", c.num_experts, ")"));
  }
  if (c.shared_expert_intermediate_size > 0 && arch.shared_expert_intermediate_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(arch.name, " has no shared expert"));
  }
  return absl::OkStatus();
}

absl::Status ValidateMoeConfig(const ModelConfig& c) {
  if (c.num_experts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_experts must be >= 0, got ", c.num_experts));
  }
  if (!c.IsMoe()) return absl::OkStatus();
  if (c.num_experts > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("num_experts ", c.num_experts, " is too large"));
  }
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("num_experts_per_tok (", c.num_experts_per_tok,
                                                   ") must be in [1, num_experts = ", c.num_experts,
                                                   "]"));
  }
  if (c.moe_intermediate_size < 1 || c.moe_intermediate_size > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe_intermediate_size must be in [1, 2^24], got ", c.moe_intermediate_size));
  }
  if (c.shared_expert_intermediate_size < 0 ||
      c.shared_expert_intermediate_size > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared_expert_intermediate_size must be in [0, 2^24], got ",
                     c.shared_expert_intermediate_size));
  }
  if (c.decoder_sparse_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder_sparse_step must be >= 1, got ", c.decoder_sparse_step));
  }
  for (int64_t layer : c.mlp_only_layers) {
    if (layer < 0 || layer >= c.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mlp_only_layers entry ", layer, " is not a layer in [0, ", c.num_hidden_layers, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (!IsMoe()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
}

}  // namespace tandem::runtime
