#include "runtime/model/model_weights.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/half.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using Checkpoint = std::map<std::string, Tensor>;

// A small Llama with every optional piece: GQA, head_dim != hidden / heads, all biases, untied.
ModelConfig FullLlama() {
  ModelConfig c = *PresetConfig("tiny");
  c.head_dim = 8;  // hidden 64 / 4 heads would be 16
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.vocab_size = 50;
  c.intermediate_size = 24;
  c.num_hidden_layers = 3;
  return c;
}

ModelConfig TiedQwen2() {
  ModelConfig c = *PresetConfig("tiny");
  c.architecture = "Qwen2ForCausalLM";
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.num_key_value_heads = 1;  // MQA
  return c;
}

// The checkpoint transformers would save, built here from the naming scheme alone (independent
// of the loader's own layout table), with random values.
Checkpoint MakeCheckpoint(const ModelConfig& c, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Checkpoint out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    Tensor t{std::move(shape), std::vector<float>(static_cast<size_t>(n))};
    for (float& x : t.values) x = normal(rng);
    out[name] = std::move(t);
  };
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  add("model.embed_tokens.weight", {c.vocab_size, h});
  add("model.norm.weight", {h});
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, h});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
    for (auto [proj, rows] : {std::pair{"q", q}, {"k", kv}, {"v", kv}}) {
      add(absl::StrCat(p, "self_attn.", proj, "_proj.weight"), {rows, h});
      if (c.qkv_bias) add(absl::StrCat(p, "self_attn.", proj, "_proj.bias"), {rows});
    }
    add(p + "self_attn.o_proj.weight", {h, q});
    if (c.o_bias) add(p + "self_attn.o_proj.bias", {h});
    for (const char* proj : {"gate", "up"}) {
      add(absl::StrCat(p, "mlp.", proj, "_proj.weight"), {inter, h});
      if (c.mlp_bias) add(absl::StrCat(p, "mlp.", proj, "_proj.bias"), {inter});
    }
    add(p + "mlp.down_proj.weight", {h, inter});
    if (c.mlp_bias) add(p + "mlp.down_proj.bias", {h});
  }
  return out;
}

std::vector<float> Concat(std::initializer_list<const std::vector<float>*> parts) {
  std::vector<float> out;
  for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

// What each ModelWeights vector must hold, written out from the checkpoint by hand.
void ExpectMatches(const Checkpoint& ck, const ModelConfig& c, const ModelWeights& w,
                   float (*round)(float)) {
  auto v = [&](const std::string& name) {
    std::vector<float> values = ck.at(name).values;
    for (float& x : values) x = round(x);
    return values;
  };
  auto maybe = [&](const std::string& name, bool present) {
    return present ? v(name) : std::vector<float>();
  };
  EXPECT_EQ(w.embed_tokens, v("model.embed_tokens.weight"));
  EXPECT_EQ(w.norm, v("model.norm.weight"));
  EXPECT_EQ(w.lm_head, maybe("lm_head.weight", !c.tie_word_embeddings));
  ASSERT_EQ(w.layers.size(), static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    SCOPED_TRACE(absl::StrCat("layer ", i));
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const LayerWeights& l = w.layers[static_cast<size_t>(i)];
    EXPECT_EQ(l.input_layernorm, v(p + "input_layernorm.weight"));
    EXPECT_EQ(l.post_attention_layernorm, v(p + "post_attention_layernorm.weight"));
    const auto q = v(p + "self_attn.q_proj.weight"), k = v(p + "self_attn.k_proj.weight"),
               vv = v(p + "self_attn.v_proj.weight");
    EXPECT_EQ(l.qkv_proj, Concat({&q, &k, &vv}));
    if (c.qkv_bias) {
      const auto qb = v(p + "self_attn.q_proj.bias"), kb = v(p + "self_attn.k_proj.bias"),
                 vb = v(p + "self_attn.v_proj.bias");
      EXPECT_EQ(l.qkv_bias, Concat({&qb, &kb, &vb}));
    } else {
      EXPECT_TRUE(l.qkv_bias.empty());
    }
    EXPECT_EQ(l.o_proj, v(p + "self_attn.o_proj.weight"));
    EXPECT_EQ(l.o_bias, maybe(p + "self_attn.o_proj.bias", c.o_bias));
    const auto g = v(p + "mlp.gate_proj.weight"), u = v(p + "mlp.up_proj.weight");
    EXPECT_EQ(l.gate_up_proj, Concat({&g, &u}));
    if (c.mlp_bias) {
      const auto gb = v(p + "mlp.gate_proj.bias"), ub = v(p + "mlp.up_proj.bias");
      EXPECT_EQ(l.gate_up_bias, Concat({&gb, &ub}));
    } else {
      EXPECT_TRUE(l.gate_up_bias.empty());
    }
    EXPECT_EQ(l.down_proj, v(p + "mlp.down_proj.weight"));
    EXPECT_EQ(l.down_bias, maybe(p + "mlp.down_proj.bias", c.mlp_bias));
  }
}

float Identity(float x) { return x; }
float ViaBf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }
float ViaF16(float x) { return F16ToFloat(FloatToF16(x)); }

bool SameWeights(const ModelWeights& a, const ModelWeights& b) {
  if (a.embed_tokens != b.embed_tokens || a.norm != b.norm || a.lm_head != b.lm_head ||
      a.layers.size() != b.layers.size()) {
    return false;
  }
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights &x = a.layers[i], &y = b.layers[i];
    if (x.input_layernorm != y.input_layernorm || x.qkv_proj != y.qkv_proj ||
        x.qkv_bias != y.qkv_bias || x.o_proj != y.o_proj || x.o_bias != y.o_bias ||
        x.post_attention_layernorm != y.post_attention_layernorm ||
        x.gate_up_proj != y.gate_up_proj || x.gate_up_bias != y.gate_up_bias ||
        x.down_proj != y.down_proj || x.down_bias != y.down_bias) {
      return false;
    }
  }
  return true;
}

// Applies `round` to every value, as storing in a 16-bit dtype and widening again would.
ModelWeights Rounded(ModelWeights w, float (*round)(float)) {
  auto apply = [&](std::vector<float>& v) {
    for (float& x : v) x = round(x);
  };
  apply(w.embed_tokens);
  apply(w.norm);
  apply(w.lm_head);
  for (LayerWeights& l : w.layers) {
    for (auto* v : {&l.input_layernorm, &l.qkv_proj, &l.qkv_bias, &l.o_proj, &l.o_bias,
                    &l.post_attention_layernorm, &l.gate_up_proj, &l.gate_up_bias, &l.down_proj,
                    &l.down_bias}) {
      apply(*v);
    }
  }
  return w;
}

class ModelWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device()();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));  // every test's log
    rng_.seed(seed_);
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("weights_", ::getpid(), "_", seed_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void WriteCheckpoint(const Checkpoint& ck, SafetensorsDtype dtype,
                       const std::string& file = "model.safetensors") {
    std::vector<TensorToWrite> tensors;
    for (const auto& [name, t] : ck) tensors.push_back({name, dtype, t.shape, t.values.data()});
    ASSERT_TRUE(WriteSafetensors((dir_ / file).string(), tensors).ok());
  }

  absl::Status LoadError(const ModelConfig& c) {
    absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_.string(), c);
    return w.status();
  }

  void ExpectLoadError(const ModelConfig& c, const std::vector<std::string>& needles) {
    const absl::Status status = LoadError(c);
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    for (const std::string& needle : needles) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(needle));
    }
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  fs::path dir_;
};

TEST_F(ModelWeightsTest, LoadsAndFusesEveryDtype) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  for (const ModelConfig& c : {FullLlama(), TiedQwen2()}) {
    for (auto [dtype, round] : {std::pair{SafetensorsDtype::kF32, &Identity},
                                {SafetensorsDtype::kBF16, &ViaBf16},
                                {SafetensorsDtype::kF16, &ViaF16}}) {
      SCOPED_TRACE(absl::StrCat(c.architecture, " ", SafetensorsDtypeName(dtype)));
      const Checkpoint ck = MakeCheckpoint(c, rng_);
      WriteCheckpoint(ck, dtype);
      absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_.string(), c);
      ASSERT_TRUE(w.ok()) << w.status();
      ExpectMatches(ck, c, *w, round);
    }
  }
}

TEST_F(ModelWeightsTest, ShardedIndex) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const ModelConfig c = FullLlama();
  const Checkpoint ck = MakeCheckpoint(c, rng_);
  // Split by a random predicate across three shards; the index lists them all.
  Checkpoint shards[3];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  std::uniform_int_distribution<int> pick(0, 2);
  for (const auto& [name, t] : ck) {
    const int s = pick(rng_);
    shards[s][name] = t;
    index["weight_map"][name] = absl::StrCat("model-0000", s + 1, "-of-00003.safetensors");
  }
  for (int s = 0; s < 3; ++s) {
    WriteCheckpoint(shards[s], SafetensorsDtype::kBF16,
                    absl::StrCat("model-0000", s + 1, "-of-00003.safetensors"));
  }
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_.string(), c);
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectMatches(ck, c, *w, &ViaBf16);

  // The index names a tensor its shard does not hold.
  nlohmann::json bad = index;
  const std::string actual = index["weight_map"]["model.norm.weight"];
  bad["weight_map"]["model.norm.weight"] = actual == "model-00001-of-00003.safetensors"
                                               ? "model-00002-of-00003.safetensors"
                                               : "model-00001-of-00003.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << bad.dump();
  ExpectLoadError(c, {"'model.norm.weight'", "not there"});
  // Shard names may not leave the model directory.
  bad = index;
  bad["weight_map"]["model.norm.weight"] = "../model-00001-of-00003.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << bad.dump();
  ExpectLoadError(c, {"not a plain file name"});
  // A shard that does not exist.
  bad = index;
  bad["weight_map"]["model.norm.weight"] = "model-00009-of-00003.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << bad.dump();
  EXPECT_EQ(LoadError(c).code(), absl::StatusCode::kNotFound);
  // The same tensor in two shards.
  Checkpoint extra = {{"model.norm.weight", ck.at("model.norm.weight")},
                      {"x", ck.at("model.norm.weight")}};
  WriteCheckpoint(extra, SafetensorsDtype::kF32, "extra.safetensors");
  bad = index;
  bad["weight_map"]["x"] = "extra.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << bad.dump();
  ExpectLoadError(c, {"'model.norm.weight' appears in both"});
  std::ofstream(dir_ / "model.safetensors.index.json") << "{\"weight_map\": 3}";
  ExpectLoadError(c, {"weight_map"});
}

TEST_F(ModelWeightsTest, MissingExtraAndMisshapedTensors) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const ModelConfig c = FullLlama();
  const Checkpoint good = MakeCheckpoint(c, rng_);

  Checkpoint ck = good;
  ck.erase("model.layers.1.self_attn.k_proj.bias");
  WriteCheckpoint(ck, SafetensorsDtype::kF32);
  ExpectLoadError(c, {"missing tensor 'model.layers.1.self_attn.k_proj.bias'", "[16]"});

  ck = good;
  ck.erase("lm_head.weight");
  ck.erase("model.norm.weight");
  WriteCheckpoint(ck, SafetensorsDtype::kF32);
  ExpectLoadError(c, {"missing tensor", "and 1 more"});

  ck = good;
  ck["model.layers.3.mlp.up_proj.weight"] = ck.at("model.layers.0.mlp.up_proj.weight");
  WriteCheckpoint(ck, SafetensorsDtype::kF32);
  ExpectLoadError(c, {"unexpected tensor 'model.layers.3.mlp.up_proj.weight'", "[24, 64]"});

  ck = good;
  ck["model.layers.2.self_attn.o_proj.weight"].shape = {32, 64};  // transposed [hidden, Hq*D]
  WriteCheckpoint(ck, SafetensorsDtype::kF32);
  ExpectLoadError(c, {"tensor 'model.layers.2.self_attn.o_proj.weight'", "shape [32, 64]",
                      "expected [64, 32]"});

  // A config without biases rejects a checkpoint that has them (extra tensors).
  ModelConfig no_bias = c;
  no_bias.qkv_bias = no_bias.o_bias = no_bias.mlp_bias = false;
  WriteCheckpoint(good, SafetensorsDtype::kF32);
  ExpectLoadError(no_bias, {"unexpected tensor", ".bias'"});

  // Harmless buffers are ignored.
  ck = good;
  ck["model.layers.0.self_attn.rotary_emb.inv_freq"] = {{4}, {1, 2, 3, 4}};
  WriteCheckpoint(ck, SafetensorsDtype::kF32);
  EXPECT_TRUE(LoadModelWeights(dir_.string(), c).ok());
}

TEST_F(ModelWeightsTest, TiedHeadAndUnsupportedDtype) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const ModelConfig c = TiedQwen2();
  Checkpoint ck = MakeCheckpoint(c, rng_);
  ck["lm_head.weight"] = ck.at("model.embed_tokens.weight");  // stored although tied: ignored
  WriteCheckpoint(ck, SafetensorsDtype::kF32);
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir_.string(), c);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->lm_head.empty());
  ck["lm_head.weight"].shape = {64, 256};
  WriteCheckpoint(ck, SafetensorsDtype::kF32);
  ExpectLoadError(c, {"'lm_head.weight'", "[64, 256]", "expected [256, 64]"});

  // An integer tensor where a float one belongs.
  ck.erase("lm_head.weight");
  ck.erase("model.norm.weight");
  WriteCheckpoint(ck, SafetensorsDtype::kF32);
  nlohmann::json header = {
      {"model.norm.weight", {{"dtype", "I32"}, {"shape", {64}}, {"data_offsets", {0, 256}}}}};
  std::string text = header.dump();
  const uint64_t n = text.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += text + std::string(256, '\x02');
  // Two "shards": rename the main file and list both in an index.
  fs::rename(dir_ / "model.safetensors", dir_ / "a.safetensors");
  std::ofstream(dir_ / "b.safetensors", std::ios::binary) << bytes;
  nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
  for (const auto& [name, t] : ck) index["weight_map"][name] = "a.safetensors";
  index["weight_map"]["model.norm.weight"] = "b.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  ExpectLoadError(c, {"'model.norm.weight'", "unsupported dtype 'I32'"});
}

TEST_F(ModelWeightsTest, NoCheckpoint) {
  const absl::Status status = LoadError(FullLlama());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("model.safetensors"));
  std::ofstream(dir_ / "pytorch_model.bin") << "x";
  EXPECT_THAT(std::string(LoadError(FullLlama()).message()), HasSubstr("pytorch_model.bin"));
}

TEST_F(ModelWeightsTest, RandomWeightsAreDeterministicAndWellScaled) {
  const ModelConfig c = FullLlama();
  const ModelWeights a = RandomModelWeights(c, 7);
  EXPECT_TRUE(SameWeights(a, RandomModelWeights(c, 7)));
  EXPECT_FALSE(SameWeights(a, RandomModelWeights(c, 8)));
  EXPECT_EQ(a.embed_tokens.size(), 50u * 64);
  EXPECT_EQ(a.layers[0].qkv_proj.size(), (4u + 2 * 2) * 8 * 64);
  EXPECT_EQ(a.layers[0].gate_up_bias.size(), 48u);
  // Statistics in fp64: matrices ~ N(0, 0.02^2), norms ~ 1 + N(0, 0.02^2).
  auto stats = [](const std::vector<float>& v) {
    double sum = 0, sq = 0;
    for (float x : v) sum += x;
    const double mean = sum / static_cast<double>(v.size());
    for (float x : v) sq += (x - mean) * (x - mean);
    return std::pair{mean, std::sqrt(sq / static_cast<double>(v.size()))};
  };
  auto [mean, stddev] = stats(a.layers[1].qkv_proj);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(stddev, 0.02, 0.002);
  std::tie(mean, stddev) = stats(a.layers[2].input_layernorm);
  EXPECT_NEAR(mean, 1.0, 0.01);
  EXPECT_GT(stddev, 0.01);
  // q, k and v rows come from distinct streams (no accidental reuse of one tensor's values).
  const auto& qkv = a.layers[0].qkv_proj;
  EXPECT_NE(std::vector<float>(qkv.begin(), qkv.begin() + 64),
            std::vector<float>(qkv.begin() + 32 * 64, qkv.begin() + 33 * 64));
}

TEST_F(ModelWeightsTest, DummyModelRoundTrip) {
  const uint64_t seed = seed_;
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  for (auto [dtype, round] : {std::pair{WeightDtype::kF32, &Identity},
                              {WeightDtype::kBF16, &ViaBf16},
                              {WeightDtype::kF16, &ViaF16}}) {
    for (ModelConfig c : {FullLlama(), TiedQwen2()}) {
      for (int64_t shard_bytes : {int64_t{4} << 30, int64_t{20000}}) {
        SCOPED_TRACE(absl::StrCat(c.architecture, " ", WeightDtypeName(dtype), " ", shard_bytes));
        c.dtype = dtype;
        const std::string out = (dir_ / "dummy").string();
        ASSERT_TRUE(WriteDummyModel(c, out, seed, shard_bytes).ok());
        const bool sharded = shard_bytes < 1000000;
        EXPECT_EQ(fs::exists(fs::path(out) / "model.safetensors"), !sharded);
        EXPECT_EQ(fs::exists(fs::path(out) / "model.safetensors.index.json"), sharded);
        absl::StatusOr<ModelConfig> loaded_config = LoadModelConfig(out);
        ASSERT_TRUE(loaded_config.ok()) << loaded_config.status();
        EXPECT_EQ(ModelConfigToJson(*loaded_config), ModelConfigToJson(c));
        absl::StatusOr<ModelWeights> w = LoadModelWeights(out, *loaded_config);
        ASSERT_TRUE(w.ok()) << w.status();
        EXPECT_TRUE(SameWeights(*w, Rounded(RandomModelWeights(c, seed), round)));
      }
    }
  }
  int shards = 0;
  for (const auto& entry : fs::directory_iterator(dir_ / "dummy")) {
    shards += entry.path().extension() == ".safetensors";
  }
  EXPECT_GT(shards, 2);  // the last run was sharded, and stale files were cleaned
  EXPECT_FALSE(fs::exists(dir_ / "dummy" / "model.safetensors"));
  EXPECT_EQ(WriteDummyModel(FullLlama(), (dir_ / "x").string(), 1, 0).code(),
            absl::StatusCode::kInvalidArgument);
  ModelConfig bad = FullLlama();
  bad.head_dim = 7;
  EXPECT_EQ(WriteDummyModel(bad, (dir_ / "x").string(), 1).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::runtime
