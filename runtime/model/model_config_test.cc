#include "runtime/model/model_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::runtime {
namespace {

using json = nlohmann::json;
using kernels::RopeType;
using ::testing::HasSubstr;

// Llama-3.1-8B's config.json as published (transformers 4.43 era).
constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

// Qwen2.5-0.5B-Instruct's config.json as published.
constexpr char kQwen25[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

json Base() { return json::parse(kLlama31); }

absl::StatusOr<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump()); }

void ExpectError(const json& j, absl::string_view needle) {
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_FALSE(c.ok()) << j.dump();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(std::string(needle)));
}

TEST(ModelConfigTest, Llama31) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama31);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias || c->o_bias || c->mlp_bias);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->dtype, WeightDtype::kBF16);
  EXPECT_EQ(c->NumParameters(), 8030261248);  // Llama-3.1-8B's published parameter count
}

TEST(ModelConfigTest, Qwen25HasQkvBiasAndTiedEmbeddings) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen25);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{151645}));
  EXPECT_EQ(c->rope_scaling.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->NumParameters(), 494032768);  // Qwen2.5-0.5B's published parameter count
  // Qwen2 ignores attention_bias: its biases are fixed by the architecture.
  json j = json::parse(kQwen25);
  j["attention_bias"] = false;
  j["mlp_bias"] = true;
  absl::StatusOr<ModelConfig> d = Parse(j);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->qkv_bias);
  EXPECT_FALSE(d->o_bias || d->mlp_bias);
}

TEST(ModelConfigTest, RopeSpellings) {
  struct Case {
    const char* name;
    json patch;  // top-level fields replaced in the base
    RopeType type;
    double theta;
    double factor;
  };
  const json llama3 = {{"rope_type", "llama3"},
                       {"factor", 32},
                       {"low_freq_factor", 1},
                       {"high_freq_factor", 4},
                       {"original_max_position_embeddings", 8192}};
  json llama3_v5 = llama3;
  llama3_v5["rope_theta"] = 250000.0;
  const std::vector<Case> cases = {
      {"null rope_scaling", {{"rope_scaling", nullptr}}, RopeType::kDefault, 500000, 1},
      {"no rope fields",
       {{"rope_scaling", nullptr}, {"rope_theta", nullptr}},
       RopeType::kDefault,
       10000,
       1},
      {"old type key",
       {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}},
       RopeType::kLinear,
       500000,
       2},
      {"rope_type key",
       {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 4}}}},
       RopeType::kLinear,
       500000,
       4},
      {"explicit default",
       {{"rope_scaling", {{"rope_type", "default"}}}},
       RopeType::kDefault,
       500000,
       1},
      {"empty dict falls through",
       {{"rope_scaling", json::object()},
        {"rope_parameters", {{"rope_type", "linear"}, {"factor", 3.0}}}},
       RopeType::kLinear,
       500000,
       3},
      {"v5 rope_parameters",
       {{"rope_scaling", nullptr}, {"rope_theta", nullptr}, {"rope_parameters", llama3_v5}},
       RopeType::kLlama3,
       250000,
       32},
      {"v5 default",
       {{"rope_scaling", nullptr},
        {"rope_theta", nullptr},
        {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}}},
       RopeType::kDefault,
       1e6,
       1},
      {"rope_scaling wins over rope_parameters",
       {{"rope_scaling", llama3}, {"rope_parameters", {{"rope_type", "linear"}, {"factor", 2}}}},
       RopeType::kLlama3,
       500000,
       32},
      {"theta inside the dict wins", {{"rope_scaling", llama3_v5}}, RopeType::kLlama3, 250000, 32},
  };
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.name);
    json j = Base();
    for (const auto& [key, value] : tc.patch.items()) j[key] = value;
    absl::StatusOr<ModelConfig> c = Parse(j);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->rope_scaling.type, tc.type);
    EXPECT_DOUBLE_EQ(c->rope_theta, tc.theta);
    EXPECT_DOUBLE_EQ(c->rope_scaling.factor, tc.factor);
  }
}

TEST(ModelConfigTest, RopeErrors) {
  for (const char* type : {"yarn", "dynamic", "longrope", "ntk", "mrope"}) {
    json j = Base();
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    ExpectError(j, absl::StrCat("unsupported rope type '", type, "'"));
  }
  json j = Base();
  j["rope_scaling"] = nullptr;
  j["rope_parameters"] = {{"type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e4}};
  ExpectError(j, "unsupported rope type 'yarn' in rope_parameters");

  j = Base();
  j["rope_scaling"].erase("low_freq_factor");
  ExpectError(j, "requires 'low_freq_factor'");
  j = Base();
  j["rope_scaling"] = {{"type", "linear"}};
  ExpectError(j, "requires 'factor'");
  j = Base();
  j["rope_scaling"]["factor"] = "8";
  ExpectError(j, "'rope_scaling.factor' must be a number");
  j = Base();
  j["rope_scaling"]["factor"] = -1.0;
  ExpectError(j, "rope factor");
  j = Base();
  j["rope_scaling"]["high_freq_factor"] = 0.5;
  ExpectError(j, "high_freq_factor");
  j = Base();
  j["rope_scaling"]["original_max_position_embeddings"] = 8192.5;
  ExpectError(j, "original_max_position_embeddings");
  j = Base();
  j["rope_scaling"] = "llama3";
  ExpectError(j, "'rope_scaling' must be an object");
  j = Base();
  j["rope_theta"] = 0;
  ExpectError(j, "rope_theta");
  j = Base();
  j["partial_rotary_factor"] = 0.5;
  ExpectError(j, "partial_rotary_factor");
}

TEST(ModelConfigTest, HeadDimAndKvHeads) {
  json j = Base();
  j["head_dim"] = 64;  // differs from 4096 / 32
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 64);

  j["head_dim"] = nullptr;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);

  j = Base();
  j.erase("num_key_value_heads");
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 32);  // MHA

  j["num_key_value_heads"] = 1;  // MQA
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 1);

  j["num_key_value_heads"] = 5;
  ExpectError(j, "num_key_value_heads");
  j["num_key_value_heads"] = 8;
  j["head_dim"] = 127;
  ExpectError(j, "head_dim must be even");
  j = Base();
  j["hidden_size"] = 4001;  // not divisible by 32 heads, no head_dim
  ExpectError(j, "not divisible by num_attention_heads");
  j["head_dim"] = 128;  // fine with an explicit head_dim
  EXPECT_TRUE(Parse(j).ok());
}

TEST(ModelConfigTest, MissingFieldsTakeTransformersDefaults) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(R"({"architectures": ["LlamaForCausalLM"]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 11008);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 32);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeType::kDefault);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(c->dtype, WeightDtype::kF32);

  c = ParseModelConfig(R"({"model_type": "qwen2", "num_key_value_heads": 4})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->intermediate_size, 22016);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_TRUE(c->eos_token_ids.empty());

  // Explicit nulls mean "none" for token ids, "default" for sizes.
  c = ParseModelConfig(
      R"({"architectures": ["LlamaForCausalLM"], "bos_token_id": null, "eos_token_id": null,
          "vocab_size": null, "torch_dtype": null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->vocab_size, 32000);
}

TEST(ModelConfigTest, EosAndDtypeSpellings) {
  json j = Base();
  j["eos_token_id"] = 128001;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{128001});
  j["eos_token_id"] = 128001.0;  // integral floats are accepted
  ASSERT_TRUE(Parse(j).ok());
  j["eos_token_id"] = {1, "2"};
  ExpectError(j, "eos_token_id");
  j["eos_token_id"] = -1;
  ExpectError(j, "eos_token_id");
  j["eos_token_id"] = 128256;
  ExpectError(j, "outside the vocabulary");
  j = Base();
  j["bos_token_id"] = 999999;
  ExpectError(j, "bos_token_id");

  j = Base();
  j.erase("torch_dtype");
  j["dtype"] = "float16";  // transformers 5
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->dtype, WeightDtype::kF16);
  j["torch_dtype"] = "float32";  // "dtype" wins
  EXPECT_EQ(Parse(j)->dtype, WeightDtype::kF16);
  j["dtype"] = "int8";
  ExpectError(j, "unsupported dtype 'int8'");
  EXPECT_EQ(*ParseWeightDtype("torch.bfloat16"), WeightDtype::kBF16);
  EXPECT_EQ(*ParseWeightDtype("FP32"), WeightDtype::kF32);
}

TEST(ModelConfigTest, UnsupportedModelsAndBadValues) {
  json j = Base();
  j["architectures"] = {"GemmaForCausalLM"};
  ExpectError(j, "unsupported architecture 'GemmaForCausalLM'");
  j["architectures"] = json::array();
  ExpectError(j, "architectures");
  ExpectError(json::object(), "neither 'architectures' nor 'model_type'");
  ExpectError(json{{"model_type", "gpt2"}}, "unsupported model_type 'gpt2'");
  j = Base();
  j["hidden_act"] = "gelu";
  ExpectError(j, "unsupported hidden_act 'gelu'");
  j = json::parse(kQwen25);
  j["use_sliding_window"] = true;
  ExpectError(j, "sliding-window");
  j["max_window_layers"] = 24;  // no layer would actually slide
  EXPECT_TRUE(Parse(j).ok());
  j = Base();
  j["layer_types"] = {"full_attention", "sliding_attention"};
  ExpectError(j, "layer_types");

  const std::vector<std::pair<const char*, json>> bad = {
      {"vocab_size", 0},
      {"vocab_size", -5},
      {"hidden_size", "4096"},
      {"hidden_size", 1.5},
      {"num_hidden_layers", 0},
      {"num_attention_heads", 0},
      {"num_key_value_heads", 0},
      {"intermediate_size", -1},
      {"rms_norm_eps", 0},
      {"rms_norm_eps", "1e-5"},
      {"max_position_embeddings", 0},
      {"tie_word_embeddings", 1},
      {"attention_bias", "yes"},
      {"head_dim", 0},
      {"vocab_size", 1e18},
  };
  for (const auto& [field, value] : bad) {
    SCOPED_TRACE(absl::StrCat(field, " = ", value.dump()));
    j = Base();
    j[field] = value;
    ExpectError(j, field);
  }
  for (const char* text :
       {"", "{", "[1, 2]", "null", "{\"architectures\": [\"LlamaForCausalLM\"],}", "\xff\xfe"}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

TEST(ModelConfigTest, LlamaBiasFlags) {
  json j = Base();
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->qkv_bias && c->o_bias && c->mlp_bias);
  ModelConfig bad = *c;
  bad.o_bias = false;
  EXPECT_FALSE(ValidateModelConfig(bad).ok());
  ModelConfig qwen = *ParseModelConfig(kQwen25);
  qwen.o_bias = true;
  EXPECT_FALSE(ValidateModelConfig(qwen).ok());
}

// ModelConfigToJson output parses back to the same config, for random valid configs.
TEST(ModelConfigTest, JsonRoundTrip) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 50; ++i) {
    ModelConfig c;
    const bool qwen2 = pick(0, 1) == 1;
    c.architecture = qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
    c.num_key_value_heads = pick(1, 4);
    c.num_attention_heads = c.num_key_value_heads * pick(1, 4);
    c.head_dim = 2 * pick(1, 64);
    c.hidden_size = pick(1, 512);
    c.intermediate_size = pick(1, 1024);
    c.num_hidden_layers = pick(1, 40);
    c.vocab_size = pick(10, 100000);
    c.rms_norm_eps = std::uniform_real_distribution<double>(1e-7, 1e-3)(rng);
    c.rope_theta = std::uniform_real_distribution<double>(100, 1e7)(rng);
    c.max_position_embeddings = pick(1, 1 << 20);
    c.tie_word_embeddings = pick(0, 1) == 1;
    c.qkv_bias = qwen2 || pick(0, 1) == 1;
    c.o_bias = !qwen2 && c.qkv_bias;
    c.mlp_bias = !qwen2 && pick(0, 1) == 1;
    c.dtype = static_cast<WeightDtype>(pick(0, 2));
    const int n_eos = pick(0, 3);
    for (int e = 0; e < n_eos; ++e) c.eos_token_ids.push_back(pick(0, 9));
    if (pick(0, 1) == 1) c.bos_token_id = pick(0, 9);
    const int rope = pick(0, 2);
    if (rope == 1) c.rope_scaling = {RopeType::kLinear, 1.0 + pick(0, 7), 1.0, 4.0, 8192};
    if (rope == 2) {
      c.rope_scaling = {RopeType::kLlama3, 8.0, 0.5 + pick(0, 2), 4.0 + pick(0, 4), pick(1, 9000)};
    }
    ASSERT_TRUE(ValidateModelConfig(c).ok()) << ValidateModelConfig(c);
    const std::string text = ModelConfigToJson(c);
    absl::StatusOr<ModelConfig> back = ParseModelConfig(text);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
    EXPECT_EQ(ModelConfigToJson(*back), text);
    EXPECT_EQ(back->architecture, c.architecture);
    EXPECT_EQ(back->head_dim, c.head_dim);
    EXPECT_EQ(back->rms_norm_eps, c.rms_norm_eps);  // round-trip exact doubles
    EXPECT_EQ(back->rope_theta, c.rope_theta);
    EXPECT_EQ(back->rope_scaling.type, c.rope_scaling.type);
    EXPECT_EQ(back->rope_scaling.original_max_position_embeddings,
              c.rope_scaling.type == RopeType::kLlama3
                  ? c.rope_scaling.original_max_position_embeddings
                  : 8192);
    EXPECT_EQ(back->eos_token_ids, c.eos_token_ids);
    EXPECT_EQ(back->bos_token_id, c.bos_token_id);
    EXPECT_EQ(back->qkv_bias, c.qkv_bias);
    EXPECT_EQ(back->o_bias, c.o_bias);
    EXPECT_EQ(back->mlp_bias, c.mlp_bias);
    EXPECT_EQ(back->tie_word_embeddings, c.tie_word_embeddings);
    EXPECT_EQ(back->dtype, c.dtype);
    EXPECT_EQ(back->NumParameters(), c.NumParameters());
  }
}

TEST(ModelConfigTest, Presets) {
  absl::StatusOr<ModelConfig> c = PresetConfig("llama3-8b");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->NumParameters(), 8030261248);
  c = PresetConfig("llama3-70b");  // Llama-3.1-70B: 70.55B
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->NumParameters(), 70553706496);
  EXPECT_EQ(c->num_key_value_heads, 8);
  c = PresetConfig("llama-100m");
  ASSERT_TRUE(c.ok());
  EXPECT_GT(c->NumParameters(), 90'000'000);
  EXPECT_LT(c->NumParameters(), 110'000'000);
  c = PresetConfig("tiny");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_key_value_heads, 2);
  absl::StatusOr<ModelConfig> bad = PresetConfig("llama-7b");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("tiny"));
}

class LoadModelConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("load_config_", ::getpid(), "_", std::random_device()());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(LoadModelConfigTest, GenerationConfigExtendsEos) {
  json j = Base();
  j["eos_token_id"] = 128001;
  j["bos_token_id"] = nullptr;
  Write("config.json", j.dump());
  Write("generation_config.json",
        R"({"bos_token_id": 128000, "eos_token_id": [128009, 128001], "do_sample": true})");
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128009, 128001}));
  EXPECT_EQ(c->bos_token_id, 128000);

  Write("generation_config.json", R"({"eos_token_id": 999999})");
  absl::StatusOr<ModelConfig> bad = LoadModelConfig(dir_.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("generation_config.json"));

  Write("generation_config.json", "{not json");
  EXPECT_EQ(LoadModelConfig(dir_.string()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LoadModelConfigTest, WithoutGenerationConfigAndMissingDir) {
  Write("config.json", kQwen25);
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{151645});
  EXPECT_EQ(LoadModelConfig((dir_ / "nope").string()).status().code(), absl::StatusCode::kNotFound);
  Write("config.json", R"({"architectures": ["GPT2LMHeadModel"]})");
  absl::StatusOr<ModelConfig> bad = LoadModelConfig(dir_.string());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("config.json"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("GPT2LMHeadModel"));
}

// --dummy_config / --model may name the config file itself (issue 31 item 5, issue 30 item 13):
// DIR/config.json loads the same config as DIR (its generation_config.json included), any other
// file name loads that file alone; the old tree read DIR/config.json/config.json.
TEST_F(LoadModelConfigTest, AcceptsTheConfigFileItself) {
  json j = Base();
  j["eos_token_id"] = 128001;
  Write("config.json", j.dump());
  Write("generation_config.json", R"({"eos_token_id": [128009]})");
  absl::StatusOr<ModelConfig> from_dir = LoadModelConfig(dir_.string());
  absl::StatusOr<ModelConfig> from_file = LoadModelConfig((dir_ / "config.json").string());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(ModelConfigToJson(*from_file), ModelConfigToJson(*from_dir));
  EXPECT_EQ(from_file->eos_token_ids, (std::vector<int32_t>{128009, 128001}));

  Write("other.json", kQwen25);
  absl::StatusOr<ModelConfig> other = LoadModelConfig((dir_ / "other.json").string());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(other->eos_token_ids, std::vector<int32_t>{151645});  // no generation config
  EXPECT_EQ(LoadModelConfig((dir_ / "missing.json").string()).status().code(),
            absl::StatusCode::kNotFound);
}

// TensorRT Model Optimizer's older exports keep their quantization in hf_quant_config.json beside a
// config.json without quantization_config: it is read as the modelopt quantization_config;
// config.json's own wins; a bad file is refused naming it.
TEST_F(LoadModelConfigTest, ReadsHfQuantConfigBesideConfigJson) {
  Write("config.json", Base().dump());
  Write("hf_quant_config.json",
        R"({"producer": {"name": "modelopt", "version": "0.19.0"},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                             "exclude_modules": ["lm_head"]}})");
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir_.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.method, WeightQuantization::Method::kModelOpt);
  EXPECT_TRUE(c->quantization.kv_cache_fp8);
  EXPECT_EQ(c->quantization.ignore, std::vector<std::string>{"lm_head"});

  json own = Base();
  own["quantization_config"] = {
      {"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}};
  Write("config.json", own.dump());
  absl::StatusOr<ModelConfig> wins = LoadModelConfig(dir_.string());
  ASSERT_TRUE(wins.ok()) << wins.status();
  EXPECT_EQ(wins->quantization.method, WeightQuantization::Method::kFp8Block);

  Write("config.json", Base().dump());
  Write("hf_quant_config.json", R"({"quantization": {"quant_algo": "W4A8_AWQ"}})");
  absl::StatusOr<ModelConfig> bad = LoadModelConfig(dir_.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("hf_quant_config.json"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'W4A8_AWQ'"));
  Write("hf_quant_config.json", R"({"producer": {"name": "autofp8"}, "quantization": {}})");
  EXPECT_THAT(std::string(LoadModelConfig(dir_.string()).status().message()),
              HasSubstr("modelopt only"));
  Write("hf_quant_config.json", "[1, 2");
  EXPECT_EQ(LoadModelConfig(dir_.string()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::runtime
