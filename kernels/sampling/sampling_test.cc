#include "kernels/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

uint64_t RandomSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

SamplingParams Params(float temperature, int32_t top_k, float top_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

SamplingParams Limited(SamplingParams p, int64_t vocab_limit) {
  p.vocab_limit = vocab_limit;
  return p;
}

TEST(ValidateSamplingParamsTest, AcceptsValidAndNamesTheBadField) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  EXPECT_TRUE(ValidateSamplingParams(Params(0.7f, 50, 0.9f, 1)).ok());
  EXPECT_TRUE(ValidateSamplingParams(Params(2.0f, 0, 1.0f, 0)).ok());
  struct Case {
    SamplingParams p;
    const char* field;
  };
  for (const Case& c :
       {Case{Params(-0.1f, 0, 1.0f, 0), "temperature"},
        Case{Params(kNaN, 0, 1.0f, 0), "temperature"},
        Case{Params(kInf, 0, 1.0f, 0), "temperature"}, Case{Params(1.0f, -1, 1.0f, 0), "top_k"},
        Case{Params(1.0f, 0, 0.0f, 0), "top_p"}, Case{Params(1.0f, 0, -0.5f, 0), "top_p"},
        Case{Params(1.0f, 0, 1.01f, 0), "top_p"}, Case{Params(1.0f, 0, kNaN, 0), "top_p"},
        Case{Limited(Params(1.0f, 0, 1.0f, 0), -1), "vocab_limit"}}) {
    const absl::Status s = ValidateSamplingParams(c.p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(s.message(), HasSubstr(c.field));
  }
}

TEST(SampleTokenTest, GreedyTiesNaNAndInfinities) {
  const SamplingParams greedy;
  auto pick = [&](std::vector<float> logits) {
    return cpu::SampleToken(logits.data(), static_cast<int64_t>(logits.size()), greedy, 0);
  };
  EXPECT_EQ(pick({1.0f, 3.0f, 3.0f, 2.0f}), 1);        // lowest index on ties
  EXPECT_EQ(pick({kNaN, 1.0f, kNaN, 5.0f, 5.0f}), 3);  // NaN never wins
  EXPECT_EQ(pick({5.0f, kNaN}), 0);
  EXPECT_EQ(pick({1.0f, kInf, kInf}), 1);
  EXPECT_EQ(pick({-kInf, -kInf, -3.0f}), 2);
  EXPECT_EQ(pick({-kInf, -kInf}), 0);
  EXPECT_EQ(pick({kNaN, kNaN}), 0);  // documented fallback
  EXPECT_EQ(pick({-1.0f}), 0);
}

TEST(SampleTokenTest, GreedyIsArgmaxOnRandomLogits) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> logits(1000);
  for (int trial = 0; trial < 20; ++trial) {
    for (float& l : logits) l = dist(rng);
    int32_t want = 0;
    for (int i = 1; i < 1000; ++i) {
      if (logits[i] > logits[want]) want = i;
    }
    EXPECT_EQ(cpu::SampleToken(logits.data(), 1000, SamplingParams{}, trial), want);
  }
}

TEST(SampleTokenTest, TopK1EqualsGreedy) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> logits(500);
  for (uint64_t step = 0; step < 200; ++step) {
    for (float& l : logits) l = dist(rng);
    const int32_t greedy = cpu::SampleToken(logits.data(), 500, SamplingParams{}, step);
    EXPECT_EQ(cpu::SampleToken(logits.data(), 500, Params(1.5f, 1, 1.0f, seed), step), greedy);
  }
  // Exact ties at the top: top-k keeps exactly one, the lower index.
  const std::vector<float> tied = {1.0f, 5.0f, 5.0f, 5.0f};
  for (uint64_t step = 0; step < 100; ++step) {
    EXPECT_EQ(cpu::SampleToken(tied.data(), 4, Params(1.0f, 1, 1.0f, seed), step), 1);
  }
}

// probs: [0.05, 0.5, 0.15, 0.3] (sorted: 0.5, 0.3 | 0.15, 0.05). top_p = 0.75 needs the two
// largest (0.5 < 0.75 <= 0.8); 0.15 and 0.05 are outside the nucleus.
TEST(SampleTokenTest, TopPExcludesTokensOutsideTheNucleus) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  const std::vector<float> logits = {std::log(0.05f), std::log(0.5f), std::log(0.15f),
                                     std::log(0.3f)};
  int counts[4] = {0, 0, 0, 0};
  for (uint64_t step = 0; step < 4000; ++step) {
    ++counts[cpu::SampleToken(logits.data(), 4, Params(1.0f, 0, 0.75f, seed), step)];
  }
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  // Renormalized nucleus: 0.5 / 0.8 = 0.625 and 0.375; 4000 draws, SE ~ 0.0077.
  EXPECT_NEAR(counts[1] / 4000.0, 0.625, 0.05);
  EXPECT_NEAR(counts[3] / 4000.0, 0.375, 0.05);

  // A tiny top_p keeps only the most probable token.
  for (uint64_t step = 0; step < 200; ++step) {
    EXPECT_EQ(cpu::SampleToken(logits.data(), 4, Params(1.0f, 0, 1e-6f, seed), step), 1);
  }
}

TEST(SampleTokenTest, TopPWorksOnALargeVocabulary) {
  // Past the first 64-candidate chunk of the incremental sort: 1000 equal logits, top_p = 0.5
  // keeps the 500 lowest ids (ties go to the lower id).
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  const std::vector<float> logits(1000, 0.25f);
  std::set<int32_t> seen;
  for (uint64_t step = 0; step < 3000; ++step) {
    const int32_t t = cpu::SampleToken(logits.data(), 1000, Params(0.8f, 0, 0.5f, seed), step);
    ASSERT_GE(t, 0);
    ASSERT_LT(t, 500);
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 400u);  // ~497 expected from 3000 uniform draws over 500
}

TEST(SampleTokenTest, SameSeedAndStepReproduceDifferentSeedsDiffer) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> logits(1000);
  for (float& l : logits) l = dist(rng);
  const std::vector<float> copy = logits;  // a different buffer (another batch slot)
  std::set<int32_t> by_seed, by_step;
  for (uint64_t i = 0; i < 20; ++i) {
    const SamplingParams p = Params(1.0f, 0, 1.0f, seed + i);
    const int32_t first = cpu::SampleToken(logits.data(), 1000, p, 7);
    EXPECT_EQ(cpu::SampleToken(copy.data(), 1000, p, 7), first);
    by_seed.insert(first);
    by_step.insert(cpu::SampleToken(logits.data(), 1000, Params(1.0f, 0, 1.0f, seed), i));
  }
  // 20 draws over ~1000 comparable tokens: all equal would be astronomically unlikely.
  EXPECT_GT(by_seed.size(), 1u);
  EXPECT_GT(by_step.size(), 1u);
}

// Draws 20000 tokens (steps 0..19999) and checks every frequency against fp64 probabilities
// within 5 standard errors.
void ExpectDistribution(const std::vector<float>& logits, const SamplingParams& p,
                        const std::vector<double>& want) {
  const int kDraws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (uint64_t step = 0; step < kDraws; ++step) {
    ++counts[cpu::SampleToken(logits.data(), static_cast<int64_t>(logits.size()), p, step)];
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    const double se = std::sqrt(want[i] * (1.0 - want[i]) / kDraws);
    EXPECT_NEAR(counts[i] / static_cast<double>(kDraws), want[i], 5.0 * se + 1e-12)
        << "token " << i << " logit " << logits[i];
  }
}

TEST(SampleTokenTest, EmpiricalDistributionMatchesSoftmax) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> logit_dist(-2.0f, 2.0f);
  std::uniform_real_distribution<float> temp_dist(0.5f, 2.0f);
  std::vector<float> logits(5);
  for (float& l : logits) l = logit_dist(rng);
  const float temperature = temp_dist(rng);
  SCOPED_TRACE(testing::Message() << "temperature=" << temperature);

  std::vector<double> probs(5);
  double total = 0.0;
  for (int i = 0; i < 5; ++i) total += probs[i] = std::exp(double{logits[i]} / temperature);
  for (double& q : probs) q /= total;
  ExpectDistribution(logits, Params(temperature, 0, 1.0f, seed), probs);

  // top_k = 3: the three largest logits, renormalized.
  std::vector<int> order = {0, 1, 2, 3, 4};
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> top3(5, 0.0);
  const double top3_total = probs[order[0]] + probs[order[1]] + probs[order[2]];
  for (int r = 0; r < 3; ++r) top3[order[r]] = probs[order[r]] / top3_total;
  ExpectDistribution(logits, Params(temperature, 3, 1.0f, seed + 1), top3);
}

TEST(SampleTokenTest, NonFiniteLogitsInSamplingMode) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  const std::vector<float> masked = {kNaN, -kInf, 0.0f, 0.0f};
  const std::vector<float> infinite = {kInf, 1.0f, kInf};
  std::set<int32_t> masked_seen, infinite_seen;
  for (uint64_t step = 0; step < 200; ++step) {
    masked_seen.insert(cpu::SampleToken(masked.data(), 4, Params(1.0f, 0, 0.9f, seed), step));
    infinite_seen.insert(cpu::SampleToken(infinite.data(), 3, Params(1.0f, 0, 1.0f, seed), step));
  }
  EXPECT_EQ(masked_seen, (std::set<int32_t>{2, 3}));
  EXPECT_EQ(infinite_seen, (std::set<int32_t>{0, 2}));
  // Nothing with positive probability: falls back to greedy.
  const std::vector<float> dead = {kNaN, -kInf, -kInf};
  EXPECT_EQ(cpu::SampleToken(dead.data(), 3, Params(1.0f, 0, 1.0f, seed), 0), 1);
  // A vanishing temperature is greedy in the limit, without NaNs from overflow.
  const std::vector<float> close = {1.0f, 2.0f, 1.999f};
  for (uint64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(cpu::SampleToken(close.data(), 3, Params(1e-30f, 0, 1.0f, seed), step), 1);
  }
  const std::vector<float> single = {-3.0f};
  EXPECT_EQ(cpu::SampleToken(single.data(), 1, Params(1.0f, 5, 0.5f, seed), 0), 0);
}

// A model's embedding padded past its tokenizer (Qwen2.5: 151,936 rows, 151,665 tokens): with
// vocab_limit the padding ids are never picked, even where their logits dominate (+inf, huge,
// the only finite ones), and the pick equals sampling the row cut at the limit, on random rows
// for every mode (greedy, temperature, top-k, top-p).
TEST(SampleTokenTest, VocabLimitMasksThePaddingIds) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const SamplingParams modes[] = {Params(0.0f, 0, 1.0f, 0),    Params(1.0f, 0, 1.0f, 0),
                                  Params(100.0f, 0, 1.0f, 0),  Params(0.7f, 20, 1.0f, 0),
                                  Params(1.0f, 0, 0.8f, 0),    Params(1.3f, 50, 0.9f, 0),
                                  Params(2.0f, 400, 0.999f, 0)};
  int padding_without_limit = 0, draws = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t limit = 100 + static_cast<int64_t>(rng() % 900);
    const int64_t vocab = limit + 1 + static_cast<int64_t>(rng() % 300);
    std::vector<float> logits(vocab);
    for (float& l : logits) l = normal(rng);
    // The padding rows: huge or +inf logits (an untrained, or adversarial, tail).
    for (int64_t i = limit; i < vocab; ++i) {
      const uint64_t kind = rng() % 4;
      logits[i] = kind == 0 ? kInf : kind == 1 ? kNaN : 50.0f + normal(rng);
    }
    for (SamplingParams p : modes) {
      p.seed = rng();
      const uint64_t step = rng();
      const int32_t cut = cpu::SampleToken(logits.data(), limit, p, step);  // the row cut short
      const int32_t limited = cpu::SampleToken(logits.data(), vocab, Limited(p, limit), step);
      ASSERT_LT(limited, limit) << "trial " << trial;
      EXPECT_EQ(limited, cut) << "trial " << trial << " T=" << p.temperature;
      // A limit at or past the row's end changes nothing.
      EXPECT_EQ(cpu::SampleToken(logits.data(), vocab, Limited(p, vocab), step),
                cpu::SampleToken(logits.data(), vocab, p, step));
      EXPECT_EQ(cpu::SampleToken(logits.data(), vocab, Limited(p, vocab + 7), step),
                cpu::SampleToken(logits.data(), vocab, p, step));
      padding_without_limit += cpu::SampleToken(logits.data(), vocab, p, step) >= limit;
      ++draws;
    }
  }
  // Without the limit these rows do sample padding ids (what the limit is for).
  EXPECT_GT(padding_without_limit, draws / 2);
}

TEST(SampleTokenTest, SamplingUniformIsDeterministicAndInRange) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  for (uint64_t step : {0ull, 1ull, 0xffffffffull, 0x100000000ull, ~0ull}) {
    const double u = SamplingUniform(seed, step);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_EQ(u, SamplingUniform(seed, step));
  }
  // The high word of the step matters (steps 2^32 apart differ).
  EXPECT_NE(SamplingUniform(seed, 5), SamplingUniform(seed, 5 + (1ull << 32)));
}

// TokenProbabilities is the distribution SampleToken draws from: the inverse CDF of its
// probabilities with SampleToken's uniform picks SampleToken's token, on fresh random logits with
// temperature, top-k, top-p and a vocab limit; greedy is one-hot; the other streams differ.
TEST(TokenProbabilitiesTest, IsTheDistributionSampleTokenDrawsFrom) {
  const uint64_t seed = RandomSeed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  constexpr int64_t kVocab = 50;
  std::vector<float> logits(kVocab);
  std::vector<double> probs(kVocab);
  const SamplingParams cases[] = {Params(1.0f, 0, 1.0f, 0), Params(0.7f, 10, 1.0f, 0),
                                  Params(1.3f, 0, 0.8f, 0), Limited(Params(0.9f, 20, 0.9f, 0), 40)};
  for (const SamplingParams& base : cases) {
    for (float& l : logits) l = normal(rng);
    cpu::TokenProbabilities(logits.data(), kVocab, base, probs.data());
    double total = 0.0;
    for (int64_t v = 0; v < kVocab; ++v) {
      EXPECT_GE(probs[v], 0.0);
      if (base.vocab_limit > 0 && v >= base.vocab_limit) {
        EXPECT_EQ(probs[v], 0.0);
      }
      total += probs[v];
    }
    EXPECT_NEAR(total, 1.0, 1e-12) << "seed " << seed;
    if (base.top_k > 0 && base.top_p == 1.0f) {
      EXPECT_EQ(std::count_if(probs.begin(), probs.end(), [](double p) { return p > 0; }),
                base.top_k);
    }
    for (uint64_t s = 0; s < 2000; ++s) {
      SamplingParams p = base;
      p.seed = rng();
      ASSERT_EQ(cpu::SampleToken(logits.data(), kVocab, p, s),
                cpu::SampleFromWeights(probs.data(), kVocab, SamplingUniform(p.seed, s)))
          << "seed " << seed;
    }
  }
  cpu::TokenProbabilities(logits.data(), kVocab, Params(0.0f, 0, 1.0f, 0), probs.data());
  const int64_t argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  for (int64_t v = 0; v < kVocab; ++v) EXPECT_EQ(probs[v], v == argmax ? 1.0 : 0.0);
  EXPECT_EQ(SamplingUniform(7, 3), SamplingUniform(7, 3, 0));
  EXPECT_NE(SamplingUniform(7, 3, 1), SamplingUniform(7, 3, 0));
  EXPECT_NE(SamplingUniform(7, 3, 1), SamplingUniform(7, 3, 2));
  const double w[4] = {0.0, 2.0, -1.0, 2.0};
  EXPECT_EQ(cpu::SampleFromWeights(w, 4, 0.0), 1);
  EXPECT_EQ(cpu::SampleFromWeights(w, 4, 0.49), 1);
  EXPECT_EQ(cpu::SampleFromWeights(w, 4, 0.51), 3);
}

}  // namespace
}  // namespace tandem::kernels
