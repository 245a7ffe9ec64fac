// Runs the make_dummy_model binary as a user would and loads what it wrote.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/model/half.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Result {
  int exit_code = -1;
  std::string output;
};

class MakeDummyModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device()();
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("make_dummy_", ::getpid(), "_", seed_);
    fs::create_directories(dir_);
    const char* srcdir = std::getenv("TEST_SRCDIR");
    ASSERT_NE(srcdir, nullptr) << "run under bazel test";
    binary_ = fs::path(srcdir) / "tandem" / "runtime" / "model" / "make_dummy_model";
    ASSERT_TRUE(fs::exists(binary_)) << binary_;
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result Run(const std::string& args) {
    Result result;
    const std::string command = absl::StrCat(binary_.string(), " ", args, " 2>&1");
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return result;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
    const int status = ::pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
  }

  uint32_t seed_ = 0;
  fs::path dir_;
  fs::path binary_;
};

float ViaBf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }

TEST_F(MakeDummyModelTest, TinyPresetLoadsBack) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const fs::path out = dir_ / "tiny";
  const Result r = Run(
      absl::StrCat("--config=tiny --out=", out.string(), " --seed=", seed_, " --dtype=bfloat16"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("LlamaForCausalLM"));
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors"}) {
    EXPECT_TRUE(fs::exists(out / file)) << file;
  }
  ModelConfig expected = *PresetConfig("tiny");
  expected.dtype = WeightDtype::kBF16;
  absl::StatusOr<ModelConfig> config = LoadModelConfig(out.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ModelConfigToJson(*config), ModelConfigToJson(expected));
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(out.string(), *config);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const ModelWeights reference = RandomModelWeights(expected, seed_);
  ASSERT_EQ(weights->embed_tokens.size(), reference.embed_tokens.size());
  for (size_t i = 0; i < reference.embed_tokens.size(); ++i) {
    ASSERT_EQ(weights->embed_tokens[i], ViaBf16(reference.embed_tokens[i])) << i;
  }
  for (size_t i = 0; i < reference.layers[1].gate_up_proj.size(); ++i) {
    ASSERT_EQ(weights->layers[1].gate_up_proj[i], ViaBf16(reference.layers[1].gate_up_proj[i]));
  }

  // The written directory works as --config too (same shapes, new seed, float32).
  const Result again = Run(absl::StrCat("--config=", out.string(),
                                        " --out=", (dir_ / "copy").string(), " --dtype=float32"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(LoadModelWeights((dir_ / "copy").string(), *LoadModelConfig(out.string())).ok());
}

TEST_F(MakeDummyModelTest, ConfigFile) {
  const fs::path config = dir_ / "qwen.json";
  std::ofstream(config) << R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 300,
      "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 1, "tie_word_embeddings": true,
      "rope_theta": 1000000.0, "eos_token_id": [7, 8], "torch_dtype": "float16"})";
  const fs::path out = dir_ / "qwen";
  const Result r = Run(absl::StrCat("--config=", config.string(), " --out=", out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  absl::StatusOr<ModelConfig> loaded = LoadModelConfig(out.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->dtype, WeightDtype::kF16);
  EXPECT_TRUE(loaded->qkv_bias);
  EXPECT_EQ(loaded->eos_token_ids, (std::vector<int32_t>{7, 8}));
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(out.string(), *loaded);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(weights->lm_head.empty());
  EXPECT_EQ(weights->layers[0].qkv_bias.size(), (4u + 2) * 8);
}

TEST_F(MakeDummyModelTest, BadInputExitsNonZeroWithAMessage) {
  const std::string out = absl::StrCat(" --out=", (dir_ / "bad").string());
  const fs::path yarn = dir_ / "yarn.json";
  std::ofstream(yarn) << R"({"architectures": ["LlamaForCausalLM"],
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--config=tiny", "--out is required"},
      {"--out=/tmp/x", "--config is required"},
      {"--config=no-such-preset" + out, "neither a file"},
      {"--config=tiny --dtype=int8" + out, "unsupported dtype 'int8'"},
      {"--config=tiny --shard_mb=0" + out, "--shard_mb"},
      {"--config=" + yarn.string() + out, "unsupported rope type 'yarn'"},
      {"--config=tiny --seed=abc" + out, "seed"},
      {"--config=tiny stray" + out, "unexpected argument"},
  };
  for (const auto& [args, needle] : cases) {
    SCOPED_TRACE(args);
    const Result r = Run(args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(needle));
  }
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "model.safetensors"));
}

}  // namespace
}  // namespace tandem::runtime
