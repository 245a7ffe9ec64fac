// DeepSeek MLA golden test: the CPU engine against transformers' DeepseekV2/V3ForCausalLM on the
// fixtures of make_golden_mla.py (tests/golden/fixtures_mla/<variant>/, dense MLP layers: MLA
// alone). f32 tolerances as golden_test.cc: greedy tokens identical, last-prompt logits within
// 1e-4 * max|logit|. Every variant runs each prompt alone (prefill unabsorbed, decode absorbed),
// all prompts as one batch, with chunked prefill (7 tokens: absorbed chunks of <= 4 query
// tokens, unabsorbed longer ones) and the prefix pair (the second prompt's 32-token prefix read
// from the first one's cached latent blocks), and the batch in a pool of 8 latent blocks.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "tests/golden/mla_golden_fixture.h"

namespace tandem::runtime {
namespace {

std::vector<Output> RunEngine(const std::string& variant, const Golden& g, EngineConfig config,
                              const std::vector<int>& order, bool together, int64_t* hits) {
  const std::string dir = kFixtures + variant;
  auto model_config = LoadModelConfig(dir);
  EXPECT_TRUE(model_config.ok()) << model_config.status();
  EXPECT_TRUE(model_config->IsMla());
  auto weights = LoadModelWeights(dir, *model_config);
  EXPECT_TRUE(weights.ok()) << weights.status();
  auto engine = Engine::Create(config, *model_config, std::move(*weights));
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::vector<Output> out(g.prompts.size());
  auto drain = [&] {
    while ((*engine)->HasUnfinished()) {
      auto updates = (*engine)->Step();
      ASSERT_TRUE(updates.ok()) << updates.status();
      for (RequestUpdate& u : *updates) {
        Output& o = out[u.request_id];
        o.tokens.insert(o.tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
        if (!u.last_prompt_logits.empty()) o.logits = std::move(u.last_prompt_logits);
      }
    }
  };
  for (int i : order) {
    RequestSpec spec;
    spec.prompt = g.prompts[i];
    spec.max_tokens = g.max_new_tokens;
    spec.ignore_eos = true;
    spec.capture_last_prompt_logits = true;
    EXPECT_TRUE((*engine)->AddRequest(i, spec).ok());
    if (!together) drain();
  }
  drain();
  if (hits != nullptr) *hits = (*engine)->kv_cache_stats().prefix_hit_tokens;
  return out;
}

void Check(const Golden& g, const std::vector<Output>& out, const std::vector<int>& which,
           const std::string& mode) {
  for (int i : which) {
    SCOPED_TRACE(mode + ", prompt " + std::to_string(i));
    const Output& o = out[i];
    EXPECT_EQ(o.tokens, g.greedy[i]);
    ASSERT_EQ(o.logits.size(), g.logits[i].size());
    float max_ref = 0, worst = 0;
    for (size_t v = 0; v < o.logits.size(); ++v) {
      max_ref = std::max(max_ref, std::fabs(g.logits[i][v]));
      worst = std::max(worst, std::fabs(o.logits[v] - g.logits[i][v]));
    }
    EXPECT_LE(worst, 1e-4f * max_ref) << "max |logit diff| " << worst;
  }
}

class MlaGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MlaGoldenTest, MatchesTransformersAloneBatchedChunkedAndPrefixHit) {
  const Golden g = LoadGolden(GetParam());
  ASSERT_EQ(g.prompts.size(), 10u);
  std::vector<int> all(g.prompts.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  const EngineConfig base;
  Check(g, RunEngine(GetParam(), g, base, all, false, nullptr), all, "alone");
  Check(g, RunEngine(GetParam(), g, base, all, true, nullptr), all, "batch");
  EngineConfig chunked = base;
  chunked.max_num_batched_tokens = 7;
  Check(g, RunEngine(GetParam(), g, chunked, all, true, nullptr), all, "chunked prefill (7)");
  // A pool of 8 latent blocks (the longest request needs 5): the batch runs under preemption by
  // recompute.
  EngineConfig tight = base;
  auto config = LoadModelConfig(std::string(kFixtures) + GetParam());
  ASSERT_TRUE(config.ok()) << config.status();
  tight.kv_cache_bytes = 8 * KvBlockBytes(*config, tight.block_size, KvDtype::kF32);
  Check(g, RunEngine(GetParam(), g, tight, all, true, nullptr), all, "8-block pool");
  int64_t hits = 0;
  auto pair = RunEngine(GetParam(), g, base, g.prefix_pair, false, &hits);
  EXPECT_GE(hits, 32) << "the second prompt must hit the first one's cached latent blocks";
  Check(g, pair, g.prefix_pair, "after a prefix-cache hit");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlaGoldenTest,
                         ::testing::Values("deepseek_v2_f32", "deepseek_v2_lite_f32",
                                           "deepseek_v3_f32", "deepseek_v3_rotate_half_f32"));

// DeepSeek's MoE layer in the whole model (make_golden_deepseek_moe.py): layer 0 dense, layer 1
// sparse (V3 noaux_tc grouped with its correction bias; V2 group_limited_greedy), shared experts.
INSTANTIATE_TEST_SUITE_P(MoeFixtures, MlaGoldenTest,
                         ::testing::Values("deepseek_v3_moe_f32", "deepseek_v2_moe_f32"));

// The latent cache: one row of kv_lora_rank + qk_rope_head_dim per token and layer, 1/16.9 of
// what per-head K and V of the same heads would take (4 heads x (24 + 12) values vs 40).
TEST(MlaKvLayoutTest, OneLatentRowPerTokenAndLayer) {
  auto config = LoadModelConfig(std::string(kFixtures) + "deepseek_v3_f32");
  ASSERT_TRUE(config.ok()) << config.status();
  const kernels::KvCacheLayout layout = KvLayoutForModel(*config, 8, 16, KvHeadShare{0, 2});
  EXPECT_EQ(layout.num_planes, 1);
  EXPECT_EQ(layout.num_kv_heads, 1);
  EXPECT_EQ(layout.head_dim, 32 + 8);
  EXPECT_EQ(KvBlockBytes(*config, 16, KvDtype::kBf16), 2 * 16 * 40 * 2);
}

}  // namespace
}  // namespace tandem::runtime
