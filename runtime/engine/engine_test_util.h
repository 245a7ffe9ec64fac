// Shared by the engine's tests (and the CUDA backend's): the small models they run the engine on.
#ifndef TANDEM_RUNTIME_ENGINE_ENGINE_TEST_UTIL_H_
#define TANDEM_RUNTIME_ENGINE_ENGINE_TEST_UTIL_H_

#include <cstdint>

#include "gtest/gtest.h"
#include "runtime/model/model_config.h"

namespace tandem::runtime::engine_test {

// The "tiny" preset (hidden 64, 2 layers, vocab 256) with a 256-token context and `vocab`
// tokens.
inline ModelConfig TinyConfig(int64_t vocab = 256) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  ModelConfig c = *config;
  c.max_position_embeddings = 256;
  c.vocab_size = vocab;
  return c;
}

// A Llama 2-layer model large enough for the CUDA kernels' real shapes (hidden 512, 8 query and
// 2 KV heads of 128, intermediate 1024, vocab 1024, 1024-token context, eos 2): the CUDA
// backend's engine tests.
inline ModelConfig MidConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 1024;
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 1024;
  c.eos_token_ids = {2};
  return c;
}

// The "tiny-moe" preset (Qwen3-MoE, 8 experts, top-2, two sparse layers); `forced`: top-1 (with
// zeroed routers expert 0 then takes every token). The expert-parallel tests.
inline ModelConfig TinyMoeConfig(bool forced) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny-moe");
  EXPECT_TRUE(config.ok()) << config.status();
  ModelConfig c = *config;
  if (forced) c.num_experts_per_tok = 1;
  return c;
}

}  // namespace tandem::runtime::engine_test

#endif  // TANDEM_RUNTIME_ENGINE_ENGINE_TEST_UTIL_H_
