// DeepSeek-V2/V3 config.json parsing (model_config_mla.cc): defaults, both RoPE spellings, yarn
// fields, and the refusals that name the field; the MLA dummy model round trip (config writer,
// tensor layout, loader).
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {
namespace {

using json = nlohmann::json;

json TinyV3() {
  return json{{"architectures", {"DeepseekV3ForCausalLM"}},
              {"vocab_size", 96},
              {"hidden_size", 32},
              {"intermediate_size", 48},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 2},
              {"num_key_value_heads", 2},
              {"first_k_dense_replace", 2},
              {"q_lora_rank", 16},
              {"kv_lora_rank", 12},
              {"qk_nope_head_dim", 8},
              {"qk_rope_head_dim", 4},
              {"v_head_dim", 6},
              {"rope_parameters",
               {{"rope_type", "yarn"},
                {"rope_theta", 10000.0},
                {"factor", 40.0},
                {"original_max_position_embeddings", 4096},
                {"mscale", 1.0},
                {"mscale_all_dim", 1.0},
                {"beta_fast", 32},
                {"beta_slow", 1}}}};
}

TEST(DeepseekConfigTest, ParsesMlaFieldsAndYarn) {
  auto c = ParseModelConfig(TinyV3().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->IsMla());
  EXPECT_EQ(c->architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c->q_lora_rank, 16);
  EXPECT_EQ(c->kv_lora_rank, 12);
  EXPECT_EQ(c->qk_nope_head_dim, 8);
  EXPECT_EQ(c->qk_rope_head_dim, 4);
  EXPECT_EQ(c->head_dim, 4);  // transformers: head_dim = qk_rope_head_dim
  EXPECT_EQ(c->v_head_dim, 6);
  EXPECT_TRUE(c->rope_interleave);  // V3 default
  EXPECT_EQ(c->rope_scaling.type, kernels::RopeType::kYarn);
  EXPECT_EQ(c->rope_scaling.factor, 40.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c->rope_scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(c->bos_token_id, 0);  // DeepseekV3Config defaults
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{1});
  EXPECT_DOUBLE_EQ(kernels::RopeAttentionFactor(c->rope_scaling), 1.0);
}

TEST(DeepseekConfigTest, OldRopeSpellingNullQLoraAndV2Interleave) {
  json j = TinyV3();
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  j.erase("rope_parameters");
  j["rope_theta"] = 500.0;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"mscale", 0.707}};
  j["q_lora_rank"] = nullptr;
  j["rope_interleave"] = false;  // not a DeepseekV2Config field: V2 always rotates pairs
  auto c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_TRUE(c->rope_interleave);
  EXPECT_EQ(c->rope_theta, 500.0);
  EXPECT_EQ(c->rope_scaling.type, kernels::RopeType::kYarn);
  // original_max_position_embeddings defaults to max_position_embeddings (V2: 2048).
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 2048);
  // mscale without mscale_all_dim: get_mscale(factor) = 0.1 ln 4 + 1.
  EXPECT_NEAR(kernels::RopeAttentionFactor(c->rope_scaling), 0.1 * std::log(4.0) + 1.0, 1e-12);
}

TEST(DeepseekConfigTest, RefusesWhatItCannotRunNamingTheField) {
  struct Case {
    const char* key;
    json value;
    const char* says;
  } cases[] = {
      {"moe_layer_freq", 2, "moe_layer_freq"},  // MoE layers from first_k_dense_replace on run
      {"attention_bias", true, "attention_bias"},
      {"num_key_value_heads", 1, "num_key_value_heads"},
      {"qk_rope_head_dim", 5, "qk_rope_head_dim"},
      {"rope_parameters", {{"rope_type", "longrope"}}, "longrope"},
      {"architectures", {"DeepseekV32ForCausalLM"}, "DeepseekV32ForCausalLM"},
  };
  for (const Case& c : cases) {
    json j = TinyV3();
    j[c.key] = c.value;
    auto parsed = ParseModelConfig(j.dump());
    ASSERT_FALSE(parsed.ok()) << c.key;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_NE(parsed.status().message().find(c.says), std::string::npos) << parsed.status();
  }
}

// The DeepSeek presets: DeepSeek-V2-Lite is 15.7B parameters (15,706,484,224 by the published
// shapes: 27 MLA layers, one dense MLP, 26 layers of 64 experts + 2 shared).
TEST(DeepseekConfigTest, Presets) {
  auto lite = PresetConfig("deepseek-v2-lite");
  ASSERT_TRUE(lite.ok()) << lite.status();
  EXPECT_TRUE(lite->IsMla());
  EXPECT_EQ(lite->q_lora_rank, 0);
  EXPECT_FALSE(lite->IsMoeLayer(0));
  EXPECT_TRUE(lite->IsMoeLayer(1));
  EXPECT_EQ(lite->NumParameters(), 15706484224);
  EXPECT_EQ(lite->rope_scaling.type, kernels::RopeType::kYarn);
  EXPECT_EQ(lite->dtype, WeightDtype::kBF16);
  EXPECT_EQ(lite->num_nextn_predict_layers, 0);
  // The same model with one MTP layer (its parameters not counted: a layer of the drafter).
  auto lite_mtp = PresetConfig("deepseek-v2-lite-mtp");
  ASSERT_TRUE(lite_mtp.ok()) << lite_mtp.status();
  EXPECT_EQ(lite_mtp->num_nextn_predict_layers, 1);
  EXPECT_EQ(lite_mtp->num_hidden_layers, 27);
  EXPECT_EQ(lite_mtp->NumParameters(), 15706484224);
  EXPECT_TRUE(lite_mtp->IsMoeLayer(27));  // the MTP layer, past the model's
  auto v3 = PresetConfig("deepseek-v3-4l");
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->num_experts, 256);
  EXPECT_FALSE(v3->IsMoeLayer(2));
  EXPECT_TRUE(v3->IsMoeLayer(3));
  EXPECT_EQ(v3->q_lora_rank, 1536);
  auto tiny = PresetConfig("tiny-mla");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_TRUE(tiny->IsMla());
  EXPECT_FALSE(tiny->IsMoe());
  EXPECT_NE(PresetConfig("deepseek-v4").status().message().find("deepseek-v2-lite"),
            std::string::npos);
}

// WriteDummyModel's config.json and checkpoint load back as the same MLA model.
TEST(DeepseekConfigTest, DummyModelRoundTrip) {
  auto c = ParseModelConfig(TinyV3().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string dir = ::testing::TempDir() + "/mla_dummy";
  ASSERT_TRUE(WriteDummyModel(*c, dir, 7).ok());
  auto loaded = LoadModelConfig(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(ModelConfigToJson(*loaded), ModelConfigToJson(*c));
  EXPECT_EQ(loaded->NumParameters(), c->NumParameters());
  auto weights = LoadModelWeights(dir, *loaded);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const ModelWeights want = RandomModelWeights(*c, 7);
  ASSERT_EQ(weights->layers.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(weights->layers[l].q_a_proj, want.layers[l].q_a_proj);
    EXPECT_EQ(weights->layers[l].q_proj, want.layers[l].q_proj);
    EXPECT_EQ(weights->layers[l].kv_a_proj, want.layers[l].kv_a_proj);
    EXPECT_EQ(weights->layers[l].kv_b_proj, want.layers[l].kv_b_proj);
    EXPECT_EQ(weights->layers[l].kv_a_layernorm, want.layers[l].kv_a_layernorm);
    EXPECT_EQ(weights->layers[l].o_proj, want.layers[l].o_proj);
    EXPECT_EQ(weights->layers[l].q_proj.size(), 2u * (8 + 4) * 16);
  }
  int64_t elems =
      static_cast<int64_t>(want.embed_tokens.size() + want.norm.size() + want.lm_head.size());
  for (const LayerWeights& w : want.layers) {
    for (const auto* v : {&w.input_layernorm, &w.q_a_proj, &w.q_a_layernorm, &w.q_proj,
                          &w.kv_a_proj, &w.kv_a_layernorm, &w.kv_b_proj, &w.o_proj,
                          &w.post_attention_layernorm, &w.gate_up_proj, &w.down_proj}) {
      elems += static_cast<int64_t>(v->size());
    }
  }
  EXPECT_EQ(elems, c->NumParameters());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::runtime
