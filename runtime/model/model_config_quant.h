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

}  // namespace tandem::runtime::internal

#endif  // TANDEM_RUNTIME_MODEL_MODEL_CONFIG_QUANT_H_
