// DeepSeek-V2/V3 config.json (model_config_mla.h), following transformers 5.17's
// DeepseekV2Config / DeepseekV3Config and modeling_rope_utils' yarn parameters.
#include "runtime/model/model_config_mla.h"

#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/model/model_config_family.h"

namespace tandem::runtime::internal {
namespace {

using json = nlohmann::json;
using kernels::RopeType;

constexpr int64_t kMaxDim = int64_t{1} << 24;

// Defaults of one DeepSeek config class.
struct DeepseekDefaults {
  const char* architecture;
  const char* model_type;
  bool v3;
  int64_t vocab, hidden, intermediate, layers, heads, max_positions, first_k_dense, experts;
  int32_t bos, eos;
};
constexpr DeepseekDefaults kV2{
    "DeepseekV2ForCausalLM", "deepseek_v2", false, 102400, 4096, 11008, 32, 32, 2048, 0, 64, 1, 2};
constexpr DeepseekDefaults kV3{
    "DeepseekV3ForCausalLM", "deepseek_v3", true, 129280, 7168, 18432, 61, 128, 4096, 3, 256, 0, 1};

std::string Name(const json& root) {
  if (auto it = root.find("architectures");
      it != root.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    return (*it)[0].get<std::string>();
  }
  if (auto it = root.find("model_type"); it != root.end() && it->is_string()) {
    return it->get<std::string>();
  }
  return "";
}

const json* Field(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

absl::Status TypeError(const std::string& key, const char* expected, const json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field '", key, "' must be ", expected, ", got ", got.dump()));
}

// Integers may be written as 8192 or 8192.0.
absl::StatusOr<int64_t> Int(const json& object, const char* key, int64_t fallback,
                            const std::string& where = "") {
  const json* v = Field(object, key);
  if (v == nullptr) return fallback;
  if (v->is_number_integer() || v->is_number_unsigned()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return TypeError(where + key, "an integer", *v);
}

absl::StatusOr<double> Double(const json& object, const char* key, double fallback,
                              const std::string& where = "") {
  const json* v = Field(object, key);
  if (v == nullptr) return fallback;
  if (!v->is_number()) return TypeError(where + key, "a number", *v);
  return v->get<double>();
}

absl::StatusOr<bool> Bool(const json& object, const char* key, bool fallback) {
  const json* v = Field(object, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return TypeError(key, "true or false", *v);
  return v->get<bool>();
}

absl::StatusOr<std::vector<int32_t>> TokenIds(const json& v, const char* key) {
  std::vector<int32_t> ids;
  for (const json& e : v.is_array() ? v : json::array({v})) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
        e.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return TypeError(key, "a non-negative token id", e);
    }
    ids.push_back(e.get<int32_t>());
  }
  return ids;
}

// rope_scaling (transformers 4) or rope_parameters (5): default or yarn.
absl::Status ParseDeepseekRope(const json& root, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->rope_theta, Double(root, "rope_theta", 10000.0));
  c->rope_scaling = kernels::RopeScaling();
  const json* rope = nullptr;
  std::string where;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* v = Field(root, key);
    if (v == nullptr) continue;
    if (!v->is_object()) return TypeError(key, "an object or null", *v);
    if (v->empty()) continue;
    rope = v;
    where = absl::StrCat(key, ".");
    break;
  }
  if (rope == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(c->rope_theta, Double(*rope, "rope_theta", c->rope_theta, where));
  ASSIGN_OR_RETURN(double partial, Double(*rope, "partial_rotary_factor", 1.0, where));
  if (partial != 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported ", where, "partial_rotary_factor ", partial));
  }
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (const json* v = Field(*rope, key); v != nullptr) {
      if (!v->is_string()) return TypeError(where + key, "a string", *v);
      type = v->get<std::string>();
      break;
    }
  }
  if (type == "default") return absl::OkStatus();
  if (type != "yarn") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported rope type '", type, "' in ", where,
                                                   " for DeepSeek (supported: default, yarn)"));
  }
  kernels::RopeScaling& s = c->rope_scaling;
  s.type = RopeType::kYarn;
  if (Field(*rope, "factor") == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": rope type 'yarn' requires 'factor'"));
  }
  ASSIGN_OR_RETURN(s.factor, Double(*rope, "factor", 1.0, where));
  ASSIGN_OR_RETURN(
      s.original_max_position_embeddings,
      Int(*rope, "original_max_position_embeddings", c->max_position_embeddings, where));
  // transformers: `get("beta_fast") or 32` (a 0 falls back too).
  ASSIGN_OR_RETURN(s.beta_fast, Double(*rope, "beta_fast", 32.0, where));
  if (s.beta_fast == 0.0) s.beta_fast = 32.0;
  ASSIGN_OR_RETURN(s.beta_slow, Double(*rope, "beta_slow", 1.0, where));
  if (s.beta_slow == 0.0) s.beta_slow = 1.0;
  ASSIGN_OR_RETURN(s.mscale, Double(*rope, "mscale", 0.0, where));
  ASSIGN_OR_RETURN(s.mscale_all_dim, Double(*rope, "mscale_all_dim", 0.0, where));
  ASSIGN_OR_RETURN(s.attention_factor, Double(*rope, "attention_factor", 0.0, where));
  if (const json* t = Field(*rope, "truncate"); t != nullptr) {
    if (!t->is_boolean()) return TypeError(where + "truncate", "true or false", *t);
    s.truncate = t->get<bool>();
  }
  return absl::OkStatus();
}

absl::Status ParseGeneric(const json& root, const DeepseekDefaults& d, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->vocab_size, Int(root, "vocab_size", d.vocab));
  ASSIGN_OR_RETURN(c->hidden_size, Int(root, "hidden_size", d.hidden));
  ASSIGN_OR_RETURN(c->intermediate_size, Int(root, "intermediate_size", d.intermediate));
  ASSIGN_OR_RETURN(c->num_hidden_layers, Int(root, "num_hidden_layers", d.layers));
  ASSIGN_OR_RETURN(c->num_attention_heads, Int(root, "num_attention_heads", d.heads));
  ASSIGN_OR_RETURN(c->num_key_value_heads,
                   Int(root, "num_key_value_heads", c->num_attention_heads));
  ASSIGN_OR_RETURN(c->max_position_embeddings,
                   Int(root, "max_position_embeddings", d.max_positions));
  ASSIGN_OR_RETURN(c->rms_norm_eps, Double(root, "rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c->tie_word_embeddings, Bool(root, "tie_word_embeddings", false));
  if (const json* act = Field(root, "hidden_act"); act != nullptr && *act != "silu") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported hidden_act ", act->dump(), " (supported: silu)"));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    ASSIGN_OR_RETURN(bool bias, Bool(root, key, false));
    if (bias) {
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported ", key, ": true for ", d.architecture));
    }
  }
  c->bos_token_id = d.bos;
  if (root.contains("bos_token_id")) c->bos_token_id.reset();
  if (const json* v = Field(root, "bos_token_id"); v != nullptr) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, TokenIds(*v, "bos_token_id"));
    c->bos_token_id = ids.front();
  }
  c->eos_token_ids = {d.eos};
  if (root.contains("eos_token_id")) c->eos_token_ids.clear();
  if (const json* v = Field(root, "eos_token_id"); v != nullptr) {
    ASSIGN_OR_RETURN(c->eos_token_ids, TokenIds(*v, "eos_token_id"));
  }
  for (const char* key : {"dtype", "torch_dtype"}) {
    const json* v = Field(root, key);
    if (v == nullptr) continue;
    if (!v->is_string()) return TypeError(key, "a string", *v);
    ASSIGN_OR_RETURN(c->dtype, ParseWeightDtype(v->get<std::string>()));
    break;
  }
  return absl::OkStatus();
}

absl::Status CheckRange(const char* field, int64_t value, int64_t max) {
  if (value <= 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be in [1, ", max, "], got ", value));
  }
  return absl::OkStatus();
}

// The MoE fields of DeepseekV2Config / DeepseekV3Config (ModelConfig::MoeRouter): layers from
// first_k_dense_replace on are sparse (transformers ignores moe_layer_freq: only 1 is taken).
absl::Status ParseDeepseekMoe(const json& root, const DeepseekDefaults& d, ModelConfig* c) {
  ASSIGN_OR_RETURN(int64_t experts, Int(root, "n_routed_experts", d.experts));
  ASSIGN_OR_RETURN(int64_t freq, Int(root, "moe_layer_freq", 1));
  if (experts > 0 && freq != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported moe_layer_freq ", freq, " (transformers' DeepSeek models ignore it; 1 only)"));
  }
  if (experts <= 0 || c->first_k_dense_replace >= c->num_hidden_layers) return absl::OkStatus();
  c->num_experts = experts;
  ASSIGN_OR_RETURN(c->num_experts_per_tok, Int(root, "num_experts_per_tok", d.v3 ? 8 : 0));
  ASSIGN_OR_RETURN(c->moe_intermediate_size,
                   Int(root, "moe_intermediate_size", d.v3 ? 2048 : 1407));
  // n_shared_experts null: no shared experts (V2 builds them only when it is not None).
  const bool shared_null = root.contains("n_shared_experts") && root["n_shared_experts"].is_null();
  ASSIGN_OR_RETURN(int64_t shared, Int(root, "n_shared_experts", d.v3 ? 1 : 2));
  c->shared_expert_intermediate_size = shared_null ? 0 : shared * c->moe_intermediate_size;
  c->mlp_only_layers.clear();
  for (int64_t l = 0; l < c->first_k_dense_replace; ++l) c->mlp_only_layers.push_back(l);
  c->decoder_sparse_step = 1;
  ASSIGN_OR_RETURN(c->routed_scaling_factor,
                   Double(root, "routed_scaling_factor", d.v3 ? 2.5 : 1.0));
  bool grouped = true;
  if (d.v3) {  // DeepseekV3TopkRouter: noaux_tc whatever topk_method says
    c->moe_router = ModelConfig::MoeRouter::kDeepseekV3;
    ASSIGN_OR_RETURN(c->norm_topk_prob, Bool(root, "norm_topk_prob", true));
  } else {  // V2 ignores norm_topk_prob
    c->moe_router = ModelConfig::MoeRouter::kDeepseekV2;
    c->norm_topk_prob = false;
    const json* method = Field(root, "topk_method");
    const std::string name =
        method != nullptr && method->is_string() ? method->get<std::string>() : "greedy";
    if (name != "greedy" && name != "group_limited_greedy") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported topk_method '", name, "' (DeepseekV2: greedy, group_limited_greedy)"));
    }
    grouped = name == "group_limited_greedy";
  }
  if (grouped) {
    ASSIGN_OR_RETURN(c->num_expert_groups, Int(root, "n_group", d.v3 ? 8 : 1));
    ASSIGN_OR_RETURN(c->topk_expert_groups, Int(root, "topk_group", d.v3 ? 4 : 1));
  }
  if (c->num_expert_groups < 1 || c->num_experts % c->num_expert_groups != 0 ||
      c->topk_expert_groups < 1 || c->topk_expert_groups > c->num_expert_groups) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n_group (", c->num_expert_groups, ") must divide n_routed_experts (", c->num_experts,
        ") and topk_group (", c->topk_expert_groups, ") be in [1, n_group]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> DeepseekPreset(absl::string_view name) {
  // The published config.json files (the fields that differ from the class defaults).
  constexpr char kV2Lite[] = R"({"architectures": ["DeepseekV2ForCausalLM"],
      "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
      "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512,
      "max_position_embeddings": 163840, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
      "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
      "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
      "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128,
      "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000,
      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                       "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                       "type": "yarn"},
      "routed_scaling_factor": 1.0, "topk_group": 1, "topk_method": "greedy",
      "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400})";
  constexpr char kV3FourLayers[] = R"({"architectures": ["DeepseekV3ForCausalLM"],
      "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3, "hidden_size": 7168,
      "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
      "moe_intermediate_size": 2048, "n_group": 8, "n_routed_experts": 256,
      "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
      "num_experts_per_tok": 8, "num_hidden_layers": 4, "num_key_value_heads": 128,
      "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "rms_norm_eps": 1e-06, "rope_theta": 10000,
      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                       "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                       "type": "yarn"},
      "routed_scaling_factor": 2.5, "topk_group": 4, "torch_dtype": "bfloat16",
      "v_head_dim": 128, "vocab_size": 129280})";
  constexpr char kTiny[] = R"({"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 256,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 4, "first_k_dense_replace": 2,
      "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
      "v_head_dim": 16, "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2,
      "torch_dtype": "float32"})";
  // DeepSeek-V3's quantization_config (its FP8 checkpoint: every projection of the decoder e4m3
  // with 128 x 128 block scales, the router, norms, embeddings and lm_head bf16; 1 x 128 dynamic
  // activations). The "-fp8" presets put it on V2-Lite's shape (which ships no FP8 checkpoint)
  // and V3's: dummy weights at load only (drawn in fp32 and quantized, QuantizeWeightsFp8; on CUDA
  // drawn on the device).
  constexpr char kFp8[] = R"({"activation_scheme": "dynamic", "fmt": "e4m3",
      "quant_method": "fp8", "weight_block_size": [128, 128]})";
  // deepseek-v2-lite-mtp: V2-Lite's shape with one MTP layer (a MoE layer, DeepSeek-V3's MTP
  // design; V2-Lite ships none) for --speculative_method=mtp at a real model's size.
  const bool mtp = name == "deepseek-v2-lite-mtp";
  const bool fp8 = absl::EndsWith(name, "-fp8");
  const absl::string_view base = fp8 ? name.substr(0, name.size() - 4) : name;
  const char* text = base == "deepseek-v2-lite" || mtp ? kV2Lite
                     : base == "deepseek-v3-4l"        ? kV3FourLayers
                     : base == "tiny-mla"              ? kTiny
                                                       : nullptr;
  if (text == nullptr) return absl::NotFoundError(absl::StrCat("no DeepSeek preset '", name, "'"));
  json root = json::parse(text);
  if (fp8) root["quantization_config"] = json::parse(kFp8);
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(root.dump()));
  if (mtp) config.num_nextn_predict_layers = 1;
  return config;
}

bool IsDeepseekConfig(const json& root) {
  const std::string name = Name(root);
  return absl::StartsWithIgnoreCase(name, "deepseek");
}

absl::StatusOr<ModelConfig> ParseDeepseekConfig(const json& root) {
  const std::string name = Name(root);
  const DeepseekDefaults* d = nullptr;
  for (const DeepseekDefaults* candidate : {&kV2, &kV3}) {
    if (name == candidate->architecture || name == candidate->model_type) d = candidate;
  }
  if (d == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported architecture '", name,
                     "' (DeepSeek: DeepseekV2ForCausalLM, DeepseekV3ForCausalLM are supported)"));
  }
  ModelConfig c;
  c.architecture = d->architecture;
  RETURN_IF_ERROR(ParseGeneric(root, *d, &c));
  ASSIGN_OR_RETURN(c.q_lora_rank, Int(root, "q_lora_rank", 1536));
  if (root.contains("q_lora_rank") && root["q_lora_rank"].is_null()) c.q_lora_rank = 0;
  ASSIGN_OR_RETURN(c.kv_lora_rank, Int(root, "kv_lora_rank", 512));
  ASSIGN_OR_RETURN(c.qk_nope_head_dim, Int(root, "qk_nope_head_dim", 128));
  ASSIGN_OR_RETURN(c.qk_rope_head_dim, Int(root, "qk_rope_head_dim", 64));
  ASSIGN_OR_RETURN(c.v_head_dim, Int(root, "v_head_dim", 128));
  c.head_dim = c.qk_rope_head_dim;  // as transformers sets it: the RoPE'd width
  // V2 rotates complex pairs always; V3 pairs when rope_interleave, else rotate-half.
  c.rope_interleave = true;
  if (d->v3) {
    ASSIGN_OR_RETURN(c.rope_interleave, Bool(root, "rope_interleave", true));
  }
  ASSIGN_OR_RETURN(c.first_k_dense_replace, Int(root, "first_k_dense_replace", d->first_k_dense));
  ASSIGN_OR_RETURN(c.num_nextn_predict_layers, Int(root, "num_nextn_predict_layers", 0));
  if (c.num_nextn_predict_layers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_nextn_predict_layers must be >= 0, got ", c.num_nextn_predict_layers));
  }
  RETURN_IF_ERROR(ParseDeepseekMoe(root, *d, &c));
  RETURN_IF_ERROR(ParseDeepseekRope(root, &c));
  RETURN_IF_ERROR(ValidateMlaConfig(c));
  return c;
}

absl::Status ValidateMlaConfig(const ModelConfig& c) {
  RETURN_IF_ERROR(ValidateMoeConfig(c));  // model_config_family.cc
  if (c.architecture != kV2.architecture && c.architecture != kV3.architecture) {
    return absl::InvalidArgumentError(absl::StrCat("MLA (kv_lora_rank ", c.kv_lora_rank,
                                                   ") needs a DeepSeek architecture, got '",
                                                   c.architecture, "'"));
  }
  const struct {
    const char* name;
    int64_t value;
  } sizes[] = {{"vocab_size", c.vocab_size},
               {"hidden_size", c.hidden_size},
               {"intermediate_size", c.intermediate_size},
               {"num_hidden_layers", c.num_hidden_layers},
               {"num_attention_heads", c.num_attention_heads},
               {"kv_lora_rank", c.kv_lora_rank},
               {"qk_nope_head_dim", c.qk_nope_head_dim},
               {"qk_rope_head_dim", c.qk_rope_head_dim},
               {"v_head_dim", c.v_head_dim},
               {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& s : sizes) RETURN_IF_ERROR(CheckRange(s.name, s.value, kMaxDim));
  if (c.q_lora_rank < 0 || c.q_lora_rank > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("q_lora_rank out of range: ", c.q_lora_rank));
  }
  if (c.qk_rope_head_dim % 2 != 0 || c.head_dim != c.qk_rope_head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("qk_rope_head_dim must be even and head_dim (",
                                                   c.head_dim, ") equal to it, got ",
                                                   c.qk_rope_head_dim));
  }
  if (c.num_key_value_heads != c.num_attention_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_key_value_heads (", c.num_key_value_heads, ") must equal num_attention_heads (",
        c.num_attention_heads, ") for MLA (every head reads the shared latent)"));
  }
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    return absl::InvalidArgumentError("rms_norm_eps and rope_theta must be positive");
  }
  const kernels::RopeScaling& r = c.rope_scaling;
  if (r.type != RopeType::kDefault && r.type != RopeType::kYarn) {
    return absl::InvalidArgumentError("DeepSeek RoPE must be default or yarn");
  }
  if (r.type == RopeType::kYarn &&
      (!(r.factor > 0) || !std::isfinite(r.factor) || r.original_max_position_embeddings <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("yarn needs factor > 0 and original_max_position_embeddings > 0, got ",
                     r.factor, ", ", r.original_max_position_embeddings));
  }
  for (int32_t id : c.eos_token_ids) {
    if (id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("eos_token_id ", id, " is outside the vocabulary"));
    }
  }
  if (c.bos_token_id.has_value() && *c.bos_token_id >= c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("bos_token_id ", *c.bos_token_id, " is outside the vocabulary"));
  }
  return absl::OkStatus();
}

int64_t MlaNumParameters(const ModelConfig& c) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim, lat = c.kv_lora_rank;
  const int64_t q = c.q_lora_rank > 0
                        ? h * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * heads * qk
                        : h * heads * qk;
  const int64_t attention = q + h * (lat + c.qk_rope_head_dim) + lat +
                            lat * heads * (c.qk_nope_head_dim + c.v_head_dim) +
                            heads * c.v_head_dim * h;
  int64_t mlps = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    mlps += !c.IsMoeLayer(l)
                ? 3 * h * c.intermediate_size
                : c.num_experts * h * (1 + 3 * c.moe_intermediate_size) +
                      3 * h * c.shared_expert_intermediate_size +
                      (c.moe_router == ModelConfig::MoeRouter::kDeepseekV3 ? c.num_experts : 0);
  }
  const int64_t per_layer = attention + 2 * h;
  const int64_t embedding = c.vocab_size * h;
  return embedding + c.num_hidden_layers * per_layer + mlps + h +
         (c.tie_word_embeddings ? 0 : embedding);
}

std::string MlaConfigToJson(const ModelConfig& c) {
  const bool v3 = c.architecture == kV3.architecture;
  json out;
  out["architectures"] = {c.architecture};
  out["model_type"] = v3 ? kV3.model_type : kV2.model_type;
  out["vocab_size"] = c.vocab_size;
  out["hidden_size"] = c.hidden_size;
  out["intermediate_size"] = c.intermediate_size;
  out["num_hidden_layers"] = c.num_hidden_layers;
  out["num_attention_heads"] = c.num_attention_heads;
  out["num_key_value_heads"] = c.num_key_value_heads;
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["rms_norm_eps"] = c.rms_norm_eps;
  out["hidden_act"] = "silu";
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  out["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
  out["kv_lora_rank"] = c.kv_lora_rank;
  out["qk_nope_head_dim"] = c.qk_nope_head_dim;
  out["qk_rope_head_dim"] = c.qk_rope_head_dim;
  out["v_head_dim"] = c.v_head_dim;
  if (v3) out["rope_interleave"] = c.rope_interleave;
  out["first_k_dense_replace"] = c.IsMoe() ? c.first_k_dense_replace : c.num_hidden_layers;
  if (c.num_nextn_predict_layers > 0) out["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  out["n_routed_experts"] = c.num_experts;
  if (c.IsMoe()) {
    out["num_experts_per_tok"] = c.num_experts_per_tok;
    out["moe_intermediate_size"] = c.moe_intermediate_size;
    out["n_shared_experts"] = c.shared_expert_intermediate_size / c.moe_intermediate_size;
    out["routed_scaling_factor"] = c.routed_scaling_factor;
    out["norm_topk_prob"] = c.norm_topk_prob;
    out["n_group"] = c.num_expert_groups;
    out["topk_group"] = c.topk_expert_groups;
    out["moe_layer_freq"] = 1;
    out["topk_method"] =
        v3 ? "noaux_tc" : (c.num_expert_groups > 1 ? "group_limited_greedy" : "greedy");
  }
  json rope = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  const kernels::RopeScaling& r = c.rope_scaling;
  if (r.type == RopeType::kYarn) {
    rope["rope_type"] = "yarn";
    rope["factor"] = r.factor;
    rope["original_max_position_embeddings"] = r.original_max_position_embeddings;
    rope["beta_fast"] = r.beta_fast;
    rope["beta_slow"] = r.beta_slow;
    if (r.mscale != 0) rope["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0) rope["mscale_all_dim"] = r.mscale_all_dim;
    if (r.attention_factor > 0) rope["attention_factor"] = r.attention_factor;
    rope["truncate"] = r.truncate;
  }
  out["rope_parameters"] = std::move(rope);
  if (c.bos_token_id.has_value()) out["bos_token_id"] = *c.bos_token_id;
  if (!c.eos_token_ids.empty()) out["eos_token_id"] = c.eos_token_ids;
  out["dtype"] = std::string(WeightDtypeName(c.dtype));
  return out.dump(2) + "\n";
}

}  // namespace tandem::runtime::internal
