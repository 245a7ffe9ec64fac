// decode_step_bench's --context rows fit the engine (CPU engine, tiny model): a prompt as long as
// the model's max_position_embeddings plus the bench's new tokens is admitted once
// FitDecodeBenchLength has run, and refused without it (the context-8192 rows of issue 31).
#include "runtime/cuda/decode_bench_config.h"

#include <cstdint>
#include <random>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {
namespace {

absl::Status AddBenchRequest(const ModelConfig& model, const EngineConfig& config, int64_t context,
                             int64_t steps, uint32_t seed) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(config, model, RandomModelWeights(model, seed), {}, nullptr);
  if (!engine.ok()) return engine.status();
  RequestSpec spec;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(model.vocab_size) - 1);
  for (int64_t t = 0; t < context; ++t) spec.prompt.push_back(token(rng));
  spec.max_tokens = steps + kDecodeBenchExtraTokens;
  spec.ignore_eos = true;
  return (*engine)->AddRequest(0, spec);
}

TEST(DecodeBenchConfigTest, ContextAtTheModelsPositionLimitIsAdmitted) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  ModelConfig model = *PresetConfig("tiny");
  const int64_t context = model.max_position_embeddings;  // as --context=8192 on Llama 3 shapes
  const int64_t steps = 32;
  EngineConfig config;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.max_model_len = context + steps + kDecodeBenchExtraTokens;

  const absl::Status before = AddBenchRequest(model, config, context, steps, seed);
  EXPECT_EQ(before.code(), absl::StatusCode::kInvalidArgument) << before;

  FitDecodeBenchLength(context, steps, &model, &config.max_model_len);
  EXPECT_EQ(model.max_position_embeddings, context + steps + kDecodeBenchExtraTokens);
  const absl::Status after = AddBenchRequest(model, config, context, steps, seed);
  EXPECT_TRUE(after.ok()) << after;
}

}  // namespace
}  // namespace tandem::runtime::cuda
