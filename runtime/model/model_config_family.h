// Private to //runtime/model: what differs between the supported architectures (their names,
// transformers' defaults, the flags a family fixes) and the mixture-of-experts fields of
// config.json. Used by model_config.cc; the public contract is model_config.h.
#ifndef TANDEM_RUNTIME_MODEL_MODEL_CONFIG_FAMILY_H_
#define TANDEM_RUNTIME_MODEL_MODEL_CONFIG_FAMILY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config.h"

namespace tandem::runtime::internal {

// How q/k/v/o biases are configured.
enum class AttentionBias {
  kLlama,    // `attention_bias` covers q/k/v and o_proj (Llama, Qwen3, Qwen3-MoE)
  kQwen2,    // q/k/v always, o_proj never (Qwen2)
  kQkvFlag,  // `qkv_bias` (default true) covers q/k/v, o_proj never (Qwen2-MoE)
  kNone,     // none, whatever the file says (Mistral, Mixtral)
};

// One supported architecture with the defaults of its transformers config class.
struct ArchitectureInfo {
  absl::string_view name;        // "LlamaForCausalLM"
  absl::string_view model_type;  // "llama"
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
  int64_t num_key_value_heads;  // 0: = num_attention_heads
  int64_t head_dim;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings;
  double rms_norm_eps, rope_theta;
  bool llama_token_defaults;  // bos 1 / eos 2 when the keys are absent
  AttentionBias bias;
  bool mlp_bias_flag;  // `mlp_bias` is read (Llama only)
  bool qk_norm;
  // Sliding window: kMistral clamps max_position_embeddings to a binding `sliding_window`
  // (exact below it); kQwen refuses `use_sliding_window: true`; kQwen2 keeps Qwen2's rule.
  enum class Window { kNone, kMistral, kQwen, kQwen2 } window;
  // Mixture of experts (0 experts: dense).
  int64_t num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size;
  bool mixtral_moe;  // experts of width intermediate_size in every layer, always renormalised
};

// nullptr when `name` / `model_type` is not supported.
const ArchitectureInfo* FindArchitecture(absl::string_view name);
const ArchitectureInfo* FindArchitectureByModelType(absl::string_view model_type);
// "LlamaForCausalLM, Qwen2ForCausalLM, ..." / "llama, qwen2, ..." for error messages.
std::string SupportedArchitectures();
std::string SupportedModelTypes();

// Reads the mixture-of-experts fields of `root` into `config` (defaults from `arch`):
// num_local_experts / num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
// shared_expert_intermediate_size, decoder_sparse_step, mlp_only_layers. Also applies the
// sliding-window rule of `arch`. INVALID_ARGUMENT naming the field for a wrong type.
absl::Status ParseFamilyFields(const nlohmann::json& root, const ArchitectureInfo& arch,
                               ModelConfig* config);

// INVALID_ARGUMENT when `config`'s bias / q-k norm / expert flags are impossible for `arch`.
absl::Status CheckFamilyFlags(const ModelConfig& config, const ArchitectureInfo& arch);

// INVALID_ARGUMENT naming the numbers when the MoE fields cannot describe a model: top-k out of
// [1, experts], non-positive expert widths, mlp_only_layers outside the layers, step < 1.
absl::Status ValidateMoeConfig(const ModelConfig& config);

}  // namespace tandem::runtime::internal

#endif  // TANDEM_RUNTIME_MODEL_MODEL_CONFIG_FAMILY_H_
