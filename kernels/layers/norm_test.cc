#include "kernels/layers/norm.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels::cpu {
namespace {

struct Shape {
  int64_t num_tokens;
  int64_t hidden;
};

// Hidden sizes not a multiple of 8 on purpose, plus single-token and single-element rows.
constexpr Shape kShapes[] = {{1, 1}, {1, 7}, {3, 13}, {1, 4096}, {5, 128}, {2, 4095}, {17, 1000}};

std::vector<float> RandomVector(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// fp64 reference: out = x / sqrt(mean(x^2) + eps) * w.
std::vector<double> RefRmsNorm(const std::vector<float>& x, const std::vector<float>& w,
                               int64_t num_tokens, int64_t hidden, float eps) {
  std::vector<double> out(x.size());
  for (int64_t t = 0; t < num_tokens; ++t) {
    double sum_sq = 0.0;
    for (int64_t i = 0; i < hidden; ++i) sum_sq += double{x[t * hidden + i]} * x[t * hidden + i];
    const double inv = 1.0 / std::sqrt(sum_sq / hidden + double{eps});
    for (int64_t i = 0; i < hidden; ++i) out[t * hidden + i] = x[t * hidden + i] * inv * w[i];
  }
  return out;
}

// Every fp32 step is a multiply, so the error is relative per element: a few ulp; 1e-5 is loose.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]) + 1e-30) << "element " << i;
  }
}

TEST(RmsNormTest, MatchesFp64Reference) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (const Shape& s : kShapes) {
    for (float scale : {1e-3f, 1.0f, 300.0f}) {
      SCOPED_TRACE(testing::Message() << "num_tokens=" << s.num_tokens << " hidden=" << s.hidden
                                      << " scale=" << scale);
      const std::vector<float> x = RandomVector(rng, s.num_tokens * s.hidden, scale);
      const std::vector<float> w = RandomVector(rng, s.hidden, 1.0f);
      std::vector<float> out(x.size(), -1.0f);
      RmsNorm(x.data(), w.data(), s.num_tokens, s.hidden, 1e-6f, out.data());
      ExpectClose(out, RefRmsNorm(x, w, s.num_tokens, s.hidden, 1e-6f));
    }
  }
}

TEST(RmsNormTest, InPlaceMatchesOutOfPlace) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (const Shape& s : kShapes) {
    std::vector<float> x = RandomVector(rng, s.num_tokens * s.hidden, 2.0f);
    const std::vector<float> w = RandomVector(rng, s.hidden, 1.0f);
    std::vector<float> out(x.size());
    RmsNorm(x.data(), w.data(), s.num_tokens, s.hidden, 1e-5f, out.data());
    RmsNorm(x.data(), w.data(), s.num_tokens, s.hidden, 1e-5f, x.data());
    EXPECT_EQ(x, out) << "hidden=" << s.hidden;
  }
}

TEST(RmsNormTest, EpsDominatesTinyInputs) {
  // mean(x^2) ~ 1e-12 << eps: the output is ~x * w / sqrt(eps), not normalized to unit RMS.
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const int64_t hidden = 37;
  const std::vector<float> x = RandomVector(rng, hidden, 1e-6f);
  const std::vector<float> w = RandomVector(rng, hidden, 1.0f);
  std::vector<float> out(hidden);
  RmsNorm(x.data(), w.data(), 1, hidden, 1e-5f, out.data());
  ExpectClose(out, RefRmsNorm(x, w, 1, hidden, 1e-5f));
  for (int64_t i = 0; i < hidden; ++i) EXPECT_LT(std::abs(out[i]), 1e-2f);
}

TEST(FusedAddRmsNormTest, MatchesAddThenNorm) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "num_tokens=" << s.num_tokens << " hidden=" << s.hidden);
    std::vector<float> x = RandomVector(rng, s.num_tokens * s.hidden, 1.0f);
    std::vector<float> residual = RandomVector(rng, s.num_tokens * s.hidden, 4.0f);
    const std::vector<float> w = RandomVector(rng, s.hidden, 1.0f);
    // The residual sum must be exactly the fp32 sum (it feeds the next layer's residual stream).
    std::vector<float> want_residual(x.size());
    for (size_t i = 0; i < x.size(); ++i) want_residual[i] = residual[i] + x[i];
    const std::vector<double> want_x = RefRmsNorm(want_residual, w, s.num_tokens, s.hidden, 1e-6f);

    FusedAddRmsNorm(x.data(), residual.data(), w.data(), s.num_tokens, s.hidden, 1e-6f);
    EXPECT_EQ(residual, want_residual);
    ExpectClose(x, want_x);
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu
