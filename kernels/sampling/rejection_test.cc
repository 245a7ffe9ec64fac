#include "kernels/sampling/rejection.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"

namespace tandem::kernels {
namespace {

// `rows` random distributions over `vocab` ids, each with a few zeros (ids no top-k would keep).
std::vector<double> RandomRows(int64_t rows, int64_t vocab, std::mt19937* rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> probs(static_cast<size_t>(rows * vocab));
  for (int64_t r = 0; r < rows; ++r) {
    double total = 0.0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double x = uniform(*rng);
      probs[r * vocab + v] = x < 0.15 ? 0.0 : x * x;
      total += probs[r * vocab + v];
    }
    for (int64_t v = 0; v < vocab; ++v) probs[r * vocab + v] /= total;
  }
  return probs;
}

// Chi-square statistic of `counts` against `trials` draws from probs (cells of expectation < 5
// merged into one).
double ChiSquare(const std::vector<int64_t>& counts, const double* probs, int64_t trials,
                 int* dof) {
  double stat = 0.0, rest_e = 0.0, rest_o = 0.0;
  int cells = 0;
  for (size_t v = 0; v < counts.size(); ++v) {
    const double e = probs[v] * static_cast<double>(trials);
    if (e < 5.0) {
      rest_e += e;
      rest_o += static_cast<double>(counts[v]);
      EXPECT_TRUE(probs[v] > 0.0 || counts[v] == 0) << "id " << v << " has probability 0";
      continue;
    }
    stat += (counts[v] - e) * (counts[v] - e) / e;
    ++cells;
  }
  if (rest_e >= 5.0) {
    stat += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
    ++cells;
  }
  *dof = cells - 1;
  return stat;
}

// chi-square quantile at p = 0.001 by degrees of freedom (1..12).
double ChiSquareCritical(int dof) {
  static constexpr double kQ[] = {0,     10.83, 13.82, 16.27, 18.47, 20.52, 22.46,
                                  24.32, 26.12, 27.88, 29.59, 31.26, 32.91};
  return kQ[std::clamp(dof, 1, 12)];
}

// Random p (k + 1 rows) and q (k rows), drafts drawn from q, k = 3: the token emitted at
// position j (reached when the j drafts before it were accepted: the accepted draft, the
// residual sample or the bonus token) follows p_j, position by position, and draft i is accepted
// with probability sum_v min(p_i, q_i) given the earlier ones were.
TEST(RejectionSampleDraftsTest, EmitsTheTargetDistributionAtEveryPosition) {
  constexpr int64_t kVocab = 8, kDrafts = 3;
  constexpr int64_t kTrials = 20000;
  std::mt19937 rng(3);
  const std::vector<double> p = RandomRows(kDrafts + 1, kVocab, &rng);
  const std::vector<double> q = RandomRows(kDrafts, kVocab, &rng);
  std::vector<std::vector<int64_t>> counts(kDrafts + 1, std::vector<int64_t>(kVocab, 0));
  std::vector<int64_t> reached(kDrafts + 1, 0), accepted_at(kDrafts, 0);
  for (int64_t t = 0; t < kTrials; ++t) {
    std::vector<int32_t> drafts(kDrafts);
    for (int64_t i = 0; i < kDrafts; ++i) {
      const double u = SamplingUniform(7000 + t, 11 + i, kDraftStream);
      drafts[i] = cpu::SampleFromWeights(q.data() + i * kVocab, kVocab, u);
    }
    const RejectionOutcome o =
        cpu::RejectionSampleDrafts(p, q, drafts, kVocab, /*seed=*/7000 + t, /*first_step=*/11);
    for (int64_t j = 0; j <= o.accepted; ++j) {
      ++reached[j];
      const int32_t token = j < o.accepted ? drafts[j] : o.next_token;
      ++counts[j][token];
      if (j < o.accepted) ++accepted_at[j];
    }
    if (o.accepted < kDrafts) {
      EXPECT_NE(o.next_token, drafts[o.accepted]);
    }
  }
  for (int64_t j = 0; j <= kDrafts; ++j) {
    ASSERT_GT(reached[j], 500) << "position " << j;
    int dof = 0;
    const double stat = ChiSquare(counts[j], p.data() + j * kVocab, reached[j], &dof);
    EXPECT_LT(stat, ChiSquareCritical(dof)) << "position " << j << ", " << reached[j] << " draws";
    if (j == kDrafts) break;
    double accept = 0.0;
    for (int64_t v = 0; v < kVocab; ++v) {
      accept += std::min(p[j * kVocab + v], q[j * kVocab + v]);
    }
    const double n = static_cast<double>(reached[j]);
    EXPECT_NEAR(static_cast<double>(accepted_at[j]), n * accept,
                5.0 * std::sqrt(n * accept * (1.0 - accept)))
        << "position " << j;
  }
}

// The same seed and step give the same outcome; another seed gives another on some trials.
TEST(RejectionSampleDraftsTest, SeededOutcomesReproduce) {
  constexpr int64_t kVocab = 50, kDrafts = 4;
  std::mt19937 rng(5);
  const std::vector<double> p = RandomRows(kDrafts + 1, kVocab, &rng);
  const std::vector<double> q = RandomRows(kDrafts, kVocab, &rng);
  const std::vector<int32_t> drafts = {1, 2, 3, 4};
  int differ = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const RejectionOutcome a = cpu::RejectionSampleDrafts(p, q, drafts, kVocab, seed, 3);
    const RejectionOutcome b = cpu::RejectionSampleDrafts(p, q, drafts, kVocab, seed, 3);
    const RejectionOutcome c = cpu::RejectionSampleDrafts(p, q, drafts, kVocab, seed + 1000, 3);
    EXPECT_EQ(a.accepted, b.accepted);
    EXPECT_EQ(a.next_token, b.next_token);
    differ += a.accepted != c.accepted || a.next_token != c.next_token;
  }
  EXPECT_GT(differ, 50);
}

}  // namespace
}  // namespace tandem::kernels
