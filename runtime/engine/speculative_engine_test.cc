// Speculative decoding (n-gram drafts, verified in one step) through the CPU engine on random-
// weight models, against the same engine without speculation:
//  * greedy: token-for-token equal for K = 1, 3, 5 on repetitive prompts (drafts accepted) and
//    random ones (drafts rejected), with a tight token budget and with preemption;
//  * seeded sampling: the same tokens as without speculation for the same seed;
//  * distribution: on a 16-token vocabulary, speculative and plain sampling with independent seeds
//    agree per position (two-sample chi-square, p > 0.001), and the verifier's rule (sample, accept
//    iff equal) accepts a point-mass draft with probability p(d) and otherwise follows p without d;
//  * a stop token or max_tokens inside an accepted run cuts it there; abort frees every block;
//    the prefix cache holds exactly the blocks of accepted tokens.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/engine/spec_test_util.h"
#include "runtime/engine/speculative.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {
namespace {

using engine_test::TinyConfig;

SpeculativeConfig Ngram(int64_t k) {
  SpeculativeConfig c;
  c.method = SpeculativeMethod::kNgram;
  c.num_speculative_tokens = k;
  c.ngram_min = 1;
  c.ngram_max = 3;
  return c;
}

using Outcome = engine_test::SpecOutcome;
using Result = engine_test::SpecResult;
using engine_test::ChiSquareCritical;
using engine_test::ExpectSameTokens;

Outcome RunAll(const EngineConfig& config, const std::vector<RequestSpec>& specs,
               int64_t vocab = 256) {
  const ModelConfig model = TinyConfig(vocab);
  auto engine = Engine::Create(config, model, RandomModelWeights(model, 4321));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine_test::RunToCompletion(**engine, specs);
}

std::vector<RequestSpec> Prompts(uint32_t seed, int n, int64_t vocab = 256) {
  return engine_test::SpecPrompts(seed, n, vocab);
}

TEST(SpeculativeEngineTest, GreedyIsTokenForTokenTheNonSpeculativeOutput) {
  const std::vector<RequestSpec> specs = Prompts(11, 24);
  EngineConfig base;
  base.num_threads = 1;
  const Outcome plain = RunAll(base, specs);
  EXPECT_EQ(plain.stats.verify_passes, 0u);
  for (int64_t k : {1, 3, 5}) {
    EngineConfig config = base;
    config.speculative = Ngram(k);
    const Outcome spec = RunAll(config, specs);
    ExpectSameTokens(plain, spec, "K=" + std::to_string(k));
    // Both paths were exercised: accepted drafts and rejected ones.
    EXPECT_GT(spec.stats.accepted_tokens, 0u) << "K=" << k;
    EXPECT_LT(spec.stats.accepted_tokens, spec.stats.drafted_tokens) << "K=" << k;
    EXPECT_LE(spec.stats.drafted_tokens, spec.stats.verify_passes * k);
    int64_t longest = 0;
    for (const Result& r : spec.results) longest = std::max(longest, r.max_update);
    EXPECT_GT(longest, 1) << "K=" << k << ": no update carried an accepted run";
    EXPECT_LE(longest, k + 1);
    // The prefix cache registered exactly the blocks decoding without speculation registers:
    // only accepted tokens are hashed.
    EXPECT_EQ(spec.cached_hashes, plain.cached_hashes) << "K=" << k;
  }
}

TEST(SpeculativeEngineTest, GreedyExactUnderATightBudgetAndPreemption) {
  const std::vector<RequestSpec> specs = Prompts(23, 16);
  EngineConfig base;
  base.num_threads = 1;
  base.max_num_batched_tokens = 12;  // drafts shrink to the budget
  base.kv_cache_bytes = 24 * 8192;   // 24 blocks of the tiny model: preemption
  const Outcome plain = RunAll(base, specs);
  EngineConfig config = base;
  config.speculative = Ngram(4);
  const Outcome spec = RunAll(config, specs);
  ExpectSameTokens(plain, spec, "tight");
  EXPECT_GT(spec.stats.accepted_tokens, 0u);
}

TEST(SpeculativeEngineTest, SeededSamplingReproducesTheNonSpeculativeTokens) {
  std::vector<RequestSpec> specs = Prompts(37, 20);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].sampling.temperature = i % 2 ? 0.9f : 0.3f;
    specs[i].sampling.top_k = i % 3 == 0 ? 8 : 0;
    specs[i].sampling.top_p = i % 4 == 0 ? 0.9f : 1.0f;
    specs[i].sampling.seed = 1000 + i;
  }
  EngineConfig base;
  base.num_threads = 1;
  const Outcome plain = RunAll(base, specs);
  EngineConfig config = base;
  config.speculative = Ngram(3);
  const Outcome spec = RunAll(config, specs);
  ExpectSameTokens(plain, spec, "seeded");
  EXPECT_GT(spec.stats.accepted_tokens, 0u);
  EXPECT_LT(spec.stats.accepted_tokens, spec.stats.drafted_tokens);
  // And again: the same seeds give the same tokens.
  ExpectSameTokens(spec, RunAll(config, specs), "seeded, again");
}

TEST(SpeculativeEngineTest, SampledDistributionPerPositionEqualsPlainSampling) {
  constexpr int64_t kVocab = 16;
  constexpr int kSamples = 6000;
  constexpr int kPositions = 4;
  // One repetitive prompt, many seeds: spec and plain draw independent seeds.
  const RequestSpec request = engine_test::RepeatingPromptRequest(kPositions, 1.0f);
  EngineConfig base;
  base.num_threads = 1;
  base.max_num_seqs = 1024;
  base.max_num_batched_tokens = 8192;
  const Outcome plain = RunAll(base, engine_test::SeededCopies(request, kSamples, 1), kVocab);
  EngineConfig config = base;
  config.speculative = Ngram(3);
  const Outcome spec =
      RunAll(config, engine_test::SeededCopies(request, kSamples, 1 + kSamples), kVocab);
  EXPECT_GT(spec.stats.accepted_tokens, 0u);
  EXPECT_LT(spec.stats.accepted_tokens, spec.stats.drafted_tokens);
  engine_test::ExpectSameDistributionPerPosition(plain, spec, kVocab, kSamples, kPositions);
}

// The verifier's rule on one target distribution: drawing x with the request's sampler and
// accepting draft d iff x == d accepts with probability p(d), and on rejection x follows p with d
// removed and renormalised (Leviathan et al.'s residual for a point-mass draft).
TEST(SpeculativeEngineTest, AcceptanceIsPTargetOfTheDraftAndTheResidualIsPWithoutIt) {
  constexpr int kVocab = 8;
  constexpr int kTrials = 20000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(kVocab);
  for (float& l : logits) l = normal(rng);
  kernels::SamplingParams params;
  params.temperature = 0.8f;
  params.seed = 77;
  std::vector<double> p(kVocab);
  double z = 0;
  const float mx = *std::max_element(logits.begin(), logits.end());
  for (int v = 0; v < kVocab; ++v) z += p[v] = std::exp((logits[v] - mx) / params.temperature);
  for (double& x : p) x /= z;
  const int32_t draft = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
  int64_t accepted = 0;
  std::vector<int64_t> residual(kVocab, 0);
  for (int t = 0; t < kTrials; ++t) {
    params.seed = 77 + t;
    const int32_t x = kernels::cpu::SampleToken(logits.data(), kVocab, params, /*step=*/3);
    const int32_t samples[1] = {x};
    const int32_t drafts[1] = {draft};
    if (AcceptedDraftLength(drafts, samples) == 1) {
      ++accepted;
    } else {
      ++residual[x];
    }
  }
  // Acceptance: binomial, 5 standard deviations.
  const double sd = std::sqrt(kTrials * p[draft] * (1 - p[draft]));
  EXPECT_NEAR(static_cast<double>(accepted), kTrials * p[draft], 5 * sd);
  EXPECT_EQ(residual[draft], 0);
  // Residual: goodness of fit against p without the draft, renormalised.
  const double rejected = static_cast<double>(kTrials - accepted);
  double stat = 0;
  for (int v = 0; v < kVocab; ++v) {
    if (v == draft) continue;
    const double e = rejected * p[v] / (1 - p[draft]);
    stat += (residual[v] - e) * (residual[v] - e) / e;
  }
  EXPECT_LT(stat, ChiSquareCritical(kVocab - 2));
}

// The first request of Prompts() whose speculative greedy run carried >= 2 tokens in one update
// with a token, after the update's first, that the output had not had before: (prompt, output,
// index of that token in the output).
struct LongRun {
  RequestSpec spec;
  std::vector<int32_t> output;
  size_t cut = 0;
};

LongRun FindLongRun(const EngineConfig& config) {
  std::vector<RequestSpec> specs = Prompts(11, 24);
  const ModelConfig model = TinyConfig();
  auto engine = Engine::Create(config, model, RandomModelWeights(model, 4321));
  EXPECT_TRUE(engine.ok());
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].ignore_eos = true;
    specs[i].max_tokens = 40;
    EXPECT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), specs[i]).ok());
  }
  std::map<int64_t, std::vector<int32_t>> out;
  std::map<int64_t, size_t> cut;
  while ((*engine)->HasUnfinished()) {
    auto updates = (*engine)->Step();
    EXPECT_TRUE(updates.ok());
    if (!updates.ok()) break;
    for (const RequestUpdate& u : *updates) {
      std::vector<int32_t>& o = out[u.request_id];
      const size_t start = o.size();
      o.insert(o.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      if (cut.contains(u.request_id)) continue;
      for (size_t j = start + 1; j < o.size(); ++j) {
        if (std::find(o.begin(), o.begin() + j, o[j]) == o.begin() + j) {
          cut[u.request_id] = j;
          break;
        }
      }
    }
  }
  EXPECT_FALSE(cut.empty()) << "no accepted run brought a new token";
  LongRun found;
  if (cut.empty()) return found;
  const int64_t id = cut.begin()->first;
  found.spec = specs[id];
  found.output = out[id];
  found.cut = cut.begin()->second;
  return found;
}

TEST(SpeculativeEngineTest, StopTokenAndMaxTokensInsideAnAcceptedRun) {
  EngineConfig base;
  base.num_threads = 1;
  EngineConfig config = base;
  config.speculative = Ngram(4);
  const LongRun run = FindLongRun(config);
  ASSERT_FALSE(run.output.empty());
  // A stop token that a token inside the run is: the output ends there, with it.
  RequestSpec stop = run.spec;
  stop.stop_token_ids = {run.output[run.cut]};
  const Outcome spec_stop = RunAll(config, {stop});
  const Outcome plain_stop = RunAll(base, {stop});
  ExpectSameTokens(plain_stop, spec_stop, "stop token");
  const std::vector<int32_t> expected(run.output.begin(), run.output.begin() + run.cut + 1);
  EXPECT_EQ(spec_stop.results[0].tokens, expected);
  EXPECT_EQ(spec_stop.results[0].reason, FinishReason::kStopToken);
  // max_tokens at every length up to past the run: exactly that many tokens, the same ones.
  std::vector<RequestSpec> lengths;
  for (size_t n = 1; n <= run.cut + 3 && n <= run.output.size(); ++n) {
    RequestSpec s = run.spec;
    s.max_tokens = static_cast<int64_t>(n);
    lengths.push_back(s);
  }
  const Outcome spec_len = RunAll(config, lengths);
  for (size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_EQ(spec_len.results[i].tokens,
              std::vector<int32_t>(run.output.begin(), run.output.begin() + i + 1))
        << "max_tokens " << i + 1;
    EXPECT_EQ(spec_len.results[i].reason, FinishReason::kLength);
  }
}

TEST(SpeculativeEngineTest, AbortWhileVerifyingFreesEveryBlock) {
  const ModelConfig model = TinyConfig();
  EngineConfig config;
  config.num_threads = 1;
  config.speculative = Ngram(5);
  auto engine = Engine::Create(config, model, RandomModelWeights(model, 4321));
  ASSERT_TRUE(engine.ok());
  std::vector<RequestSpec> specs = Prompts(11, 12);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].max_tokens = 60;
    specs[i].ignore_eos = true;
    ASSERT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), specs[i]).ok());
  }
  // Run until drafts were verified, then abort half the requests, finish the rest, abort none.
  for (int guard = 0; (*engine)->spec_stats().accepted_tokens == 0 && guard < 200; ++guard) {
    ASSERT_TRUE((*engine)->Step().ok());
  }
  ASSERT_GT((*engine)->spec_stats().accepted_tokens, 0u);
  for (int64_t id = 0; id < 12; id += 2) EXPECT_TRUE((*engine)->Abort(id));
  while ((*engine)->HasUnfinished()) ASSERT_TRUE((*engine)->Step().ok());
  EXPECT_EQ((*engine)->kv_cache_stats().num_free_blocks, (*engine)->num_kv_blocks());
}

// Drafts that are always rejected (sampling at T = 1 on a 64-token vocabulary: n-gram matches at
// almost every step, the target rarely agrees): the adaptive draft length backs off, so the
// requests verify far fewer drafts than a fixed K, and the tokens stay those of plain decoding.
TEST(SpeculativeEngineTest, AdaptiveDraftLengthBacksOffWhenDraftsAreRejected) {
  constexpr int64_t kVocab = 64;
  std::vector<RequestSpec> specs = Prompts(41, 8, kVocab);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].max_tokens = 96;
    specs[i].ignore_eos = true;
    specs[i].sampling.temperature = 1.0f;
    specs[i].sampling.seed = 500 + i;
  }
  EngineConfig base;
  base.num_threads = 1;
  const Outcome plain = RunAll(base, specs, kVocab);
  EngineConfig config = base;
  config.speculative = Ngram(3);
  config.speculative.adaptive = false;
  const Outcome fixed = RunAll(config, specs, kVocab);
  config.speculative.adaptive = true;
  const Outcome adaptive = RunAll(config, specs, kVocab);
  ExpectSameTokens(plain, fixed, "fixed K");
  ExpectSameTokens(plain, adaptive, "adaptive K");
  const uint64_t tokens = specs.size() * 96;
  ASSERT_LT(fixed.stats.acceptance_rate(), 0.15) << "the workload must reject";
  EXPECT_GT(fixed.stats.drafted_tokens, tokens);  // fixed K: ~K drafts at most steps
  // Adaptive: K + 1 drafts to back off, then about one probe per pause of 1, 2, 4, ... 32 steps
  // (more where a probe is accepted): well under one draft per 6 tokens.
  EXPECT_LT(adaptive.stats.drafted_tokens, tokens / 6);
  EXPECT_GT(adaptive.stats.drafted_tokens, 0u);
}

// Batch level: while a step starts with >= 4 running requests nobody drafts; once the batch
// has shrunk below 4 the remaining requests speculate. Tokens stay those of plain decoding.
TEST(SpeculativeEngineTest, NoDraftsWhileTheBatchIsAtTheDisableSize) {
  std::vector<RequestSpec> specs = Prompts(11, 8);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].ignore_eos = true;
    specs[i].max_tokens = 6 + 8 * static_cast<int64_t>(i);  // requests finish one by one
  }
  EngineConfig base;
  base.num_threads = 1;
  const Outcome plain = RunAll(base, specs);
  EngineConfig config = base;
  config.speculative = Ngram(3);
  config.speculative.disable_by_batch_size = 4;
  const ModelConfig model = TinyConfig();
  auto engine = Engine::Create(config, model, RandomModelWeights(model, 4321));
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), specs[i]).ok());
  }
  std::vector<std::vector<int32_t>> tokens(specs.size());
  uint64_t passes_while_small = 0;
  while ((*engine)->HasUnfinished()) {
    const int64_t running = (*engine)->num_running();
    const uint64_t before = (*engine)->spec_stats().verify_passes;
    auto updates = (*engine)->Step();
    ASSERT_TRUE(updates.ok()) << updates.status();
    for (const RequestUpdate& u : *updates) {
      tokens[u.request_id].insert(tokens[u.request_id].end(), u.new_token_ids.begin(),
                                  u.new_token_ids.end());
    }
    const uint64_t passes = (*engine)->spec_stats().verify_passes - before;
    if (running >= 4) {
      EXPECT_EQ(passes, 0u) << running << " requests running";
    } else {
      passes_while_small += passes;
    }
  }
  EXPECT_GT(passes_while_small, 0u) << "the small batch never speculated";
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(tokens[i], plain.results[i].tokens) << "prompt " << i;
  }
}

TEST(SpeculativeEngineTest, RefusesBadConfigs) {
  const ModelConfig model = TinyConfig();
  EngineConfig config;
  config.speculative = Ngram(0);
  EXPECT_FALSE(Engine::Create(config, model, RandomModelWeights(model, 1)).ok());
  config.speculative = Ngram(2);
  config.speculative.ngram_min = 5;
  EXPECT_FALSE(Engine::Create(config, model, RandomModelWeights(model, 1)).ok());
}

}  // namespace
}  // namespace tandem::runtime
