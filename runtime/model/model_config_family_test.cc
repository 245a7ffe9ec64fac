// config.json of the families beyond Llama/Qwen2 (Mistral, Qwen3, Mixtral, Qwen2-MoE,
// Qwen3-MoE): published configs parse to the right model, transformers' defaults fill absent
// fields, both RoPE spellings load, the MoE layer pattern (decoder_sparse_step, mlp_only_layers)
// is transformers', impossible MoE configs are refused naming the numbers, and the JSON we write
// for dummy models parses back to the same config.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// Qwen3-30B-A3B's config.json as published (transformers 4.51).
constexpr char kQwen3Moe[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// Mixtral-8x7B-v0.1's config.json as published.
constexpr char kMixtral[] = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})";

// Qwen1.5-MoE-A2.7B's config.json as published.
constexpr char kQwen2Moe[] = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
  "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
  "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60,
  "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
  "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.39.0.dev0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

absl::StatusOr<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump()); }

void ExpectError(const json& j, const std::string& needle) {
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_FALSE(c.ok()) << j.dump();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(needle));
}

TEST(ModelConfigFamilyTest, Qwen3MoeAsPublished) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3Moe);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen3MoeForCausalLM");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias || c->o_bias || c->mlp_bias);
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->moe_intermediate_size, 768);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->shared_expert_intermediate_size, 0);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  for (int64_t l = 0; l < 48; ++l) EXPECT_TRUE(c->IsMoeLayer(l)) << l;
  EXPECT_FALSE(c->MixtralExpertNames());
  // About 30.5B parameters (the model's name says 30B, 3B active).
  EXPECT_NEAR(static_cast<double>(c->NumParameters()), 30.53e9, 0.05e9);
}

TEST(ModelConfigFamilyTest, MixtralAsPublished) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kMixtral);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 14336);  // Mixtral's experts are intermediate_size wide
  EXPECT_TRUE(c->norm_topk_prob);              // always renormalised
  EXPECT_TRUE(c->MixtralExpertNames());
  EXPECT_FALSE(c->qk_norm || c->qkv_bias || c->o_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->max_position_embeddings, 32768);  // sliding_window null: not limited
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_NEAR(static_cast<double>(c->NumParameters()), 46.70e9, 0.05e9);  // "8x7B" is 46.7B
}

TEST(ModelConfigFamilyTest, Qwen2MoeAsPublished) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen2Moe);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 60);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->moe_intermediate_size, 1408);
  EXPECT_EQ(c->shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias || c->qk_norm);
  EXPECT_NEAR(static_cast<double>(c->NumParameters()), 14.32e9, 0.05e9);  // Qwen1.5-MoE: 14.3B
}

TEST(ModelConfigFamilyTest, DenseMistralAndQwen3) {
  // MistralConfig's defaults (Mistral-7B-v0.1 shape) with its sliding window of 4096: the
  // context is limited to the window, where sliding-window attention is full attention.
  absl::StatusOr<ModelConfig> m =
      ParseModelConfig(R"({"architectures": ["MistralForCausalLM"], "sliding_window": 4096})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_key_value_heads, 8);
  EXPECT_EQ(m->intermediate_size, 14336);
  EXPECT_EQ(m->max_position_embeddings, 4096);
  EXPECT_FALSE(m->IsMoe() || m->qk_norm || m->qkv_bias);
  EXPECT_EQ(m->eos_token_ids, std::vector<int32_t>{2});
  m = ParseModelConfig(R"({"model_type": "mistral", "sliding_window": null})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->max_position_embeddings, 131072);

  // Qwen3Config's defaults: head_dim 128 whatever hidden / heads; attention_bias covers o_proj.
  absl::StatusOr<ModelConfig> q = ParseModelConfig(
      R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "num_attention_heads": 16,
          "num_key_value_heads": 8, "attention_bias": true,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
          "layer_types": ["full_attention", "full_attention"], "num_hidden_layers": 2})");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->head_dim, 128);
  EXPECT_TRUE(q->qk_norm && q->qkv_bias && q->o_bias);
  EXPECT_DOUBLE_EQ(q->rope_theta, 1e6);
  EXPECT_FALSE(q->eos_token_ids.size());  // no LlamaConfig token defaults
  ExpectError(json{{"architectures", {"Qwen3ForCausalLM"}}, {"use_sliding_window", true}},
              "use_sliding_window is true");
}

TEST(ModelConfigFamilyTest, SparseLayerPattern) {
  json j = json::parse(kQwen3Moe);
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  // transformers: sparse when l not in mlp_only_layers and (l + 1) % step == 0.
  const bool want[] = {false, true, false, false, false, true};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(c->IsMoeLayer(l), want[l]) << l;
}

TEST(ModelConfigFamilyTest, ImpossibleMoeConfigsNameTheNumbers) {
  json j = json::parse(kQwen3Moe);
  j["num_experts_per_tok"] = 129;
  ExpectError(j, "num_experts_per_tok (129) must be in [1, num_experts = 128]");
  j = json::parse(kMixtral);
  j["num_local_experts"] = 0;
  ExpectError(j, "is a mixture of experts (num_experts 0)");
  j = json::parse(kQwen3Moe);
  j["mlp_only_layers"] = {48};
  ExpectError(j, "mlp_only_layers entry 48 is not a layer in [0, 48)");
  j = json::parse(kQwen3Moe);
  j["decoder_sparse_step"] = 0;
  ExpectError(j, "decoder_sparse_step must be >= 1, got 0");
  j = json::parse(kQwen3Moe);
  j["moe_intermediate_size"] = "768";
  ExpectError(j, "config field 'moe_intermediate_size' must be an integer");
  // TP must divide every expert's width and the shared expert's.
  j = json::parse(kQwen2Moe);
  j["moe_intermediate_size"] = 1410;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<TpDims> d = ComputeTpDims(*c, TpShard{0, 4});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("--tp=4 does not divide the model's expert intermediate size 1410"));
  c = ParseModelConfig(kQwen2Moe);
  ASSERT_TRUE(c.ok());
  d = ComputeTpDims(*c, TpShard{1, 2});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->moe_intermediate, 704);
  EXPECT_EQ(d->moe_intermediate_begin, 704);
  EXPECT_EQ(d->shared_intermediate, 2816);
  absl::StatusOr<ModelConfig> local = LocalModelConfig(*c, TpShard{1, 2});
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->moe_intermediate_size, 704);
  EXPECT_EQ(local->shared_expert_intermediate_size, 2816);
  EXPECT_EQ(local->num_experts, 60);  // every rank holds a slice of every expert
}

TEST(ModelConfigFamilyTest, WrittenJsonParsesBack) {
  for (const char* text : {kQwen3Moe, kMixtral, kQwen2Moe}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
    ASSERT_TRUE(c.ok()) << c.status();
    if (!c->MixtralExpertNames()) c->mlp_only_layers = {1};  // Mixtral has no dense layers
    absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c));
    ASSERT_TRUE(back.ok()) << back.status() << ModelConfigToJson(*c);
    EXPECT_EQ(back->architecture, c->architecture);
    EXPECT_EQ(back->num_experts, c->num_experts);
    EXPECT_EQ(back->num_experts_per_tok, c->num_experts_per_tok);
    EXPECT_EQ(back->moe_intermediate_size, c->moe_intermediate_size);
    EXPECT_EQ(back->shared_expert_intermediate_size, c->shared_expert_intermediate_size);
    EXPECT_EQ(back->norm_topk_prob, c->norm_topk_prob);
    EXPECT_EQ(back->qk_norm, c->qk_norm);
    EXPECT_EQ(back->qkv_bias, c->qkv_bias);
    EXPECT_EQ(back->NumParameters(), c->NumParameters()) << c->architecture;
  }
}

// DeepSeek's MoE fields (model_config_mla.cc): layers from first_k_dense_replace on sparse, V3
// noaux_tc (its defaults), V2 greedy / group_limited_greedy, and what is refused.
TEST(ModelConfigFamilyTest, DeepseekMoeLayers) {
  json v3 = {{"architectures", {"DeepseekV3ForCausalLM"}},
             {"vocab_size", 96},
             {"hidden_size", 32},
             {"intermediate_size", 48},
             {"num_hidden_layers", 3},
             {"num_attention_heads", 2},
             {"num_key_value_heads", 2},
             {"first_k_dense_replace", 1},
             {"n_routed_experts", 8},
             {"moe_intermediate_size", 16},
             {"n_group", 4},
             {"topk_group", 2},
             {"num_experts_per_tok", 3},
             {"q_lora_rank", 16},
             {"kv_lora_rank", 12},
             {"qk_nope_head_dim", 8},
             {"qk_rope_head_dim", 4},
             {"v_head_dim", 6}};
  absl::StatusOr<ModelConfig> c = Parse(v3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe_router, ModelConfig::MoeRouter::kDeepseekV3);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_TRUE(c->IsMoeLayer(1) && c->IsMoeLayer(2));
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 3);
  EXPECT_EQ(c->shared_expert_intermediate_size, 16);  // V3: 1 shared expert by default
  EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 2.5);    // V3's default
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->num_expert_groups, 4);
  EXPECT_EQ(c->topk_expert_groups, 2);
  EXPECT_TRUE(c->DeepseekMoe());
  // The written config parses back to the same MoE layers.
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->num_experts, 8);
  EXPECT_EQ(back->mlp_only_layers, c->mlp_only_layers);
  EXPECT_EQ(back->NumParameters(), c->NumParameters());

  json v2 = v3;
  v2["architectures"] = {"DeepseekV2ForCausalLM"};
  v2["topk_method"] = "greedy";
  v2["norm_topk_prob"] = true;
  c = Parse(v2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe_router, ModelConfig::MoeRouter::kDeepseekV2);
  EXPECT_FALSE(c->norm_topk_prob);                    // V2 ignores it
  EXPECT_EQ(c->num_expert_groups, 1);                 // greedy: no groups
  EXPECT_EQ(c->shared_expert_intermediate_size, 32);  // V2: 2 shared experts by default
  v2["topk_method"] = "group_limited_greedy";
  c = Parse(v2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_expert_groups, 4);
  v2["n_shared_experts"] = nullptr;
  c = Parse(v2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shared_expert_intermediate_size, 0);

  v2["topk_method"] = "noaux";
  ExpectError(v2, "unsupported topk_method 'noaux'");
  json bad = v3;
  bad["n_group"] = 3;
  ExpectError(bad, "n_group (3) must divide n_routed_experts (8)");
  bad = v3;
  bad["moe_layer_freq"] = 2;
  ExpectError(bad, "unsupported moe_layer_freq 2");
  bad = v3;
  bad["num_experts_per_tok"] = 9;
  ExpectError(bad, "num_experts_per_tok (9) must be in [1, num_experts = 8]");
}

}  // namespace
}  // namespace tandem::runtime
