#include "tests/bench/stats.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace tandem::bench {
namespace {

TEST(StatsTest, ParseLengthRange) {
  auto fixed = ParseLengthRange("prompt_len", "128");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->lo, 128u);
  EXPECT_EQ(fixed->hi, 128u);
  auto range = ParseLengthRange("prompt_len", "16:64");
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->lo, 16u);
  EXPECT_EQ(range->hi, 64u);
  for (const char* bad : {"", "0", "5:4", "a", "1:2:3", "-1", "3:"}) {
    EXPECT_EQ(ParseLengthRange("prompt_len", bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  bool saw_lo = false, saw_hi = false;
  for (int i = 0; i < 2000; ++i) {
    const uint32_t v = range->Sample(rng);
    ASSERT_GE(v, 16u);
    ASSERT_LE(v, 64u);
    saw_lo |= v == 16;
    saw_hi |= v == 64;
  }
  EXPECT_TRUE(saw_lo && saw_hi);
}

TEST(StatsTest, RateAndArrivals) {
  EXPECT_TRUE(std::isinf(*ParseRate("inf")));
  EXPECT_DOUBLE_EQ(*ParseRate("12.5"), 12.5);
  EXPECT_FALSE(ParseRate("-3").ok());
  EXPECT_FALSE(ParseRate("fast").ok());
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (double t : PoissonArrivals(10, *ParseRate("inf"), rng)) EXPECT_EQ(t, 0.0);
  // Exponential gaps with mean 1/rate: the mean gap of many is close to it.
  const int n = 20000;
  std::vector<double> at = PoissonArrivals(n, 50.0, rng);
  EXPECT_EQ(at[0], 0.0);
  EXPECT_TRUE(std::is_sorted(at.begin(), at.end()));
  const double mean_gap = at.back() / (n - 1);
  EXPECT_NEAR(mean_gap, 1.0 / 50.0, 0.1 / 50.0);
}

TEST(StatsTest, SummarizeAgainstSortedReference) {
  EXPECT_EQ(Summarize({}).count, 0);
  Summary one = Summarize({4.0});
  EXPECT_EQ(one.p50, 4.0);
  EXPECT_EQ(one.p99, 4.0);
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(0.5, 100.0);
  std::vector<double> v(1000);
  for (double& x : v) x = dist(rng);
  Summary s = Summarize(v);
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  double sum = 0;
  for (double x : v) sum += x;
  EXPECT_NEAR(s.mean, sum / v.size(), 1e-9);
  EXPECT_EQ(s.p50, sorted[499]);
  EXPECT_EQ(s.p90, sorted[899]);
  EXPECT_EQ(s.p99, sorted[989]);
  EXPECT_EQ(s.max, sorted[999]);
}

}  // namespace
}  // namespace tandem::bench
