// quantization_config parsing (model_config_quant.cc): the FP8 schemes accepted, and everything
// else refused naming the scheme and the supported ones.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config.h"

namespace tandem::runtime {
namespace {

using json = nlohmann::json;
using kernels::Fp8ActivationScheme;
using Method = WeightQuantization::Method;

json Llama() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 256},
          {"hidden_size", 256},
          {"intermediate_size", 192},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2}};
}

// Llama() with every layer's MLP four experts, two a token.
json Mixtral() {
  json mixtral = Llama();
  mixtral["architectures"] = {"MixtralForCausalLM"};
  mixtral["model_type"] = "mixtral";
  mixtral["num_local_experts"] = 4;
  mixtral["num_experts_per_tok"] = 2;
  return mixtral;
}

absl::StatusOr<ModelConfig> WithQuant(json quant, json root = Llama()) {
  root["quantization_config"] = std::move(quant);
  return ParseModelConfig(root.dump());
}

json CtGroup(const std::string& weights, json input) {
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", weights}}},
              {"input_activations", input}}}}}};
}

json Act(const std::string& strategy, bool dynamic) {
  return {{"num_bits", 8}, {"type", "float"}, {"strategy", strategy}, {"dynamic", dynamic}};
}

TEST(QuantizationConfigTest, AcceptedSchemes) {
  auto none = ParseModelConfig(Llama().dump());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->quantization.IsFp8());
  EXPECT_EQ(none->quantization.Describe(), "none");

  auto block = WithQuant({{"quant_method", "fp8"},
                          {"activation_scheme", "dynamic"},
                          {"weight_block_size", {128, 128}}});
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->quantization.method, Method::kFp8Block);
  EXPECT_EQ(block->quantization.block_rows, 128);
  EXPECT_EQ(block->quantization.activation, Fp8ActivationScheme::kDynamicGroup128);

  auto channel = WithQuant(CtGroup("channel", Act("token", true)));
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_EQ(channel->quantization.block_rows, 1);
  EXPECT_EQ(channel->quantization.activation, Fp8ActivationScheme::kDynamicToken);

  auto tensor = WithQuant(CtGroup("tensor", Act("tensor", false)));
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->quantization.activation, Fp8ActivationScheme::kStaticTensor);

  json ct_block = CtGroup("block", json());
  ct_block["config_groups"]["group_0"]["weights"]["block_structure"] = {128, 128};
  ct_block["config_groups"]["group_0"]["input_activations"] = Act("group", true);
  ct_block["config_groups"]["group_0"]["input_activations"]["group_size"] = 128;
  auto ctb = WithQuant(ct_block);
  ASSERT_TRUE(ctb.ok()) << ctb.status();
  EXPECT_EQ(ctb->quantization.Describe(),
            "fp8 compressed-tensors: 128x128 block weight scales, dynamic 1x128-group "
            "activations");

  auto w8a16 = WithQuant(CtGroup("channel", json()));
  ASSERT_TRUE(w8a16.ok()) << w8a16.status();
  EXPECT_EQ(w8a16->quantization.activation, Fp8ActivationScheme::kNone);

  // modelopt: flat (config.json) and nested (hf_quant_config.json's "quantization").
  auto flat = WithQuant({{"quant_method", "modelopt"}, {"quant_algo", "FP8"}});
  auto nested =
      WithQuant({{"quant_method", "modelopt"},
                 {"quantization", {{"quant_algo", "FP8"}, {"exclude_modules", {"lm_head"}}}}});
  ASSERT_TRUE(flat.ok() && nested.ok()) << flat.status() << nested.status();
  EXPECT_EQ(nested->quantization.method, Method::kModelOpt);
  EXPECT_EQ(nested->quantization.activation, Fp8ActivationScheme::kStaticTensor);
  EXPECT_FALSE(nested->quantization.kv_cache_fp8);
}

// TensorRT Model Optimizer's other FP8 algorithms (any case, as vLLM reads them), its KV-cache
// quantization in both of its spellings, compressed-tensors' kv_cache_scheme, and modelopt's
// fnmatch exclude_modules.
TEST(QuantizationConfigTest, ModelOptAlgorithmsAndKvCacheSchemes) {
  auto pcpt = WithQuant({{"quant_method", "modelopt"},
                         {"quantization", {{"quant_algo", "FP8_PER_CHANNEL_PER_TOKEN"}}}});
  ASSERT_TRUE(pcpt.ok()) << pcpt.status();
  EXPECT_EQ(pcpt->quantization.Describe(),
            "fp8 modelopt: per-channel weight scales, dynamic per-token activations");
  auto pb = WithQuant({{"quant_method", "modelopt"}, {"quant_algo", "fp8_pb_wo"}});
  ASSERT_TRUE(pb.ok()) << pb.status();
  EXPECT_EQ(pb->quantization.Describe(),
            "fp8 modelopt: 128x128 block weight scales, dynamic 1x128-group activations");

  // hf_quant_config.json's KV algorithm (nested), and config.json's flat kv_cache_scheme.
  auto kv = WithQuant({{"quant_method", "modelopt"},
                       {"quantization", {{"quant_algo", "FP8"}, {"kv_cache_quant_algo", "fp8"}}}});
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_TRUE(kv->quantization.kv_cache_fp8);
  EXPECT_EQ(kv->quantization.Describe(),
            "fp8 modelopt: per-tensor weight scales, static per-tensor activations; FP8 KV "
            "scales (unused)");
  const json fp8_kv = {{"num_bits", 8},
                       {"type", "float"},
                       {"strategy", "tensor"},
                       {"dynamic", false},
                       {"symmetric", true}};
  auto flat = WithQuant({{"quant_method", "modelopt"},
                         {"quant_algo", "FP8"},
                         {"kv_cache_scheme", fp8_kv},
                         {"ignore", {"lm_head", "model.layers.*.mlp.gate"}}});
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_TRUE(flat->quantization.kv_cache_fp8);
  EXPECT_EQ(flat->quantization.ignore,
            std::vector<std::string>({"lm_head", "re:model\\.layers\\..*\\.mlp\\.gate$"}));
  json ct = CtGroup("channel", Act("token", true));
  ct["kv_cache_scheme"] = fp8_kv;
  auto ct_kv = WithQuant(ct);
  ASSERT_TRUE(ct_kv.ok()) << ct_kv.status();
  EXPECT_TRUE(ct_kv->quantization.kv_cache_fp8);
  ct["kv_cache_scheme"] = nullptr;
  ASSERT_TRUE(WithQuant(ct).ok());
  EXPECT_FALSE(WithQuant(ct)->quantization.kv_cache_fp8);
}

TEST(QuantizationConfigTest, UnsupportedSchemesAreRefusedNamingThem) {
  const std::string supported =
      " (supported: \"fp8\" with weight_block_size [128, 128], \"compressed-tensors\" float "
      "8-bit (tensor / channel / block weights), \"modelopt\" FP8 / FP8_PER_CHANNEL_PER_TOKEN / "
      "FP8_PB_WO; KV scales of 8-bit float per tensor)";
  EXPECT_EQ(WithQuant({{"quant_method", "awq"}, {"bits", 4}}).status().message(),
            "quantization_config: unsupported quant_method 'awq'" + supported);
  EXPECT_EQ(WithQuant({{"quant_method", "fp8"}}).status().message(),
            "quantization_config: fp8 without weight_block_size (per-tensor \"fp8\" checkpoints: "
            "not supported)" +
                supported);
  EXPECT_EQ(
      WithQuant({{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}}).status().message(),
      "quantization_config: fp8 weight_block_size [64,64] (only [128, 128] blocks)" + supported);
  EXPECT_EQ(WithQuant({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}).status().message(),
            "quantization_config: modelopt quant_algo 'NVFP4' (FP8, FP8_PER_CHANNEL_PER_TOKEN or "
            "FP8_PB_WO)" +
                supported);
  EXPECT_EQ(
      WithQuant(
          {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"kv_cache_quant_algo", "NVFP4"}})
          .status()
          .message(),
      "quantization_config: modelopt kv_cache_quant_algo \"NVFP4\" (FP8 only)" + supported);
  // KV schemes other than 8-bit float per tensor, and fields of the wrong type (never a throw).
  json ct_kv = CtGroup("channel", Act("token", true));
  ct_kv["kv_cache_scheme"] = {{"num_bits", 8}, {"type", "int"}, {"strategy", "tensor"}};
  EXPECT_EQ(WithQuant(ct_kv).status().message(),
            "quantization_config: compressed-tensors kv_cache_scheme "
            "{\"num_bits\":8,\"strategy\":\"tensor\",\"type\":\"int\"} (8-bit float with "
            "static per-tensor scales only)" +
                supported);
  ct_kv["kv_cache_scheme"] = {{"num_bits", 8}, {"type", "float"}, {"strategy", "attn_head"}};
  EXPECT_NE(WithQuant(ct_kv).status().message().find("kv_cache_scheme"), std::string::npos);
  ct_kv["kv_cache_scheme"] = "fp8";
  EXPECT_NE(WithQuant(ct_kv).status().message().find("kv_cache_scheme \"fp8\""), std::string::npos);
  json local = CtGroup(
      "channel", {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", "local"}});
  EXPECT_NE(WithQuant(local).status().message().find("input_activations"), std::string::npos);
  json grouped = CtGroup("channel", {{"num_bits", 8},
                                     {"type", "float"},
                                     {"strategy", "group"},
                                     {"dynamic", true},
                                     {"group_size", "128"}});
  EXPECT_NE(WithQuant(grouped).status().message().find("input_activations"), std::string::npos);
  EXPECT_EQ(WithQuant(CtGroup("group", Act("token", true))).status().message(),
            "quantization_config: compressed-tensors weight strategy 'group' (tensor, channel or "
            "block)" +
                supported);
  json int8 = CtGroup("channel", Act("token", true));
  int8["config_groups"]["group_0"]["weights"]["type"] = "int";
  EXPECT_NE(WithQuant(int8).status().message().find("(8-bit float only)"), std::string::npos);
  EXPECT_NE(WithQuant(CtGroup("channel", Act("token", false)))
                .status()
                .message()
                .find("input_activations"),
            std::string::npos);
  // Ignore lists are kept for the loader, which refuses entries naming an FP8 projection
  // (weight_fp8.cc; ct_moe_golden_test); entries must be names or valid "re:" regexes.
  json ignore = CtGroup("channel", Act("token", true));
  ignore["ignore"] = {"lm_head", "re:.*mlp.gate$", "model.layers.0.mlp.down_proj"};
  absl::StatusOr<ModelConfig> kept = WithQuant(ignore);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->quantization.ignore, std::vector<std::string>({"lm_head", "re:.*mlp.gate$",
                                                                 "model.layers.0.mlp.down_proj"}));
  ignore["ignore"] = {"lm_head", 3};
  EXPECT_EQ(
      WithQuant(ignore).status().message(),
      "quantization_config: ignore entry 3 is not a module name or \"re:\" regex" + supported);
  ignore["ignore"] = {"re:(.*mlp.gate"};
  EXPECT_EQ(WithQuant(ignore).status().message(),
            "quantization_config: ignore entry 're:(.*mlp.gate' is not a valid regex" + supported);
}

TEST(QuantizationConfigTest, Fp8MixtureOfExpertsConfigParses) {
  // MoE experts have an FP8 path on the CPU backend (weight_fp8.cc, kernels/moe FusedMoe).
  absl::StatusOr<ModelConfig> config = WithQuant(CtGroup("channel", Act("token", true)), Mixtral());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->IsMoe());
  EXPECT_EQ(config->quantization.Describe(),
            "fp8 compressed-tensors: per-channel weight scales, dynamic per-token activations");
}

// What a GPU holds of the weights (sizing a --kv_cache_bytes=0 KV pool). Llama()'s projections
// a layer: q/k/v 512 x 256, o 256 x 256, gate/up 384 x 256, down 256 x 192: 344064 weights,
// 688128 bytes in 16 bits; in FP8 344064 bytes plus 4 a scale; two layers.
TEST(QuantizationConfigTest, DeviceWeightBytesCountFp8ProjectionsAtOneByte) {
  absl::StatusOr<ModelConfig> bf16 = ParseModelConfig(Llama().dump());
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->DeviceWeightBytes(), 2 * bf16->NumParameters());
  // Per-channel: a scale a row, 512 + 256 + 384 + 256.
  absl::StatusOr<ModelConfig> channel = WithQuant(CtGroup("channel", Act("token", true)));
  ASSERT_TRUE(channel.ok());
  EXPECT_EQ(channel->DeviceWeightBytes(),
            2 * channel->NumParameters() - 2 * (688128 - 344064 - 4 * 1408));
  // 128 x 128 blocks (k 256 and 192: two column blocks): a scale a row and column block, plus
  // cuBLASLt's copy, 6 a 128-row block: 1024 + 4 x 6 + 512 + 2 x 6 + 768 + 3 x 6 + 512 + 2 x 6.
  absl::StatusOr<ModelConfig> block = WithQuant({{"quant_method", "fp8"},
                                                 {"activation_scheme", "dynamic"},
                                                 {"weight_block_size", {128, 128}}});
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->DeviceWeightBytes(),
            2 * block->NumParameters() - 2 * (688128 - 344064 - 4 * 2882));
  // Experts stay at 2 bytes a parameter: only q/k/v/o (196608 weights a layer) count 1.
  absl::StatusOr<ModelConfig> moe = WithQuant(CtGroup("channel", Act("token", true)), Mixtral());
  ASSERT_TRUE(moe.ok());
  EXPECT_EQ(moe->DeviceWeightBytes(),
            2 * moe->NumParameters() - 2 * (2 * 196608 - 196608 - 4 * 768));
}

}  // namespace
}  // namespace tandem::runtime
