// The benchmark-only oracle drafter (spec_oracle.h) through the CPU engine on a random-weight
// model: with the reference from a plain greedy run, speculative output is token-for-token the
// plain run's and the acceptance rate follows the corruption rate (1 at rate 0, the formula's
// value at 0.7 / 0.5, 0 at rate 1); a request that leaves its reference gets no more drafts,
// except at rate 1 (random ones).
#include "runtime/engine/spec_oracle.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/engine/spec_test_util.h"
#include "runtime/engine/speculative.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {
namespace {

constexpr int64_t kVocab = 256;

// 8 random 16-token prompts, 96 greedy tokens each (eos ignored).
std::vector<RequestSpec> Requests() {
  std::vector<RequestSpec> specs = engine_test::SpecPrompts(5, 8, kVocab);
  for (RequestSpec& spec : specs) {
    spec.prompt.resize(std::min<size_t>(spec.prompt.size(), 16));
    spec.max_tokens = 96;
    spec.ignore_eos = true;
  }
  return specs;
}

engine_test::SpecOutcome RunEngine(const std::vector<RequestSpec>& specs,
                                   const BenchDraftHook* hook) {
  EngineConfig config;
  config.num_threads = 1;
  if (hook != nullptr) {
    config.speculative.method = SpeculativeMethod::kNgram;
    config.speculative.num_speculative_tokens = 6;
    config.speculative.adaptive = false;
    config.speculative.bench_hook = hook;
  }
  const ModelConfig model = engine_test::TinyConfig(kVocab);
  auto engine = Engine::Create(config, model, RandomModelWeights(model, 99));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine_test::RunToCompletion(**engine, specs);
}

// An oracle whose references are `plain`'s outputs after `specs`' prompts.
void SetReferences(const std::vector<RequestSpec>& specs, const engine_test::SpecOutcome& plain,
                   OracleDrafter* oracle) {
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<int32_t> ref = specs[i].prompt;
    ref.insert(ref.end(), plain.results[i].tokens.begin(), plain.results[i].tokens.end());
    oracle->SetReference(static_cast<int64_t>(i), std::move(ref));
  }
}

TEST(SpecOracleTest, CorruptRateInvertsTheExpectedAcceptance) {
  EXPECT_DOUBLE_EQ(ExpectedAcceptance(0.0, 4), 1.0);
  EXPECT_DOUBLE_EQ(ExpectedAcceptance(1.0, 4), 0.0);
  EXPECT_DOUBLE_EQ(ExpectedAcceptance(0.5, 2), (0.5 + 0.25) / 2);
  for (int64_t k = 1; k <= 6; ++k) {
    for (double a : {0.9, 0.7, 0.5, 0.2}) {
      const double p = CorruptRateForAcceptance(a, k);
      EXPECT_GT(p, 0.0);
      EXPECT_LT(p, 1.0);
      EXPECT_NEAR(ExpectedAcceptance(p, k), a, 1e-9) << "k=" << k << " a=" << a;
    }
  }
}

TEST(SpecOracleTest, OutputIsThePlainRunAndAcceptanceFollowsTheRate) {
  const std::vector<RequestSpec> specs = Requests();
  const engine_test::SpecOutcome plain = RunEngine(specs, nullptr);
  OracleDrafter oracle(kVocab, /*seed=*/17);
  SetReferences(specs, plain, &oracle);
  struct Case {
    int64_t k;
    double acceptance;
  };
  for (const Case c : {Case{4, 1.0}, Case{4, 0.7}, Case{2, 0.5}, Case{6, 0.5}, Case{3, 0.0}}) {
    const std::string what = "K=" + std::to_string(c.k) + " a=" + std::to_string(c.acceptance);
    const double rate = c.acceptance >= 1   ? 0.0
                        : c.acceptance <= 0 ? 1.0
                                            : CorruptRateForAcceptance(c.acceptance, c.k);
    oracle.Configure(c.k, rate);
    oracle.ClearDiverged();
    const engine_test::SpecOutcome spec = RunEngine(specs, &oracle);
    engine_test::ExpectSameTokens(plain, spec, what);
    EXPECT_EQ(oracle.diverged(), 0) << what;
    EXPECT_GT(spec.stats.verify_passes, 100u) << what;
    // Every pass drafts K, except where max_tokens leaves less room.
    EXPECT_GE(spec.stats.drafted_tokens, spec.stats.verify_passes * (c.k - 1)) << what;
    EXPECT_LE(spec.stats.drafted_tokens, spec.stats.verify_passes * c.k) << what;
    if (c.acceptance >= 1 || c.acceptance <= 0) {
      EXPECT_EQ(spec.stats.acceptance_rate(), c.acceptance) << what;
    } else {
      EXPECT_NEAR(spec.stats.acceptance_rate(), c.acceptance, 0.08) << what;
    }
  }
}

TEST(SpecOracleTest, ARequestThatLeavesItsReferenceDecodesPlainly) {
  const std::vector<RequestSpec> specs = Requests();
  const engine_test::SpecOutcome plain = RunEngine(specs, nullptr);
  OracleDrafter oracle(kVocab, /*seed=*/3);
  SetReferences(specs, plain, &oracle);
  oracle.Configure(4, 0.0);
  const engine_test::SpecOutcome right = RunEngine(specs, &oracle);
  // Request 2's reference is wrong from output 10 on: its tokens leave the reference there (a
  // rejected draft, or the verifier's own token after the drafts) and it gets no drafts after.
  std::vector<int32_t> wrong = specs[2].prompt;
  wrong.insert(wrong.end(), plain.results[2].tokens.begin(), plain.results[2].tokens.end());
  const size_t at = specs[2].prompt.size() + 10;
  wrong[at] = (wrong[at] + 1) % kVocab;
  oracle.SetReference(2, wrong);
  const engine_test::SpecOutcome spec = RunEngine(specs, &oracle);
  engine_test::ExpectSameTokens(plain, spec, "one wrong reference");
  EXPECT_EQ(oracle.diverged(), 1);
  // Request 2 drafted for its first ~10 outputs only: ~80 of its 96 tokens fewer to draft.
  EXPECT_LT(spec.stats.drafted_tokens + 60, right.stats.drafted_tokens);

  // At rate 1 a request off its reference still drafts (random ids): a verify pass at every
  // step that has room for a draft (outputs 1 .. 94 of 96), almost never accepted.
  oracle.Configure(4, 1.0);
  oracle.ClearDiverged();
  const engine_test::SpecOutcome rejected = RunEngine(specs, &oracle);
  engine_test::ExpectSameTokens(plain, rejected, "rate 1, one wrong reference");
  EXPECT_EQ(oracle.diverged(), 1);
  EXPECT_EQ(rejected.stats.verify_passes, specs.size() * 94);
  EXPECT_LE(rejected.stats.accepted_tokens, 5u);
}

}  // namespace
}  // namespace tandem::runtime
