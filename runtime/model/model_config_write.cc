// ModelConfigToJson and the built-in presets (the write side of model_config.h).
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config.h"
#include "runtime/model/model_config_family.h"
#include "runtime/model/model_config_mla.h"

namespace tandem::runtime {
namespace {

using kernels::RopeType;

constexpr absl::string_view kLlama = "LlamaForCausalLM";
constexpr absl::string_view kQwen2 = "Qwen2ForCausalLM";

// The mixture-of-experts presets (PresetConfig).
absl::StatusOr<ModelConfig> MoePreset(absl::string_view name) {
  ModelConfig c;
  if (name == "qwen3-30b-a3b") {  // Qwen3-30B-A3B's config.json
    c.architecture = "Qwen3MoeForCausalLM";
    c.vocab_size = 151936;
    c.hidden_size = 2048;
    c.intermediate_size = 6144;
    c.num_hidden_layers = 48;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 768;
    c.norm_topk_prob = true;
    c.qk_norm = true;
    c.rope_theta = 1e6;
    c.max_position_embeddings = 40960;
    c.bos_token_id = 151643;
    c.eos_token_ids = {151645};
    c.dtype = WeightDtype::kBF16;
  } else if (name == "mixtral-8x7b") {  // Mixtral-8x7B-v0.1's config.json
    c.architecture = "MixtralForCausalLM";
    c.vocab_size = 32000;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 14336;
    c.norm_topk_prob = true;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 1e6;
    c.max_position_embeddings = 32768;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    c.dtype = WeightDtype::kBF16;
  } else {  // tiny-moe: a Qwen3-MoE small enough for tests
    c.architecture = "Qwen3MoeForCausalLM";
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 32;
    c.norm_topk_prob = true;
    c.qk_norm = true;
    c.max_position_embeddings = 2048;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  }
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

}  // namespace

std::string ModelConfigToJson(const ModelConfig& c) {
  if (c.IsMla()) return internal::MlaConfigToJson(c);  // model_config_mla.cc
  const bool qwen2 = c.architecture == kQwen2;
  const internal::ArchitectureInfo* arch = internal::FindArchitecture(c.architecture);
  nlohmann::ordered_json out;
  out["architectures"] = {c.architecture};
  out["model_type"] = arch != nullptr ? std::string(arch->model_type) : "llama";
  out["vocab_size"] = c.vocab_size;
  out["hidden_size"] = c.hidden_size;
  out["intermediate_size"] = c.intermediate_size;
  out["num_hidden_layers"] = c.num_hidden_layers;
  out["num_attention_heads"] = c.num_attention_heads;
  out["num_key_value_heads"] = c.num_key_value_heads;
  out["head_dim"] = c.head_dim;
  out["hidden_act"] = "silu";
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["rms_norm_eps"] = c.rms_norm_eps;
  out["rope_theta"] = c.rope_theta;
  switch (c.rope_scaling.type) {
    case RopeType::kDefault:
      out["rope_scaling"] = nullptr;
      break;
    case RopeType::kLinear:
      // Exactly {"type", "factor"}: transformers 4.40's validator accepts nothing else.
      out["rope_scaling"] = {{"type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeType::kLlama3:
      out["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
    case RopeType::kYarn:  // DeepSeek only: MlaConfigToJson (returned above)
      break;
  }
  using internal::AttentionBias;
  if (qwen2) {
    out["use_sliding_window"] = false;
    out["max_window_layers"] = c.num_hidden_layers;
  } else if (arch == nullptr || arch->bias == AttentionBias::kLlama) {
    out["attention_bias"] = c.qkv_bias;
    if (arch == nullptr || arch->mlp_bias_flag) out["mlp_bias"] = c.mlp_bias;
  } else if (arch->bias == AttentionBias::kQkvFlag) {
    out["qkv_bias"] = c.qkv_bias;
  }
  if (arch != nullptr && arch->window == internal::ArchitectureInfo::Window::kMistral) {
    out["sliding_window"] = nullptr;
  }
  if (c.IsMoe()) {
    out[c.MixtralExpertNames() ? "num_local_experts" : "num_experts"] = c.num_experts;
    out["num_experts_per_tok"] = c.num_experts_per_tok;
    if (!c.MixtralExpertNames()) {
      out["moe_intermediate_size"] = c.moe_intermediate_size;
      out["norm_topk_prob"] = c.norm_topk_prob;
      out["decoder_sparse_step"] = c.decoder_sparse_step;
      out["mlp_only_layers"] = c.mlp_only_layers;
      // Qwen2MoeConfig defaults a missing width to 5632: always written there.
      if (arch != nullptr && arch->shared_expert_intermediate_size > 0) {
        out["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
      }
    }
  }
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  out["bos_token_id"] = c.bos_token_id.has_value() ? nlohmann::ordered_json(*c.bos_token_id)
                                                   : nlohmann::ordered_json(nullptr);
  if (c.eos_token_ids.empty()) {
    out["eos_token_id"] = nullptr;
  } else if (c.eos_token_ids.size() == 1) {
    out["eos_token_id"] = c.eos_token_ids[0];
  } else {
    out["eos_token_id"] = c.eos_token_ids;
  }
  out["torch_dtype"] = std::string(WeightDtypeName(c.dtype));
  out["use_cache"] = true;
  return out.dump(2) + "\n";
}

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name) {
  ModelConfig c;
  c.architecture = std::string(kLlama);
  if (name == "llama3-8b" || name == "llama3-70b") {
    const bool big = name == "llama3-70b";
    c.vocab_size = 128256;
    c.hidden_size = big ? 8192 : 4096;
    c.intermediate_size = big ? 28672 : 14336;
    c.num_hidden_layers = big ? 80 : 32;
    c.num_attention_heads = big ? 64 : 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    c.rope_scaling = {RopeType::kLlama3, 8.0, 1.0, 4.0, 8192};
    c.max_position_embeddings = 131072;
    c.bos_token_id = 128000;
    c.eos_token_ids = {128001, 128008, 128009};
    c.dtype = WeightDtype::kBF16;
  } else if (name == "llama-100m") {
    c.vocab_size = 32000;
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 12;
    c.num_attention_heads = 12;
    c.num_key_value_heads = 4;
    c.head_dim = 64;
    c.rms_norm_eps = 1e-5;
    c.max_position_embeddings = 4096;
    c.tie_word_embeddings = true;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  } else if (name == "tiny") {
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.rms_norm_eps = 1e-6;
    c.max_position_embeddings = 2048;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  } else if (name == "qwen3-30b-a3b" || name == "mixtral-8x7b" || name == "tiny-moe") {
    return MoePreset(name);
  } else if (name == "qwen3-30b-a3b-fp8") {
    // Qwen3-30B-A3B-FP8's quantization_config: "fp8", weight_block_size [128, 128], dynamic
    // activations (1 x 128 groups). Dummy weights only (--load_format=dummy: drawn in fp32 and
    // quantized at load, QuantizeWeightsFp8; on CUDA drawn on the device).
    ASSIGN_OR_RETURN(c, MoePreset("qwen3-30b-a3b"));
    c.quantization.method = WeightQuantization::Method::kFp8Block;
    c.quantization.block_rows = 128;
    c.quantization.block_cols = 128;
    c.quantization.activation = kernels::Fp8ActivationScheme::kDynamicGroup128;
  } else if (name == "deepseek-v2-lite" || name == "deepseek-v2-lite-mtp" ||
             name == "deepseek-v3-4l" || name == "tiny-mla" || name == "deepseek-v2-lite-fp8" ||
             name == "deepseek-v3-4l-fp8" || name == "tiny-mla-fp8") {
    return internal::DeepseekPreset(name);  // model_config_mla.cc
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown preset '", name,
                     "' (presets: llama3-8b, llama3-70b, llama-100m, tiny, qwen3-30b-a3b, "
                     "qwen3-30b-a3b-fp8, mixtral-8x7b, tiny-moe, deepseek-v2-lite, "
                     "deepseek-v2-lite-mtp, deepseek-v3-4l, tiny-mla, deepseek-v2-lite-fp8, "
                     "deepseek-v3-4l-fp8, tiny-mla-fp8)"));
  }
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

}  // namespace tandem::runtime
