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

// ValidateModelConfig for an MLA config (config.IsMla()).
absl::Status ValidateMlaConfig(const ModelConfig& config);

// ModelConfig::NumParameters for an MLA config.
int64_t MlaNumParameters(const ModelConfig& config);

// ModelConfigToJson for an MLA config: a DeepSeek config.json transformers 5 loads
// (rope_parameters form).
std::string MlaConfigToJson(const ModelConfig& config);

}  // namespace tandem::runtime::internal

#endif  // TANDEM_RUNTIME_MODEL_MODEL_CONFIG_MLA_H_
