// quantization_config of config.json: the FP8 checkpoint formats users have (issue 38).
#include "runtime/model/model_config_quant.h"

#include <cstdint>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tandem::runtime {

using kernels::Fp8ActivationScheme;
using Method = WeightQuantization::Method;

std::string WeightQuantization::Describe() const {
  if (!IsFp8()) return "none";
  std::string weights = "per-tensor";
  if (block_rows == 1 && block_cols == 0) weights = "per-channel";
  if (block_rows > 1 || block_cols > 0) {
    weights = absl::StrCat(block_rows, "x", block_cols, " block");
  }
  const char* method_name = method == Method::kFp8Block            ? "fp8 (block)"
                            : method == Method::kCompressedTensors ? "compressed-tensors"
                            : method == Method::kModelOpt          ? "modelopt"
                                                                   : "online";
  const char* act = activation == Fp8ActivationScheme::kNone           ? "16-bit activations"
                    : activation == Fp8ActivationScheme::kStaticTensor ? "static per-tensor"
                    : activation == Fp8ActivationScheme::kDynamicToken ? "dynamic per-token"
                                                                       : "dynamic 1x128-group";
  return absl::StrCat("fp8 ", method_name, ": ", weights, " weight scales, ", act,
                      activation == Fp8ActivationScheme::kNone ? "" : " activations",
                      kv_cache_fp8 ? "; FP8 KV scales (unused)" : "",
                      lm_head ? "; lm_head FP8 (per-channel)" : "");
}

namespace {

// e4m3 codes and fp32 scales of an [n, k] FP8 projection on the device: a scale per row and
// 128-column block (per-tensor / per-channel: per row), and for 128 x 128 blocks cuBLASLt's
// copy of them (padded).
int64_t Fp8ProjectionBytes(const WeightQuantization& q, int64_t n, int64_t k) {
  const int64_t groups = q.block_cols > 0 ? (k + 127) / 128 : 1;
  const int64_t blocks = q.block_rows > 1 ? (n + 127) / 128 * (groups + 4) : 0;
  return n * k + 4 * (n * groups + blocks);
}

}  // namespace

int64_t ModelConfig::DeviceWeightBytes() const {
  const int64_t bytes16 = 2 * NumParameters();
  if (!quantization.IsFp8() || IsMla()) return bytes16;
  const int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  const int64_t h = hidden_size, i = intermediate_size;
  int64_t saved = 0;
  const auto fp8 = [&](int64_t n, int64_t k) {
    saved += 2 * n * k - Fp8ProjectionBytes(quantization, n, k);
  };
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    fp8(q + 2 * kv, h);
    fp8(h, q);
    if (IsMoeLayer(l)) continue;
    fp8(2 * i, h);
    fp8(h, i);
  }
  if (quantization.lm_head) {  // a scale a row; a tied head's copy adds to the embedding's bytes
    const int64_t head = vocab_size * h + 4 * vocab_size;
    saved += tie_word_embeddings ? -head : 2 * vocab_size * h - head;
  }
  return bytes16 - saved;
}

namespace internal {
namespace {

using json = nlohmann::json;

constexpr char kSupported[] =
    "supported: \"fp8\" with weight_block_size [128, 128], \"compressed-tensors\" float 8-bit "
    "(tensor / channel / block weights), \"modelopt\" FP8 / FP8_PER_CHANNEL_PER_TOKEN / "
    "FP8_PB_WO; KV scales of 8-bit float per tensor";

absl::Status Refuse(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("quantization_config: ", what, " (", kSupported, ")"));
}

std::string Show(const json& j) {
  std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

// `key` of `object` as a string, "" when absent or null.
std::string Str(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// `key` of `object` is the boolean true (absent, false or another type: false; never throws, as
// nlohmann's value() would on "dynamic": "local").
bool IsTrue(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

// `key` of `object` as an integer, `otherwise` when absent or not an integer.
int64_t IntOr(const json& object, const char* key, int64_t otherwise) {
  auto it = object.find(key);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : otherwise;
}

// The modules a checkpoint leaves 16-bit, kept for the loader (WeightQuantization::ignore): it
// refuses an entry that names a projection it reads as e4m3 (weight_fp8.cc), since partly FP8
// decoders are not supported; lm_head and MoE router gates (what llm-compressor ignores) are
// 16-bit in every format.
absl::Status ParseIgnoreList(const json& object, const char* key, WeightQuantization* q) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return Refuse(absl::StrCat(key, " must be a list, got ", Show(*it)));
  for (const json& entry : *it) {
    if (!entry.is_string() || entry.get<std::string>().empty()) {
      return Refuse(
          absl::StrCat(key, " entry ", Show(entry), " is not a module name or \"re:\" ", "regex"));
    }
    const std::string name = entry.get<std::string>();
    if (name.rfind("re:", 0) == 0) {
      try {
        std::regex check(name.substr(3));
      } catch (const std::regex_error&) {
        return Refuse(absl::StrCat(key, " entry '", name, "' is not a valid regex"));
      }
    }
    q->ignore.push_back(name);
  }
  return absl::OkStatus();
}

absl::Status ParseBlockSize(const json& value, const char* where, WeightQuantization* q) {
  if (!value.is_array() || value.size() != 2 || !value[0].is_number_integer() ||
      !value[1].is_number_integer() || value[0].get<int64_t>() != 128 ||
      value[1].get<int64_t>() != 128) {
    return Refuse(absl::StrCat(where, " ", Show(value), " (only [128, 128] blocks)"));
  }
  q->block_rows = 128;
  q->block_cols = 128;
  return absl::OkStatus();
}

absl::Status ParseFp8Block(const json& qc, WeightQuantization* q) {
  q->method = Method::kFp8Block;
  const std::string fmt = Str(qc, "fmt");
  if (!fmt.empty() && fmt != "e4m3") return Refuse(absl::StrCat("fp8 fmt '", fmt, "' (e4m3 only)"));
  auto block = qc.find("weight_block_size");
  if (block == qc.end() || block->is_null()) {
    return Refuse("fp8 without weight_block_size (per-tensor \"fp8\" checkpoints: not supported)");
  }
  RETURN_IF_ERROR(ParseBlockSize(*block, "fp8 weight_block_size", q));
  const std::string scheme = Str(qc, "activation_scheme");
  if (!scheme.empty() && scheme != "dynamic") {
    return Refuse(absl::StrCat("fp8 activation_scheme '", scheme, "' (dynamic only)"));
  }
  q->activation = Fp8ActivationScheme::kDynamicGroup128;
  return ParseIgnoreList(qc, "modules_to_not_convert", q);
}

absl::Status IsFloat8(const json& args, const char* what) {
  auto bits = args.find("num_bits");
  if (Str(args, "type") != "float" || bits == args.end() || !bits->is_number_integer() ||
      bits->get<int>() != 8) {
    return Refuse(
        absl::StrCat("compressed-tensors ", what, " ", Show(args), " (8-bit float only)"));
  }
  return absl::OkStatus();
}

// A kv_cache_scheme (compressed-tensors; modelopt's config.json form): null, or 8-bit float
// with static per-tensor scales (llm-compressor's and modelopt's FP8 KV), which sets
// kv_cache_fp8.
absl::Status ParseKvCacheScheme(const json& scheme, const char* who, WeightQuantization* q) {
  if (scheme.is_null()) return absl::OkStatus();
  const bool fp8_tensor = scheme.is_object() && Str(scheme, "type") == "float" &&
                          IntOr(scheme, "num_bits", 0) == 8 && !IsTrue(scheme, "dynamic") &&
                          (!scheme.contains("strategy") || Str(scheme, "strategy") == "tensor");
  if (!fp8_tensor) {
    return Refuse(absl::StrCat(who, " kv_cache_scheme ", Show(scheme),
                               " (8-bit float with static per-tensor scales only)"));
  }
  q->kv_cache_fp8 = true;
  return absl::OkStatus();
}

absl::Status ParseCompressedTensors(const json& qc, WeightQuantization* q) {
  q->method = Method::kCompressedTensors;
  const std::string format = Str(qc, "format");
  if (format != "float-quantized" && format != "naive-quantized") {
    return Refuse(absl::StrCat("compressed-tensors format '", format,
                               "' (float-quantized or naive-quantized only)"));
  }
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->size() != 1) {
    return Refuse("compressed-tensors needs exactly one entry in config_groups");
  }
  const json& group = groups->begin().value();
  auto targets = group.find("targets");
  if (targets == group.end() || *targets != json::array({"Linear"})) {
    return Refuse(absl::StrCat("compressed-tensors targets ",
                               targets == group.end() ? "missing" : Show(*targets),
                               " (only [\"Linear\"])"));
  }
  auto weights = group.find("weights");
  if (weights == group.end() || !weights->is_object()) {
    return Refuse("compressed-tensors group without weights");
  }
  RETURN_IF_ERROR(IsFloat8(*weights, "weights"));
  const std::string strategy = Str(*weights, "strategy");
  if (IsTrue(*weights, "dynamic")) {
    return Refuse("compressed-tensors dynamic weights");
  }
  if (strategy == "tensor") {
    q->block_rows = 0;
  } else if (strategy == "channel") {
    q->block_rows = 1;
  } else if (strategy == "block") {
    RETURN_IF_ERROR(ParseBlockSize(weights->value("block_structure", json()),
                                   "compressed-tensors block_structure", q));
  } else {
    return Refuse(absl::StrCat("compressed-tensors weight strategy '", strategy,
                               "' (tensor, channel or block)"));
  }
  auto input = group.find("input_activations");
  if (input == group.end() || input->is_null()) {
    q->activation = Fp8ActivationScheme::kNone;
  } else {
    RETURN_IF_ERROR(IsFloat8(*input, "input_activations"));
    const std::string act = Str(*input, "strategy");
    const bool dynamic = IsTrue(*input, "dynamic");
    if (act == "token" && dynamic) {
      q->activation = Fp8ActivationScheme::kDynamicToken;
    } else if (act == "tensor" && !dynamic) {
      q->activation = Fp8ActivationScheme::kStaticTensor;
    } else if (act == "group" && dynamic && IntOr(*input, "group_size", 0) == 128) {
      q->activation = Fp8ActivationScheme::kDynamicGroup128;
    } else {
      return Refuse(absl::StrCat("compressed-tensors input_activations ", Show(*input),
                                 " (dynamic token, static tensor or dynamic group of 128)"));
    }
  }
  if (group.contains("output_activations") && !group["output_activations"].is_null()) {
    return Refuse("compressed-tensors output_activations");
  }
  auto kv = qc.find("kv_cache_scheme");
  if (kv != qc.end()) RETURN_IF_ERROR(ParseKvCacheScheme(*kv, "compressed-tensors", q));
  return ParseIgnoreList(qc, "ignore", q);
}

// An fnmatch pattern of modelopt's exclude_modules ("model.layers.*.mlp.gate") as the whole-name
// "re:" regex WeightQuantization::ignore holds; other entries unchanged. `*` and `?` are the
// wildcards; every other character matches itself.
std::string WildcardAsRegex(const std::string& entry) {
  if (entry.rfind("re:", 0) == 0 || entry.find_first_of("*?") == std::string::npos) return entry;
  std::string re = "re:";
  for (char c : entry) {
    if (c == '*') {
      re += ".*";
    } else if (c == '?') {
      re += '.';
    } else {
      if (std::string_view("\\^$.|+()[]{}").find(c) != std::string_view::npos) re += '\\';
      re += c;
    }
  }
  return re + "$";
}

absl::Status ParseModelOpt(const json& qc, WeightQuantization* q) {
  q->method = Method::kModelOpt;
  // hf_quant_config.json nests the fields under "quantization"; config.json writes them flat.
  const json& fields =
      qc.contains("quantization") && qc["quantization"].is_object() ? qc["quantization"] : qc;
  const std::string algo = absl::AsciiStrToUpper(Str(fields, "quant_algo"));
  if (algo == "FP8") {  // per-tensor weight scales, static per-tensor input scales
    q->block_rows = 0;
    q->activation = Fp8ActivationScheme::kStaticTensor;
  } else if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    q->block_rows = 1;
    q->activation = Fp8ActivationScheme::kDynamicToken;
  } else if (algo == "FP8_PB_WO") {
    // Per-block weight-only: vLLM runs it with dynamic 1 x 128 activation groups (a W8A8 block
    // GEMM), and so does this runtime (its batch-1 GEMV keeps the activations 16-bit).
    q->block_rows = 128;
    q->block_cols = 128;
    q->activation = Fp8ActivationScheme::kDynamicGroup128;
  } else {
    return Refuse(absl::StrCat("modelopt quant_algo '", Str(fields, "quant_algo"),
                               "' (FP8, FP8_PER_CHANNEL_PER_TOKEN or FP8_PB_WO)"));
  }
  auto kv = fields.find("kv_cache_quant_algo");
  if (kv != fields.end() && !kv->is_null()) {
    if (!kv->is_string() || absl::AsciiStrToUpper(kv->get<std::string>()) != "FP8") {
      return Refuse(absl::StrCat("modelopt kv_cache_quant_algo ", Show(*kv), " (FP8 only)"));
    }
    q->kv_cache_fp8 = true;
  }
  auto scheme = fields.find("kv_cache_scheme");  // config.json's form of the same
  if (scheme != fields.end()) RETURN_IF_ERROR(ParseKvCacheScheme(*scheme, "modelopt", q));
  RETURN_IF_ERROR(ParseIgnoreList(
      fields, fields.contains("exclude_modules") ? "exclude_modules" : "ignore", q));
  for (std::string& entry : q->ignore) entry = WildcardAsRegex(entry);
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseQuantizationConfig(const json& root, ModelConfig* config) {
  auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return Refuse(absl::StrCat("must be an object, got ", Show(*it)));
  const std::string method = Str(*it, "quant_method");
  WeightQuantization q;
  if (method == "fp8") {
    RETURN_IF_ERROR(ParseFp8Block(*it, &q));
  } else if (method == "compressed-tensors") {
    RETURN_IF_ERROR(ParseCompressedTensors(*it, &q));
  } else if (method == "modelopt") {
    RETURN_IF_ERROR(ParseModelOpt(*it, &q));
  } else {
    return Refuse(absl::StrCat("unsupported quant_method '", method, "'"));
  }
  // Every architecture the parser accepts has an FP8 path on the CPU backend (dense, MoE
  // experts, MLA projections; weight_fp8.cc) and on the CUDA backend from checkpoint weights (the
  // loader holds every block-scaled format, "fp8" and compressed-tensors "block" alike, as
  // per-row scales over 128-column groups; runtime/engine/backend_factory.cc says what CUDA
  // refuses: device dummy FP8 experts, fp16 activations).
  config->quantization = q;
  return absl::OkStatus();
}

absl::Status ParseHfQuantConfig(const json& hf, ModelConfig* config) {
  if (config->quantization.IsFp8()) return absl::OkStatus();  // config.json's own wins
  if (!hf.is_object() || !hf.contains("quantization") || !hf["quantization"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hf_quant_config.json: needs a \"quantization\" object (TensorRT Model Optimizer's "
        "export), got ",
        Show(hf)));
  }
  auto producer = hf.find("producer");
  if (producer != hf.end() && producer->is_object() && producer->contains("name") &&
      Str(*producer, "name") != "modelopt") {
    return absl::InvalidArgumentError(
        absl::StrCat("hf_quant_config.json: producer ", Show(*producer), " (modelopt only)"));
  }
  json qc = hf;
  qc["quant_method"] = "modelopt";
  return ParseQuantizationConfig(json{{"quantization_config", std::move(qc)}}, config);
}

}  // namespace internal
}  // namespace tandem::runtime
