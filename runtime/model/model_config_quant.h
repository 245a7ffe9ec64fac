// Private to //runtime/model: config.json's `quantization_config` (FP8 weights, issue 38). The
// public contract is ParseModelConfig's comment in model_config.h.
#ifndef TANDEM_RUNTIME_MODEL_MODEL_CONFIG_QUANT_H_
#define TANDEM_RUNTIME_MODEL_MODEL_CONFIG_QUANT_H_

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config.h"

namespace tandem::runtime::internal {

// Fills config->quantization from root["quantization_config"] (absent or null: none).
// INVALID_ARGUMENT naming the field or scheme for anything unsupported (model_config.h).
absl::Status ParseQuantizationConfig(const nlohmann::json& root, ModelConfig* config);

// The contents of an hf_quant_config.json (TensorRT Model Optimizer's export: {"producer":
// {"name": "modelopt", ...}, "quantization": {"quant_algo", "kv_cache_quant_algo",
// "exclude_modules"}}) as the modelopt quantization_config, when config.json had none (a config
// that is FP8 already is left as it is). INVALID_ARGUMENT as ParseQuantizationConfig, or for a
// file without a "quantization" object or from another producer.
absl::Status ParseHfQuantConfig(const nlohmann::json& hf, ModelConfig* config);

}  // namespace tandem::runtime::internal

#endif  // TANDEM_RUNTIME_MODEL_MODEL_CONFIG_QUANT_H_
