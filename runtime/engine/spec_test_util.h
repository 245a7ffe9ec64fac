// Shared by the speculative decoding tests (speculative_engine_test, draft_model_test, the MTP
// tests): their prompt mix, the MTP tests' tiny DeepSeek-V3, running a batch of requests to the
// end on an engine, and the two-sample chi-square both use to compare speculative with plain
// sampling per position.
#ifndef TANDEM_RUNTIME_ENGINE_SPEC_TEST_UTIL_H_
#define TANDEM_RUNTIME_ENGINE_SPEC_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_config.h"

namespace tandem::runtime::engine_test {

struct SpecResult {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  int64_t max_update = 0;  // most tokens one update carried
};

struct SpecOutcome {
  std::vector<SpecResult> results;
  SpecStats stats;
  std::vector<uint64_t> cached_hashes;  // sorted
};

// Adds `specs` (request i is specs[i]) and steps `engine` until none is unfinished; every
// target block must be back in the pool then.
inline SpecOutcome RunToCompletion(Engine& engine, const std::vector<RequestSpec>& specs) {
  SpecOutcome run;
  run.results.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(engine.AddRequest(static_cast<int64_t>(i), specs[i]).ok());
  }
  for (int guard = 0; engine.HasUnfinished() && guard < 100000; ++guard) {
    auto updates = engine.Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    for (RequestUpdate& u : *updates) {
      SpecResult& r = run.results[u.request_id];
      r.tokens.insert(r.tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      r.max_update = std::max<int64_t>(r.max_update, u.new_token_ids.size());
      if (u.finish_reason != FinishReason::kNone) r.reason = u.finish_reason;
    }
  }
  EXPECT_FALSE(engine.HasUnfinished());
  EXPECT_EQ(engine.kv_cache_stats().num_free_blocks, engine.num_kv_blocks())
      << "every block must return to the pool";
  run.stats = engine.spec_stats();
  run.cached_hashes = engine.CachedHashesShort();
  std::sort(run.cached_hashes.begin(), run.cached_hashes.end());
  return run;
}

// A tiny random DeepSeek-V3 (MLA, a dense and a MoE layer) with one MTP layer (mtp_engine_test,
// mtp_disagg_test).
inline ModelConfig DeepseekMtp(int64_t vocab) {
  const std::string json = R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": )" + std::to_string(vocab) +
                           R"(, "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
    "v_head_dim": 8, "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 16, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": true, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false,
    "num_nextn_predict_layers": 1, "bos_token_id": 0, "eos_token_id": 2})";
  absl::StatusOr<ModelConfig> config = ParseModelConfig(json);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// `n` prompts of 4-43 tokens with max_tokens 4-43: even ones repeat a short random pattern
// (drafts get accepted), odd ones are random; every third may end at the eos token (2).
inline std::vector<RequestSpec> SpecPrompts(uint32_t seed, int n, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<RequestSpec> specs;
  for (int i = 0; i < n; ++i) {
    RequestSpec spec;
    const int len = 4 + static_cast<int>(rng() % 40);
    std::vector<int32_t> pattern(2 + rng() % 4);
    for (int32_t& t : pattern) t = static_cast<int32_t>(rng() % vocab);
    for (int t = 0; t < len; ++t) {
      spec.prompt.push_back(i % 2 == 0 ? pattern[t % pattern.size()]
                                       : static_cast<int32_t>(rng() % vocab));
    }
    spec.max_tokens = 4 + static_cast<int>(rng() % 40);
    spec.ignore_eos = i % 3 != 0;
    specs.push_back(std::move(spec));
  }
  return specs;
}

inline void ExpectSameTokens(const SpecOutcome& a, const SpecOutcome& b, const std::string& what) {
  ASSERT_EQ(a.results.size(), b.results.size());
  for (size_t i = 0; i < a.results.size(); ++i) {
    EXPECT_EQ(a.results[i].tokens, b.results[i].tokens) << what << ": prompt " << i;
    EXPECT_EQ(a.results[i].reason, b.results[i].reason) << what << ": prompt " << i;
  }
}

// The per-position distribution tests' request: one repetitive 11-token prompt, then
// `positions` tokens (eos ignored) sampled at `temperature`.
inline RequestSpec RepeatingPromptRequest(int positions, float temperature) {
  RequestSpec spec;
  spec.prompt = {3, 7, 5, 3, 7, 5, 3, 7, 5, 3, 7};
  spec.max_tokens = positions;
  spec.ignore_eos = true;
  spec.sampling.temperature = temperature;
  return spec;
}

// `n` copies of `spec`, copy i seeded first_seed + i: independent samples of one request.
inline std::vector<RequestSpec> SeededCopies(const RequestSpec& spec, int n, uint64_t first_seed) {
  std::vector<RequestSpec> specs(n, spec);
  for (int i = 0; i < n; ++i) specs[i].sampling.seed = first_seed + i;
  return specs;
}

// Two-sample chi-square statistic of counts a and b over the same categories, and its degrees of
// freedom (categories seen in either, minus 1).
inline std::pair<double, int> ChiSquare(const std::vector<int64_t>& a,
                                        const std::vector<int64_t>& b) {
  double na = 0, nb = 0;
  for (size_t v = 0; v < a.size(); ++v) {
    na += a[v];
    nb += b[v];
  }
  double stat = 0;
  int cells = 0;
  for (size_t v = 0; v < a.size(); ++v) {
    const double total = a[v] + b[v];
    if (total == 0) continue;
    ++cells;
    const double ea = total * na / (na + nb), eb = total * nb / (na + nb);
    stat += (a[v] - ea) * (a[v] - ea) / ea + (b[v] - eb) * (b[v] - eb) / eb;
  }
  return {stat, cells - 1};
}

// The chi-square quantile with p = 0.001 above it (Wilson-Hilferty; within 1% for df >= 3).
inline double ChiSquareCritical(int df) {
  const double z = 3.0902;  // standard normal upper 0.001 quantile
  const double t = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - t + z * std::sqrt(t), 3.0);
}

// Each of `positions` output positions, over the samples (request i of `plain` against request
// i of `spec`, every one with exactly `positions` tokens): the token counts of the two runs pass
// the two-sample chi-square test at p = 0.001 (and spread over >= 4 tokens, enough to test).
inline void ExpectSameDistributionPerPosition(const SpecOutcome& plain, const SpecOutcome& spec,
                                              int64_t vocab, int samples, int positions) {
  for (int pos = 0; pos < positions; ++pos) {
    std::vector<int64_t> a(vocab, 0), b(vocab, 0);
    for (int i = 0; i < samples; ++i) {
      ASSERT_EQ(plain.results[i].tokens.size(), static_cast<size_t>(positions));
      ASSERT_EQ(spec.results[i].tokens.size(), static_cast<size_t>(positions));
      ++a[plain.results[i].tokens[pos]];
      ++b[spec.results[i].tokens[pos]];
    }
    const auto [stat, df] = ChiSquare(a, b);
    ASSERT_GE(df, 3) << "position " << pos << ": too concentrated to test";
    EXPECT_LT(stat, ChiSquareCritical(df)) << "position " << pos << " (df " << df << ")";
  }
}

}  // namespace tandem::runtime::engine_test

#endif  // TANDEM_RUNTIME_ENGINE_SPEC_TEST_UTIL_H_
