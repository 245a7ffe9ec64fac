#include "runtime/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config_family.h"
#include "runtime/model/model_config_mla.h"
#include "runtime/model/model_config_quant.h"

namespace tandem::runtime {
namespace {

using json = nlohmann::json;
using internal::ArchitectureInfo;
using internal::AttentionBias;
using kernels::RopeType;

// Bounds far above any real model; they keep every size product below 2^63.
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr double kMaxParameters = 1e14;

// A JSON value for an error message; never throws on invalid UTF-8.
std::string Show(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = absl::StrCat(text.substr(0, 77), "...");
  return text;
}

std::string Path(absl::string_view where, absl::string_view key) {
  return where.empty() ? std::string(key) : absl::StrCat(where, ".", key);
}

// The value of `key`, or nullptr when absent or null (transformers treats both as "use default").
const json* Field(const json& object, absl::string_view key) {
  auto it = object.find(std::string(key));
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status TypeError(absl::string_view where, absl::string_view key, absl::string_view expected,
                       const json& got) {
  return absl::InvalidArgumentError(absl::StrCat("config field '", Path(where, key), "' must be ",
                                                 expected, ", got ", Show(got)));
}

// Integers may be written as 8192 or 8192.0 (some exporters write floats); nothing else.
std::optional<int64_t> AsInt(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<int64_t>> OptInt(const json& object, absl::string_view key,
                                              absl::string_view where = "") {
  const json* value = Field(object, key);
  if (value == nullptr) return std::optional<int64_t>();
  std::optional<int64_t> i = AsInt(*value);
  if (!i.has_value()) return TypeError(where, key, "an integer", *value);
  return i;
}

absl::StatusOr<int64_t> Int(const json& object, absl::string_view key, int64_t fallback) {
  ASSIGN_OR_RETURN(std::optional<int64_t> value, OptInt(object, key));
  return value.value_or(fallback);
}

absl::StatusOr<std::optional<double>> OptDouble(const json& object, absl::string_view key,
                                                absl::string_view where = "") {
  const json* value = Field(object, key);
  if (value == nullptr) return std::optional<double>();
  if (!value->is_number()) return TypeError(where, key, "a number", *value);
  return std::optional<double>(value->get<double>());
}

absl::StatusOr<bool> Bool(const json& object, absl::string_view key, bool fallback) {
  const json* value = Field(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return TypeError("", key, "true or false", *value);
  return value->get<bool>();
}

absl::StatusOr<std::optional<std::string>> OptString(const json& object, absl::string_view key,
                                                     absl::string_view where = "") {
  const json* value = Field(object, key);
  if (value == nullptr) return std::optional<std::string>();
  if (!value->is_string()) return TypeError(where, key, "a string", *value);
  return std::optional<std::string>(value->get<std::string>());
}

absl::StatusOr<int32_t> TokenId(const json& value, absl::string_view key) {
  std::optional<int64_t> id = AsInt(value);
  if (!id.has_value() || *id < 0 || *id > std::numeric_limits<int32_t>::max()) {
    return TypeError("", key, "a non-negative token id", value);
  }
  return static_cast<int32_t>(*id);
}

// eos_token_id: an int, a list of ints, or null. nullopt when absent or null.
absl::StatusOr<std::optional<std::vector<int32_t>>> TokenIds(const json& object,
                                                             absl::string_view key) {
  const json* value = Field(object, key);
  if (value == nullptr) return std::optional<std::vector<int32_t>>();
  std::vector<int32_t> ids;
  if (value->is_array()) {
    for (const json& element : *value) {
      ASSIGN_OR_RETURN(int32_t id, TokenId(element, key));
      ids.push_back(id);
    }
  } else {
    ASSIGN_OR_RETURN(int32_t id, TokenId(*value, key));
    ids.push_back(id);
  }
  return std::optional<std::vector<int32_t>>(std::move(ids));
}

absl::StatusOr<std::optional<int32_t>> OptTokenId(const json& object, absl::string_view key) {
  const json* value = Field(object, key);
  if (value == nullptr) return std::optional<int32_t>();
  ASSIGN_OR_RETURN(int32_t id, TokenId(*value, key));
  return std::optional<int32_t>(id);
}

absl::StatusOr<const ArchitectureInfo*> ParseArchitecture(const json& root) {
  std::string architecture;
  if (const json* list = Field(root, "architectures"); list != nullptr) {
    if (!list->is_array() || list->empty() || !(*list)[0].is_string()) {
      return TypeError("", "architectures", "a non-empty list of strings", *list);
    }
    architecture = (*list)[0].get<std::string>();
  } else {
    // Some hand-written configs name only the model_type.
    ASSIGN_OR_RETURN(std::optional<std::string> model_type, OptString(root, "model_type"));
    if (!model_type.has_value()) {
      return absl::InvalidArgumentError("config has neither 'architectures' nor 'model_type'");
    }
    const ArchitectureInfo* arch = internal::FindArchitectureByModelType(*model_type);
    if (arch == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported model_type '", *model_type,
                       "' (supported: ", internal::SupportedModelTypes(), ")"));
    }
    return arch;
  }
  const ArchitectureInfo* arch = internal::FindArchitecture(architecture);
  if (arch == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported architecture '", architecture,
                     "' (supported: ", internal::SupportedArchitectures(), ")"));
  }
  return arch;
}

absl::Status RejectPartialRotary(const json& object, absl::string_view where) {
  ASSIGN_OR_RETURN(std::optional<double> factor, OptDouble(object, "partial_rotary_factor", where));
  if (factor.has_value() && *factor != 1.0) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported ",
                                                   Path(where, "partial_rotary_factor"), " ",
                                                   *factor, " (RoPE must cover the whole head)"));
  }
  return absl::OkStatus();
}

// Fills rope_theta and rope_scaling the way transformers 5's convert_rope_params_to_dict reads
// both spellings (transformers 4 reads the same fields of the older one).
absl::Status ParseRope(const json& root, double default_theta, ModelConfig* config) {
  const json* rope = nullptr;
  std::string where;
  for (absl::string_view key : {"rope_scaling", "rope_parameters"}) {
    const json* candidate = Field(root, key);
    if (candidate == nullptr) continue;
    if (!candidate->is_object()) return TypeError("", key, "an object or null", *candidate);
    // An empty dict is falsy in Python: transformers falls through to the next spelling.
    if (candidate->empty()) continue;
    rope = candidate;
    where = std::string(key);
    break;
  }
  ASSIGN_OR_RETURN(std::optional<double> top_theta, OptDouble(root, "rope_theta"));
  config->rope_theta = top_theta.value_or(default_theta);
  config->rope_scaling = kernels::RopeScaling();
  RETURN_IF_ERROR(RejectPartialRotary(root, ""));
  if (rope == nullptr) return absl::OkStatus();

  ASSIGN_OR_RETURN(std::optional<double> inner_theta, OptDouble(*rope, "rope_theta", where));
  if (inner_theta.has_value()) config->rope_theta = *inner_theta;
  RETURN_IF_ERROR(RejectPartialRotary(*rope, where));

  std::string type = "default";
  for (absl::string_view key : {"rope_type", "type"}) {  // "type" is the pre-4.42 spelling
    ASSIGN_OR_RETURN(std::optional<std::string> value, OptString(*rope, key, where));
    if (value.has_value()) {
      type = *value;
      break;
    }
  }
  auto required = [&](absl::string_view key) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(std::optional<double> value, OptDouble(*rope, key, where));
    if (!value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": rope type '", type, "' requires '", key, "'"));
    }
    return *value;
  };
  kernels::RopeScaling& scaling = config->rope_scaling;
  if (type == "default") {
    scaling.type = RopeType::kDefault;
  } else if (type == "linear") {
    scaling.type = RopeType::kLinear;
    ASSIGN_OR_RETURN(scaling.factor, required("factor"));
  } else if (type == "llama3") {
    scaling.type = RopeType::kLlama3;
    ASSIGN_OR_RETURN(scaling.factor, required("factor"));
    ASSIGN_OR_RETURN(scaling.low_freq_factor, required("low_freq_factor"));
    ASSIGN_OR_RETURN(scaling.high_freq_factor, required("high_freq_factor"));
    ASSIGN_OR_RETURN(double original, required("original_max_position_embeddings"));
    if (original != std::floor(original) || !(std::fabs(original) < 9.0e15)) {
      return TypeError(where, "original_max_position_embeddings", "an integer",
                       (*rope)["original_max_position_embeddings"]);
    }
    scaling.original_max_position_embeddings = static_cast<int64_t>(original);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unsupported rope type '", type, "' in ", where,
                                                   " (supported: default, linear, llama3)"));
  }
  return absl::OkStatus();
}

// q/k/v, o_proj and MLP biases as the architecture's attention / MLP classes build them.
absl::Status ParseBiases(const json& root, const ArchitectureInfo& arch, ModelConfig* c) {
  c->qkv_bias = c->o_bias = c->mlp_bias = false;
  switch (arch.bias) {
    case AttentionBias::kLlama: {
      ASSIGN_OR_RETURN(bool attention_bias, Bool(root, "attention_bias", false));
      c->qkv_bias = c->o_bias = attention_bias;
      break;
    }
    case AttentionBias::kQwen2:  // Qwen2Attention hard-codes q/k/v biases, none on o_proj
      c->qkv_bias = true;
      break;
    case AttentionBias::kQkvFlag: {
      ASSIGN_OR_RETURN(c->qkv_bias, Bool(root, "qkv_bias", true));
      break;
    }
    case AttentionBias::kNone:
      break;
  }
  if (arch.mlp_bias_flag) {
    ASSIGN_OR_RETURN(c->mlp_bias, Bool(root, "mlp_bias", false));
  }
  return absl::OkStatus();
}

// Sizes, head_dim, rms_norm_eps and tie_word_embeddings, with the defaults of the
// architecture's transformers config class.
absl::Status ParseShape(const json& root, const ArchitectureInfo& arch, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->vocab_size, Int(root, "vocab_size", arch.vocab_size));
  ASSIGN_OR_RETURN(c->hidden_size, Int(root, "hidden_size", arch.hidden_size));
  ASSIGN_OR_RETURN(c->intermediate_size, Int(root, "intermediate_size", arch.intermediate_size));
  ASSIGN_OR_RETURN(c->num_hidden_layers, Int(root, "num_hidden_layers", arch.num_hidden_layers));
  ASSIGN_OR_RETURN(c->num_attention_heads,
                   Int(root, "num_attention_heads", arch.num_attention_heads));
  ASSIGN_OR_RETURN(
      c->num_key_value_heads,
      Int(root, "num_key_value_heads",
          arch.num_key_value_heads > 0 ? arch.num_key_value_heads : c->num_attention_heads));
  ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, OptInt(root, "head_dim"));
  if (head_dim.has_value() || arch.head_dim > 0) {
    c->head_dim = head_dim.value_or(arch.head_dim);
  } else if (c->num_attention_heads > 0) {
    if (c->hidden_size % c->num_attention_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hidden_size (", c->hidden_size, ") is not divisible by num_attention_heads (",
          c->num_attention_heads, ") and head_dim is not given"));
    }
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }
  ASSIGN_OR_RETURN(c->max_position_embeddings,
                   Int(root, "max_position_embeddings", arch.max_position_embeddings));
  ASSIGN_OR_RETURN(std::optional<double> eps, OptDouble(root, "rms_norm_eps"));
  c->rms_norm_eps = eps.value_or(arch.rms_norm_eps);
  ASSIGN_OR_RETURN(c->tie_word_embeddings, Bool(root, "tie_word_embeddings", false));
  return absl::OkStatus();
}

// Every layer must be full attention: Qwen2's sliding window reaching a layer, or a layer_types
// entry other than "full_attention", is rejected.
absl::Status RejectNonFullAttention(const json& root, const ArchitectureInfo& arch,
                                    const ModelConfig& c) {
  if (arch.window == ArchitectureInfo::Window::kQwen2) {
    ASSIGN_OR_RETURN(bool sliding, Bool(root, "use_sliding_window", false));
    ASSIGN_OR_RETURN(int64_t max_window_layers, Int(root, "max_window_layers", 28));
    if (sliding && c.num_hidden_layers > max_window_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported sliding-window attention: use_sliding_window is true and layers >= "
          "max_window_layers (",
          max_window_layers, ") of num_hidden_layers (", c.num_hidden_layers, ") would use it"));
    }
  }
  if (const json* layer_types = Field(root, "layer_types"); layer_types != nullptr) {
    if (!layer_types->is_array()) return TypeError("", "layer_types", "a list", *layer_types);
    for (const json& type : *layer_types) {
      if (!type.is_string() || type.get<std::string>() != "full_attention") {
        return absl::InvalidArgumentError(absl::StrCat("unsupported layer_types entry ", Show(type),
                                                       " (supported: \"full_attention\")"));
      }
    }
  }
  return absl::OkStatus();
}

// bos_token_id and eos_token_id. LlamaConfig (Mistral, Mixtral) defaults them to 1/2; an
// explicit null means "none".
absl::Status ParseSpecialTokens(const json& root, const ArchitectureInfo& arch, ModelConfig* c) {
  ASSIGN_OR_RETURN(std::optional<int32_t> bos, OptTokenId(root, "bos_token_id"));
  ASSIGN_OR_RETURN(std::optional<std::vector<int32_t>> eos, TokenIds(root, "eos_token_id"));
  const bool llama_defaults = arch.llama_token_defaults;
  if (bos.has_value()) {
    c->bos_token_id = bos;
  } else if (llama_defaults && !root.contains("bos_token_id")) {
    c->bos_token_id = 1;
  }
  if (eos.has_value()) {
    c->eos_token_ids = *std::move(eos);
  } else if (llama_defaults && !root.contains("eos_token_id")) {
    c->eos_token_ids = {2};
  }
  return absl::OkStatus();
}

// transformers 5 writes "dtype", older versions "torch_dtype".
absl::Status ParseDtype(const json& root, ModelConfig* c) {
  for (absl::string_view key : {"dtype", "torch_dtype"}) {
    ASSIGN_OR_RETURN(std::optional<std::string> name, OptString(root, key));
    if (!name.has_value()) continue;
    absl::StatusOr<WeightDtype> dtype = ParseWeightDtype(*name);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config field '", key, "': ", dtype.status().message()));
    }
    c->dtype = *dtype;
    break;
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseRoot(const json& root) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json must hold a JSON object, got ", Show(root)));
  }
  // DeepSeek (multi-head latent attention) has its own fields: model_config_mla.cc.
  if (internal::IsDeepseekConfig(root)) return internal::ParseDeepseekConfig(root);
  ModelConfig c;
  ASSIGN_OR_RETURN(const ArchitectureInfo* arch, ParseArchitecture(root));
  c.architecture = std::string(arch->name);
  RETURN_IF_ERROR(ParseShape(root, *arch, &c));
  ASSIGN_OR_RETURN(std::optional<std::string> act, OptString(root, "hidden_act"));
  if (act.has_value() && *act != "silu") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported hidden_act '", *act, "' (supported: silu)"));
  }
  RETURN_IF_ERROR(ParseBiases(root, *arch, &c));
  RETURN_IF_ERROR(RejectNonFullAttention(root, *arch, c));
  RETURN_IF_ERROR(ParseRope(root, arch->rope_theta, &c));
  RETURN_IF_ERROR(internal::ParseFamilyFields(root, *arch, &c));
  RETURN_IF_ERROR(ParseSpecialTokens(root, *arch, &c));
  RETURN_IF_ERROR(ParseDtype(root, &c));
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t max) {
  if (value <= 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be in [1, ", max, "], got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckPositiveFinite(absl::string_view field, double value) {
  if (!(value > 0.0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a positive finite number, got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckTokenId(absl::string_view field, int32_t id, int64_t vocab_size) {
  if (id < 0 || id >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return text.str();
}

absl::StatusOr<json> ParseJsonText(absl::string_view text, absl::string_view what) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  }
  return root;
}

}  // namespace

absl::string_view WeightDtypeName(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kF32:
      return "float32";
    case WeightDtype::kF16:
      return "float16";
    case WeightDtype::kBF16:
      return "bfloat16";
  }
  return "unknown";
}

absl::StatusOr<WeightDtype> ParseWeightDtype(absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  absl::string_view bare = lower;
  absl::ConsumePrefix(&bare, "torch.");
  if (bare == "float32" || bare == "float" || bare == "fp32") return WeightDtype::kF32;
  if (bare == "float16" || bare == "half" || bare == "fp16") return WeightDtype::kF16;
  if (bare == "bfloat16" || bare == "bf16") return WeightDtype::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype '", name, "' (supported: float32, bfloat16, float16)"));
}

int64_t ModelConfig::NumParameters() const {
  if (IsMla()) return internal::MlaNumParameters(*this);
  const int64_t q = num_attention_heads * head_dim;
  const int64_t kv = num_key_value_heads * head_dim;
  const int64_t h = hidden_size;
  const int64_t i = intermediate_size;
  int64_t per_layer = 2 * h + (q + 2 * kv) * h + q * h;
  if (qkv_bias) per_layer += q + 2 * kv;
  if (o_bias) per_layer += h;
  if (qk_norm) per_layer += 2 * head_dim;
  int64_t mlps = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    if (!IsMoeLayer(l)) {
      mlps += 3 * i * h + (mlp_bias ? 2 * i + h : 0);
      continue;
    }
    mlps += num_experts * h + num_experts * 3 * moe_intermediate_size * h;
    if (shared_expert_intermediate_size > 0) mlps += 3 * shared_expert_intermediate_size * h + h;
  }
  const int64_t embedding = vocab_size * h;
  return embedding + num_hidden_layers * per_layer + mlps + h +
         (tie_word_embeddings ? 0 : embedding);
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  if (c.IsMla()) return internal::ValidateMlaConfig(c);
  const ArchitectureInfo* arch = internal::FindArchitecture(c.architecture);
  if (arch == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported architecture '", c.architecture,
                     "' (supported: ", internal::SupportedArchitectures(), ")"));
  }
  RETURN_IF_ERROR(internal::ValidateMoeConfig(c));
  RETURN_IF_ERROR(CheckRange("vocab_size", c.vocab_size, kMaxDim));
  RETURN_IF_ERROR(CheckRange("hidden_size", c.hidden_size, kMaxDim));
  RETURN_IF_ERROR(CheckRange("intermediate_size", c.intermediate_size, kMaxDim));
  RETURN_IF_ERROR(CheckRange("num_hidden_layers", c.num_hidden_layers, kMaxLayers));
  RETURN_IF_ERROR(CheckRange("num_attention_heads", c.num_attention_heads, kMaxDim));
  RETURN_IF_ERROR(CheckRange("num_key_value_heads", c.num_key_value_heads, kMaxDim));
  RETURN_IF_ERROR(CheckRange("head_dim", c.head_dim, kMaxDim));
  RETURN_IF_ERROR(CheckRange("max_position_embeddings", c.max_position_embeddings,
                             std::numeric_limits<int32_t>::max()));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads (", c.num_attention_heads,
                                                   ") must be a multiple of num_key_value_heads (",
                                                   c.num_key_value_heads, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim must be even for rotary embeddings, got ", c.head_dim));
  }
  // Checked in floating point first so that NumParameters() cannot overflow.
  const double h = static_cast<double>(c.hidden_size);
  const double width = static_cast<double>(c.num_attention_heads + c.num_key_value_heads) *
                       static_cast<double>(c.head_dim);
  const double approx = 2.0 * static_cast<double>(c.vocab_size) * h +
                        static_cast<double>(c.num_hidden_layers) *
                            (2.0 * width * h + 3.0 * static_cast<double>(c.intermediate_size) * h +
                             2.0 * width + 3.0 * static_cast<double>(c.intermediate_size) + 3 * h +
                             static_cast<double>(c.num_experts) * h *
                                 (1.0 + 3.0 * static_cast<double>(c.moe_intermediate_size)) +
                             3.0 * static_cast<double>(c.shared_expert_intermediate_size) * h);
  if (approx > kMaxParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("model too large: about ", approx, " parameters"));
  }
  RETURN_IF_ERROR(CheckPositiveFinite("rms_norm_eps", c.rms_norm_eps));
  RETURN_IF_ERROR(CheckPositiveFinite("rope_theta", c.rope_theta));
  const kernels::RopeScaling& rope = c.rope_scaling;
  if (rope.type != RopeType::kDefault) {
    RETURN_IF_ERROR(CheckPositiveFinite("rope factor", rope.factor));
  }
  if (rope.type == RopeType::kLlama3) {
    RETURN_IF_ERROR(CheckPositiveFinite("rope low_freq_factor", rope.low_freq_factor));
    RETURN_IF_ERROR(CheckPositiveFinite("rope high_freq_factor", rope.high_freq_factor));
    if (!(rope.high_freq_factor > rope.low_freq_factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope high_freq_factor (", rope.high_freq_factor,
                       ") must exceed low_freq_factor (", rope.low_freq_factor, ")"));
    }
    RETURN_IF_ERROR(CheckRange("rope original_max_position_embeddings",
                               rope.original_max_position_embeddings,
                               std::numeric_limits<int32_t>::max()));
  }
  RETURN_IF_ERROR(internal::CheckFamilyFlags(c, *arch));
  for (int32_t id : c.eos_token_ids) {
    RETURN_IF_ERROR(CheckTokenId("eos_token_id", id, c.vocab_size));
  }
  if (c.bos_token_id.has_value()) {
    RETURN_IF_ERROR(CheckTokenId("bos_token_id", *c.bos_token_id, c.vocab_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view config_json) {
  ASSIGN_OR_RETURN(json root, ParseJsonText(config_json, "config.json"));
  ASSIGN_OR_RETURN(ModelConfig config, ParseRoot(root));
  RETURN_IF_ERROR(internal::ParseQuantizationConfig(root, &config));  // model_config_quant.cc
  return config;
}

namespace {

// `dir`/hf_quant_config.json, when present (TensorRT Model Optimizer's export; older ones write
// no quantization_config into config.json): internal::ParseHfQuantConfig, errors naming the file.
absl::Status ReadHfQuantConfig(const std::string& dir, ModelConfig* config) {
  const std::string path = (std::filesystem::path(dir) / "hf_quant_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(json hf, ParseJsonText(text, "hf_quant_config.json"));
    return internal::ParseHfQuantConfig(hf, config);
  }();
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

}  // namespace

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  namespace fs = std::filesystem;
  // A directory, or the config file itself (`--dummy_config=DIR/config.json`): then the
  // generation config next to it belongs to the same model only when the file is the
  // directory's config.json.
  std::error_code file_ec;
  const bool is_file = fs::is_regular_file(model_dir, file_ec);
  const fs::path config_file = is_file ? fs::path(model_dir) : fs::path(model_dir) / "config.json";
  const std::string config_path = config_file.string();
  ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
  absl::StatusOr<ModelConfig> parsed = ParseModelConfig(text);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(config_path, ": ", parsed.status().message()));
  }
  ModelConfig config = *std::move(parsed);

  if (is_file && config_file.filename() != "config.json") return config;
  RETURN_IF_ERROR(ReadHfQuantConfig(config_file.parent_path().string(), &config));
  const std::string generation_path =
      (config_file.parent_path() / "generation_config.json").string();
  std::error_code ec;
  if (!fs::exists(generation_path, ec)) return config;
  ASSIGN_OR_RETURN(std::string generation_text, ReadFile(generation_path));
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(json generation, ParseJsonText(generation_text, "generation_config.json"));
    if (!generation.is_object()) {
      return absl::InvalidArgumentError("generation_config.json must hold a JSON object");
    }
    ASSIGN_OR_RETURN(std::optional<std::vector<int32_t>> eos, TokenIds(generation, "eos_token_id"));
    if (eos.has_value()) {
      std::vector<int32_t> merged = *eos;
      for (int32_t id : config.eos_token_ids) {
        if (std::find(merged.begin(), merged.end(), id) == merged.end()) merged.push_back(id);
      }
      config.eos_token_ids = std::move(merged);
    }
    ASSIGN_OR_RETURN(std::optional<int32_t> bos, OptTokenId(generation, "bos_token_id"));
    if (!config.bos_token_id.has_value()) config.bos_token_id = bos;
    return ValidateModelConfig(config);
  }();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(generation_path, ": ", status.message()));
  }
  return config;
}

}  // namespace tandem::runtime
