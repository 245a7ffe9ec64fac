// Shared by the engine's tests: the tiny model they run the engine on.
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

}  // namespace tandem::runtime::engine_test

#endif  // TANDEM_RUNTIME_ENGINE_ENGINE_TEST_UTIL_H_
