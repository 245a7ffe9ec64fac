// Writes a Hugging Face model directory with random weights (see WriteDummyModel), so demos and
// tests need no download:
//
//   make_dummy_model --config=tiny --out=/tmp/tiny --seed=1
//   make_dummy_model --config=path/to/config.json --out=DIR --dtype=bfloat16 --shard_mb=2048
//                    [--threads=N]   (shards written N at a time; default: one per core)
//   make_dummy_model --config=deepseek-v3-4l --mtp_layers=1 --out=DIR   (+ DeepSeek's MTP layer)
//
// --config is a config.json file, a model directory holding one, or a preset name (tiny,
// llama-100m, llama3-8b, llama3-70b, ...: PresetConfig). Exits 1 with a message on stderr for bad
// input.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

ABSL_FLAG(std::string, config, "", "config.json path, model directory, or preset name");
ABSL_FLAG(std::string, out, "", "output directory (created if missing)");
ABSL_FLAG(uint64_t, seed, 0, "random seed; the same seed gives the same weights");
ABSL_FLAG(std::string, dtype, "", "float32 | bfloat16 | float16 (default: the config's dtype)");
ABSL_FLAG(int64_t, shard_mb, 4096, "largest shard in MiB; bigger models get several shards");
ABSL_FLAG(int64_t, mtp_layers, -1,
          "DeepSeek (MLA) models: MTP layers to write after the model's, model.layers.{N..} "
          "(sets num_nextn_predict_layers; -1: the config's)");
ABSL_FLAG(int32_t, threads, 0,
          "shards generated and written at once (0: one per hardware thread); the bytes do not "
          "depend on it");

namespace tandem::runtime {
namespace {

absl::StatusOr<ModelConfig> ResolveConfig(const std::string& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return LoadModelConfig(spec);
  if (fs::is_regular_file(spec, ec)) {
    // LoadModelConfig reads <dir>/config.json (+ generation_config.json); any file name works.
    const fs::path path(spec);
    if (path.filename() == "config.json") {
      return LoadModelConfig(path.parent_path().empty() ? "." : path.parent_path().string());
    }
    FILE* file = std::fopen(spec.c_str(), "rb");
    if (file == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", spec));
    std::string text;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
    std::fclose(file);
    absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
    if (!config.ok()) {
      return absl::Status(config.status().code(),
                          absl::StrCat(spec, ": ", config.status().message()));
    }
    return config;
  }
  absl::StatusOr<ModelConfig> preset = PresetConfig(spec);
  if (!preset.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config='", spec,
                     "' is neither a file, a directory nor a preset: ", preset.status().message()));
  }
  return preset;
}

absl::Status Run() {
  const std::string spec = absl::GetFlag(FLAGS_config);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (spec.empty()) return absl::InvalidArgumentError("--config is required");
  if (out.empty()) return absl::InvalidArgumentError("--out is required");
  const int64_t shard_mb = absl::GetFlag(FLAGS_shard_mb);
  if (shard_mb <= 0 || shard_mb > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("--shard_mb must be positive, got ", shard_mb));
  }
  ASSIGN_OR_RETURN(ModelConfig config, ResolveConfig(spec));
  if (const std::string dtype = absl::GetFlag(FLAGS_dtype); !dtype.empty()) {
    absl::StatusOr<WeightDtype> parsed = ParseWeightDtype(dtype);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--dtype: ", parsed.status().message()));
    }
    config.dtype = *parsed;
  }
  if (const int64_t mtp = absl::GetFlag(FLAGS_mtp_layers); mtp >= 0) {
    if (mtp > 0 && !config.IsMla()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mtp_layers: ", config.architecture, " has no MTP layers (DeepSeek MLA models only)"));
    }
    config.num_nextn_predict_layers = mtp;
  }
  std::fprintf(stderr, "make_dummy_model: %s, %lld parameters, %s, seed %llu -> %s\n",
               config.architecture.c_str(), static_cast<long long>(config.NumParameters()),
               std::string(WeightDtypeName(config.dtype)).c_str(),
               static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)), out.c_str());
  return WriteDummyModel(config, out, absl::GetFlag(FLAGS_seed), shard_mb << 20,
                         absl::GetFlag(FLAGS_threads));
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a Hugging Face model directory with random weights.\n"
      "  make_dummy_model --config=<config.json | model dir | preset (tiny, llama3-8b, llama3-70b, "
      "...)>\n"
      "                   --out=DIR [--seed=S] [--dtype=float32|bfloat16|float16] "
      "[--shard_mb=N] [--mtp_layers=N]");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "make_dummy_model: unexpected argument '%s'\n", positional[1]);
    return 1;
  }
  const absl::Status status = tandem::runtime::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "make_dummy_model: %s\n", status.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "make_dummy_model: done\n");
  return 0;
}
