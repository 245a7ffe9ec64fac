// Golden-model test: the CPU engine against Hugging Face transformers' recorded outputs on the
// committed fixtures (tests/golden/fixtures/<variant>/, made by make_golden.py).
//
// Every variant runs four ways: each prompt alone, all prompts as one continuous batch,
// chunked prefill (7-token budget), and the prefix pair in sequence (the second prompt hits the
// first one's cached 32-token prefix). Tolerances (README.md):
//   f32 models:      greedy tokens identical; last-prompt logits within 1e-4 * max|logit|.
//   bf16/f16 models: cosine >= 0.999 against transformers' own bf16/f16 logits; top-1 agreement
//                    wherever transformers' top-2 gap is at least 3% (bf16) / 0.5% (f16) of
//                    max|logit| (below that, its reduced-precision rounding decides the order);
//                    and, since we compute in fp32, the logits of transformers' fp32 run of the
//                    same stored weights within 1e-4 * max|logit| with identical top-1.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "tests/golden/logit_compare.h"

namespace tandem::runtime {
namespace {

constexpr char kFixtures[] = "tests/golden/fixtures/";

struct Golden {
  std::string dtype;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<float>> logits_f32_compute;  // bf16/f16 only
  std::vector<std::vector<int32_t>> greedy;
  std::vector<int> prefix_pair;
  int max_new_tokens = 0;
};

Golden LoadGolden(const std::string& variant) {
  std::ifstream in(kFixtures + variant + "/expected.json");
  EXPECT_TRUE(in.good()) << variant;
  nlohmann::json j = nlohmann::json::parse(in);
  Golden g;
  g.dtype = j["dtype"];
  g.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  g.logits = j["last_prompt_logits"].get<std::vector<std::vector<float>>>();
  if (j.contains("last_prompt_logits_f32_compute")) {
    g.logits_f32_compute =
        j["last_prompt_logits_f32_compute"].get<std::vector<std::vector<float>>>();
  }
  g.greedy = j["greedy_tokens"].get<std::vector<std::vector<int32_t>>>();
  g.max_new_tokens = j["max_new_tokens"];
  const auto& pair = j["prefix_pair"];
  for (const auto& key : {"first", "second"}) {
    if (pair.contains(key)) g.prefix_pair.push_back(pair[key].get<int>());
  }
  if (g.prefix_pair.empty() && pair.contains("indices")) {
    g.prefix_pair = pair["indices"].get<std::vector<int>>();
  }
  return g;
}

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

// Runs `order` (prompt indices) through one engine: all at once when `together`, else one
// after another. Returns outputs indexed like g.prompts, plus the engine's prefix hits.
std::vector<Output> RunEngine(const std::string& variant, const Golden& g, EngineConfig config,
                              const std::vector<int>& order, bool together, int64_t* prefix_hits) {
  const std::string dir = kFixtures + variant;
  auto model_config = LoadModelConfig(dir);
  EXPECT_TRUE(model_config.ok()) << model_config.status();
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
    spec.ignore_eos = true;  // the reference decodes a fixed number of tokens
    spec.capture_last_prompt_logits = true;
    EXPECT_TRUE((*engine)->AddRequest(i, spec).ok());
    if (!together) drain();
  }
  drain();
  if (prefix_hits != nullptr) *prefix_hits = (*engine)->kv_cache_stats().prefix_hit_tokens;
  return out;
}

using golden::ArgMax;
using golden::Cosine;
using golden::MaxAbs;

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const char* what,
                 int prompt) {
  ASSERT_EQ(got.size(), want.size()) << what << " prompt " << prompt;
  const float tol = 1e-4f * MaxAbs(want);
  float worst = 0;
  for (size_t v = 0; v < want.size(); ++v) worst = std::max(worst, std::fabs(got[v] - want[v]));
  EXPECT_LE(worst, tol) << what << " prompt " << prompt << ": max |diff| " << worst;
  EXPECT_EQ(ArgMax(got), ArgMax(want)) << what << " prompt " << prompt;
}

void Check(const Golden& g, const std::vector<Output>& out, const std::vector<int>& which,
           const std::string& mode) {
  const bool full_precision = g.dtype == "float32";
  for (int i : which) {
    SCOPED_TRACE(mode + ", prompt " + std::to_string(i));
    const Output& o = out[i];
    ASSERT_EQ(o.tokens.size(), static_cast<size_t>(g.max_new_tokens));
    if (full_precision) {
      EXPECT_EQ(o.tokens, g.greedy[i]);
      ExpectClose(o.logits, g.logits[i], "logits", i);
      continue;
    }
    // Reduced-precision reference.
    ASSERT_EQ(o.logits.size(), g.logits[i].size());
    EXPECT_GE(Cosine(o.logits, g.logits[i]), 0.999);
    const std::vector<float>& ref = g.logits[i];
    const float margin = (g.dtype == "bfloat16" ? 0.03f : 0.005f) * MaxAbs(ref);
    const int ours = ArgMax(o.logits);
    EXPECT_GE(ref[ours], ref[ArgMax(ref)] - margin)
        << "our top-1 " << ours << " is not within the reference's rounding margin";
    if (!g.logits_f32_compute.empty()) {
      ExpectClose(o.logits, g.logits_f32_compute[i], "fp32-compute logits", i);
    }
  }
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesTransformersAloneBatchedChunkedAndPrefixHit) {
  const std::string variant = GetParam();
  const Golden g = LoadGolden(variant);
  ASSERT_FALSE(g.prompts.empty());
  std::vector<int> all(g.prompts.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  EngineConfig base;

  Check(g, RunEngine(variant, g, base, all, /*together=*/false, nullptr), all, "alone");
  Check(g, RunEngine(variant, g, base, all, /*together=*/true, nullptr), all, "batch");
  EngineConfig chunked = base;
  chunked.max_num_batched_tokens = 7;
  Check(g, RunEngine(variant, g, chunked, all, /*together=*/true, nullptr), all,
        "chunked prefill (7)");

  ASSERT_EQ(g.prefix_pair.size(), 2u);
  int64_t hits = 0;
  auto pair_out = RunEngine(variant, g, base, g.prefix_pair, /*together=*/false, &hits);
  EXPECT_GE(hits, 32) << "the second prompt of the pair must hit the shared 32-token prefix";
  Check(g, pair_out, g.prefix_pair, "after a prefix-cache hit");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest,
                         ::testing::Values("llama_f32_gqa", "llama_f32_mqa_headdim_bias",
                                           "llama_f32_llama3_tied", "qwen2_f32",
                                           "llama_f32_old_format", "llama_bf16", "qwen2_f16",
                                           "llama_f32_gqa8x4"));

// The families beyond Llama/Qwen2 (make_golden_moe.py): Mistral (a sliding window larger than
// every prompt), Qwen3 (q/k norms), and the mixtures of experts Mixtral, Qwen3-MoE (dense and
// sparse layers) and Qwen2-MoE (shared expert), checkpoints in the hub's per-expert layout.
INSTANTIATE_TEST_SUITE_P(Families, GoldenTest,
                         ::testing::Values("mistral_f32", "qwen3_f32", "mixtral_f32",
                                           "qwen3_moe_f32", "qwen2_moe_f32"));

}  // namespace
}  // namespace tandem::runtime
