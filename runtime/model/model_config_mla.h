// Private to //runtime/model: DeepSeek-V2/V3 configs (multi-head latent attention), parsed apart
// from the Llama family because almost every field differs. model_config.cc hands a DeepSeek
// config.json to ParseDeepseekConfig and an MLA ModelConfig to ValidateMlaConfig; the public
// contract is model_config.h.
#ifndef TANDEM_RUNTIME_MODEL_MODEL_CONFIG_MLA_H_
#define TANDEM_RUNTIME_MODEL_MODEL_CONFIG_MLA_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config.h"

namespace tandem::runtime::internal {

// True when `root` names a DeepSeek architecture (architectures[0] or model_type), supported or
// not: ParseDeepseekConfig then says which.
bool IsDeepseekConfig(const nlohmann::json& root);

// transformers' DeepseekV2Config / DeepseekV3Config with their defaults: MLA dims, RoPE
// (default or yarn, in rope_scaling or rope_parameters), rope_interleave (V3; V2 always pairs),
// first_k_dense_replace and the MoE fields. INVALID_ARGUMENT naming the field for what we cannot
// run exactly: attention/mlp biases, num_key_value_heads != num_attention_heads, other RoPE
// types, partial rotary, moe_layer_freq != 1, other DeepSeek architectures.
absl::StatusOr<ModelConfig> ParseDeepseekConfig(const nlohmann::json& root);

// PresetConfig's DeepSeek shapes (dummy models), parsed from their config.json text:
//   "deepseek-v2-lite": DeepSeek-V2-Lite's config.json (15.7B: 27 layers, 1 dense then 64
//                       experts top-6 + 2 shared, 16 heads, no q_lora, yarn factor 40), bfloat16;
//   "deepseek-v3-4l":   DeepSeek-V3's config.json cut to 4 layers (3 dense, 1 MoE layer of 256
//                       experts, 128 heads, q_lora 1536), bfloat16;
//   "tiny-mla":         a dense DeepSeek-V3 small enough for tests (vocab 256, hidden 64).
// NOT_FOUND for any other name.
absl::StatusOr<ModelConfig> DeepseekPreset(absl::string_view name);

// ValidateModelConfig for an MLA config (config.IsMla()).
absl::Status ValidateMlaConfig(const ModelConfig& config);

// ModelConfig::NumParameters for an MLA config.
int64_t MlaNumParameters(const ModelConfig& config);

// ModelConfigToJson for an MLA config: a DeepSeek config.json transformers 5 loads
// (rope_parameters form).
std::string MlaConfigToJson(const ModelConfig& config);

}  // namespace tandem::runtime::internal

#endif  // TANDEM_RUNTIME_MODEL_MODEL_CONFIG_MLA_H_
