#include "runtime/model/model_source.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {

namespace {

absl::StatusOr<LoadedModel> LoadUnquantized(const ModelSource& source);

// --quantize_lm_head's models: not MLA (their head stays 16-bit).
absl::Status CheckLmHeadModel(const ModelConfig& config) {
  if (!config.IsMla()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--quantize_lm_head: ", config.architecture,
      " (multi-head latent attention) keeps lm_head 16-bit; it is supported for Llama-family "
      "models"));
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(const ModelSource& source) {
  if (source.quantization.empty() || source.quantization == "none") {
    ASSIGN_OR_RETURN(LoadedModel out, LoadUnquantized(source));
    if (!source.quantize_lm_head) return out;
    // An FP8 checkpoint's head, quantized at load like the online one's.
    if (!out.config.quantization.FromCheckpoint()) {
      return absl::InvalidArgumentError(
          "--quantize_lm_head quantizes lm_head with FP8 weights: it needs --quantization=fp8 or "
          "an FP8 checkpoint");
    }
    RETURN_IF_ERROR(CheckLmHeadModel(out.config));
    out.config.quantization.lm_head = true;
    out.local_config.quantization.lm_head = true;
    if (!source.dummy_weights_on_backend) {
      RETURN_IF_ERROR(QuantizeLmHeadFp8(out.local_config, &out.weights));
    }
    out.model_id += ":lm_head_fp8";
    return out;
  }
  if (source.quantization != "fp8") {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantization must be fp8 or none, got '", source.quantization, "'"));
  }
  ASSIGN_OR_RETURN(LoadedModel out, LoadUnquantized(source));
  if (out.config.quantization.IsFp8()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantization=fp8: the checkpoint is quantized already (",
                     out.config.quantization.Describe(), "); drop the flag"));
  }
  if (source.quantize_lm_head) RETURN_IF_ERROR(CheckLmHeadModel(out.config));
  WeightQuantization online;
  online.method = WeightQuantization::Method::kOnlineFp8;
  online.block_rows = 1;
  online.activation = kernels::Fp8ActivationScheme::kDynamicToken;
  online.lm_head = source.quantize_lm_head;
  out.config.quantization = online;
  out.local_config.quantization = online;
  if (!source.dummy_weights_on_backend) {
    RETURN_IF_ERROR(QuantizeWeightsFp8(out.local_config, &out.weights));
  }
  out.model_id += source.quantize_lm_head ? ":fp8+lm_head" : ":fp8";
  return out;
}

namespace {

absl::StatusOr<LoadedModel> LoadUnquantized(const ModelSource& source) {
  LoadedModel out;
  if (source.load_format == "dummy") {
    absl::StatusOr<ModelConfig> preset = PresetConfig(source.dummy_config);
    if (preset.ok()) {
      out.config = *preset;
    } else {
      ASSIGN_OR_RETURN(out.config, LoadModelConfig(source.dummy_config));
    }
    ASSIGN_OR_RETURN(out.local_config, LocalModelConfig(out.config, source.shard));
    if (!source.dummy_weights_on_backend) {
      ASSIGN_OR_RETURN(out.weights,
                       RandomModelWeights(out.config, source.dummy_seed, source.shard));
    }
    // A preset by name; a config file by its directory's name and a hash of its contents (a
    // path can be longer than a model id may be, and moving the file changes no weight).
    std::string what = source.dummy_config;
    if (!preset.ok()) {
      std::filesystem::path path(source.dummy_config);
      if (std::filesystem::is_directory(path)) path /= "config.json";
      std::ifstream in(path, std::ios::binary);
      uint64_t h = 1469598103934665603ull;  // FNV-1a 64
      for (char c : std::string(std::istreambuf_iterator<char>(in), {})) {
        h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
      }
      what = absl::StrCat(path.parent_path().filename().string().substr(0, 48), "-",
                          absl::Hex(h, absl::kZeroPad16));
    }
    out.model_id = absl::StrCat("dummy:", what, ":", source.dummy_seed,
                                source.dummy_weights_on_backend ? ":backend" : "");
    return out;
  }
  if (source.load_format != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--load_format must be auto or dummy, got '", source.load_format, "'"));
  }
  if (source.model_dir.empty()) return absl::InvalidArgumentError("--model=DIR is required");
  ASSIGN_OR_RETURN(out.config, LoadModelConfig(source.model_dir));
  ASSIGN_OR_RETURN(out.local_config, LocalModelConfig(out.config, source.shard));
  if (!source.checkpoint_on_backend) {
    ASSIGN_OR_RETURN(out.weights, LoadModelWeights(source.model_dir, out.config, source.shard));
  }
  // Same files in different directories (or machines) are the same model: name + a hash of
  // config.json (and hf_quant_config.json) and the weight files' names and sizes.
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  auto mix = [&h](absl::string_view bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  };
  std::ifstream config_file(std::filesystem::path(source.model_dir) / "config.json",
                            std::ios::binary);
  mix(std::string(std::istreambuf_iterator<char>(config_file), {}));
  // A modelopt export's quantization may live beside it (LoadModelConfig reads it).
  std::ifstream quant_file(std::filesystem::path(source.model_dir) / "hf_quant_config.json",
                           std::ios::binary);
  if (quant_file) mix(std::string(std::istreambuf_iterator<char>(quant_file), {}));
  std::error_code ec;
  std::vector<std::string> weights;
  for (const auto& entry : std::filesystem::directory_iterator(source.model_dir, ec)) {
    if (entry.path().extension() == ".safetensors") {
      weights.push_back(absl::StrCat(entry.path().filename().string(), ":", entry.file_size(ec)));
    }
  }
  std::sort(weights.begin(), weights.end());
  for (const std::string& w : weights) mix(w);
  std::filesystem::path dir = std::filesystem::path(source.model_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  out.model_id = absl::StrCat("hf:", dir.filename().string(), ":", absl::Hex(h, absl::kZeroPad16));
  return out;
}

}  // namespace

}  // namespace tandem::runtime
