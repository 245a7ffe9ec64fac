// Engine behaviour on a small random-weight model: batching, chunked prefill, prefix-cache
// hits, preemption and thread count never change greedy outputs; seeded sampling is
// reproducible across batch compositions; bad requests are rejected before anything runs.
// (Agreement with Hugging Face transformers is checked by //tests/golden.)
#include "runtime/engine/engine.h"

#include <cmath>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {
namespace {

using engine_test::TinyConfig;

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  FinishReason reason = FinishReason::kNone;
};

// Runs every prompt to completion in one engine; returns results in prompt order.
std::vector<Result> RunAll(const EngineConfig& config, const std::vector<RequestSpec>& specs,
                           uint64_t weight_seed = 1234) {
  const ModelConfig model = TinyConfig();
  auto engine = Engine::Create(config, model, RandomModelWeights(model, weight_seed));
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::vector<Result> results(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), specs[i]).ok());
  }
  for (int guard = 0; (*engine)->HasUnfinished() && guard < 10000; ++guard) {
    auto updates = (*engine)->Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    for (RequestUpdate& u : *updates) {
      Result& r = results[u.request_id];
      r.tokens.insert(r.tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      if (!u.last_prompt_logits.empty()) r.logits = std::move(u.last_prompt_logits);
      if (u.finish_reason != FinishReason::kNone) r.reason = u.finish_reason;
    }
  }
  EXPECT_FALSE((*engine)->HasUnfinished());
  EXPECT_EQ((*engine)->kv_cache_stats().num_free_blocks, (*engine)->num_kv_blocks())
      << "every block must return to the pool";
  return results;
}

std::vector<RequestSpec> MixedPrompts(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<RequestSpec> specs;
  for (int i = 0; i < n; ++i) {
    RequestSpec spec;
    const int len = 1 + static_cast<int>(rng() % 45);
    for (int t = 0; t < len; ++t) spec.prompt.push_back(static_cast<int32_t>(rng() % 256));
    spec.max_tokens = 4 + static_cast<int>(rng() % 12);
    spec.ignore_eos = true;
    spec.capture_last_prompt_logits = true;
    specs.push_back(std::move(spec));
  }
  return specs;
}

void ExpectSame(const std::vector<Result>& a, const std::vector<Result>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << ": prompt " << i;
    ASSERT_EQ(a[i].logits.size(), b[i].logits.size()) << what << ": prompt " << i;
    float max_abs = 0, max_diff = 0;
    for (size_t v = 0; v < a[i].logits.size(); ++v) {
      max_abs = std::max(max_abs, std::fabs(a[i].logits[v]));
      max_diff = std::max(max_diff, std::fabs(a[i].logits[v] - b[i].logits[v]));
    }
    EXPECT_LE(max_diff, 1e-4f * max_abs + 1e-5f) << what << ": prompt " << i;
  }
}

TEST(EngineTest, BatchingChunkingPrefixAndThreadsDoNotChangeOutputs) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  const std::vector<RequestSpec> specs = MixedPrompts(seed, 8);

  // Reference: each prompt alone.
  std::vector<Result> alone;
  EngineConfig base;
  for (const RequestSpec& s : specs) alone.push_back(RunAll(base, {s})[0]);
  for (const Result& r : alone) {
    EXPECT_EQ(r.reason, FinishReason::kLength);
    EXPECT_EQ(r.logits.size(), 256u);
  }

  ExpectSame(alone, RunAll(base, specs), "batch of 8");
  EngineConfig chunked = base;
  chunked.max_num_batched_tokens = 7;
  ExpectSame(alone, RunAll(chunked, specs), "chunked prefill (7 tokens)");
  EngineConfig one_thread = base;
  one_thread.num_threads = 1;
  ExpectSame(alone, RunAll(one_thread, specs), "1 thread");
  EngineConfig three_threads = base;
  three_threads.num_threads = 3;
  ExpectSame(alone, RunAll(three_threads, specs), "3 threads");
  // Tiny pool: 8 requests of up to ~60 tokens cannot all fit, forcing preemption.
  EngineConfig tight = base;
  tight.block_size = 4;
  tight.kv_cache_bytes = 40 * (2 * 2 * 4 * 2 * 16 * 4);  // 40 blocks of the tiny model
  ExpectSame(alone, RunAll(tight, specs), "preemption under a small KV pool");
}

TEST(EngineTest, PrefixCacheHitGivesSameOutputs) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::vector<RequestSpec> specs = MixedPrompts(seed, 1);
  specs[0].prompt.resize(1);
  std::mt19937 rng(seed);
  while (specs[0].prompt.size() < 40) specs[0].prompt.push_back(rng() % 256);
  // The same prompt twice in a row: the second run hits the cache for 32 of 40 tokens
  // (two full 16-token blocks; at least one token is always recomputed).
  EngineConfig config;
  config.max_num_seqs = 1;
  std::vector<Result> twice = RunAll(config, {specs[0], specs[0]});
  ExpectSame({twice[0]}, {twice[1]}, "prefix-cache hit");
}

TEST(EngineTest, SeededSamplingIsReproducibleAcrossBatches) {
  std::vector<RequestSpec> specs = MixedPrompts(99, 6);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].sampling.temperature = 0.9f;
    specs[i].sampling.top_p = 0.9f;
    specs[i].sampling.top_k = 50;
    specs[i].sampling.seed = 1000 + i;
  }
  EngineConfig base;
  std::vector<Result> batch = RunAll(base, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(RunAll(base, {specs[i]})[0].tokens, batch[i].tokens) << "prompt " << i;
  }
}

TEST(EngineTest, RejectsBadRequestsBeforeAllocating) {
  const ModelConfig model = TinyConfig();
  EngineConfig config;
  auto engine = Engine::Create(config, model, RandomModelWeights(model, 1));
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  RequestSpec empty;
  EXPECT_EQ(e.AddRequest(1, empty).code(), absl::StatusCode::kInvalidArgument);
  RequestSpec oov;
  oov.prompt = {1, 2, 256};
  absl::Status s = e.AddRequest(2, oov);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("256"), std::string::npos) << s;
  RequestSpec negative;
  negative.prompt = {-1};
  EXPECT_EQ(e.AddRequest(3, negative).code(), absl::StatusCode::kInvalidArgument);
  RequestSpec too_long;
  too_long.prompt.assign(250, 5);
  too_long.max_tokens = 10;
  s = e.AddRequest(4, too_long);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("maximum length"), std::string::npos) << s;
  RequestSpec zero_tokens;
  zero_tokens.prompt = {1};
  zero_tokens.max_tokens = 0;
  EXPECT_EQ(e.AddRequest(5, zero_tokens).code(), absl::StatusCode::kInvalidArgument);
  RequestSpec bad_sampling;
  bad_sampling.prompt = {1};
  bad_sampling.sampling.temperature = -1;
  EXPECT_EQ(e.AddRequest(6, bad_sampling).code(), absl::StatusCode::kInvalidArgument);
  RequestSpec bad_stop;
  bad_stop.prompt = {1};
  bad_stop.stop_token_ids = {9999};
  EXPECT_EQ(e.AddRequest(7, bad_stop).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(e.HasUnfinished()) << "rejected requests must not be queued";
  EXPECT_EQ(e.kv_cache_stats().num_free_blocks, e.num_kv_blocks());
}

TEST(EngineTest, AbortMidGenerationFreesBlocks) {
  const ModelConfig model = TinyConfig();
  auto engine = Engine::Create(EngineConfig{}, model, RandomModelWeights(model, 3));
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  RequestSpec spec;
  spec.prompt.assign(40, 7);
  spec.max_tokens = 100;
  spec.ignore_eos = true;
  ASSERT_TRUE(e.AddRequest(1, spec).ok());
  ASSERT_TRUE(e.AddRequest(2, spec).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(e.Step().ok());
  EXPECT_LT(e.kv_cache_stats().num_free_blocks, e.num_kv_blocks());
  EXPECT_TRUE(e.Abort(1));
  EXPECT_TRUE(e.Abort(2));
  EXPECT_FALSE(e.Abort(2));
  EXPECT_FALSE(e.HasUnfinished());
  EXPECT_EQ(e.kv_cache_stats().num_free_blocks, e.num_kv_blocks());
}

TEST(EngineTest, StopsOnEosUnlessIgnored) {
  ModelConfig model = TinyConfig();
  // Find the greedy first token of a prompt, then declare it the eos token.
  RequestSpec spec;
  spec.prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  spec.max_tokens = 8;
  spec.ignore_eos = true;
  EngineConfig config;
  const int32_t first = RunAll(config, {spec})[0].tokens[0];
  model.eos_token_ids = {first};
  for (bool ignore : {false, true}) {
    auto engine = Engine::Create(config, model, RandomModelWeights(model, 1234));
    ASSERT_TRUE(engine.ok());
    spec.ignore_eos = ignore;
    ASSERT_TRUE((*engine)->AddRequest(1, spec).ok());
    int produced = 0;
    FinishReason reason = FinishReason::kNone;
    while ((*engine)->HasUnfinished()) {
      auto updates = (*engine)->Step();
      ASSERT_TRUE(updates.ok());
      for (const RequestUpdate& u : *updates) {
        produced += static_cast<int>(u.new_token_ids.size());
        if (u.finish_reason != FinishReason::kNone) reason = u.finish_reason;
      }
    }
    EXPECT_EQ(reason, ignore ? FinishReason::kLength : FinishReason::kEos);
    EXPECT_EQ(produced, ignore ? 8 : 1);
  }
}

}  // namespace
}  // namespace tandem::runtime
