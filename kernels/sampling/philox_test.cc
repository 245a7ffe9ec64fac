#include "kernels/sampling/philox.h"

#include <cmath>
#include <cstdint>
#include <random>

#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

// Random123's kat_vectors for philox4x32_10 (counter, key -> output).
struct Kat {
  PhiloxCounter counter;
  PhiloxKey key;
  PhiloxOutput want;
};
constexpr Kat kKats[] = {
    {{{0u, 0u, 0u, 0u}}, {{0u, 0u}}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
    {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
     {{0xffffffffu, 0xffffffffu}},
     {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
    {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
     {{0xa4093822u, 0x299f31d0u}},
     {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
};

// Usable in constant expressions (and so in device code without runtime state).
static_assert(Philox4x32_10(kKats[0].counter, kKats[0].key).x[0] == 0x6627e8d5u);

TEST(PhiloxTest, Random123KnownAnswers) {
  for (const Kat& kat : kKats) {
    const PhiloxOutput got = Philox4x32_10(kat.counter, kat.key);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(got.x[i], kat.want.x[i])
          << "word " << i << " of counter " << std::hex << kat.counter.x[0];
    }
  }
}

TEST(PhiloxTest, KeyFromSeedSplitsWords) {
  const PhiloxKey key = PhiloxKeyFromSeed(0x0123456789abcdefull);
  EXPECT_EQ(key.x[0], 0x89abcdefu);
  EXPECT_EQ(key.x[1], 0x01234567u);
}

TEST(PhiloxTest, UniformsStayInHalfOpenUnitInterval) {
  EXPECT_EQ(UniformDouble(0u, 0u), 0.0);
  EXPECT_LT(UniformDouble(0xffffffffu, 0xffffffffu), 1.0);
  EXPECT_GT(UniformDouble(0xffffffffu, 0xffffffffu), 1.0 - 1e-15);
  EXPECT_EQ(UniformDouble(0x80000000u, 0u), 0.5);
  EXPECT_EQ(UniformFloat(0u), 0.0f);
  EXPECT_LT(UniformFloat(0xffffffffu), 1.0f);
  EXPECT_EQ(UniformFloat(0x80000000u), 0.5f);
}

TEST(PhiloxTest, UniformMomentsLookRight) {
  // Mean 1/2 and variance 1/12 of 4 * 50000 words from consecutive counters, within 5
  // standard errors (a wrong round or constant fails this by a wide margin).
  const uint64_t seed =
      (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  const PhiloxKey key = PhiloxKeyFromSeed(seed);
  const int kDraws = 50000;
  double sum = 0.0, sum_sq = 0.0;
  for (uint32_t i = 0; i < kDraws; ++i) {
    const PhiloxOutput out = Philox4x32_10(PhiloxCounter{{i, 0u, 0u, 0u}}, key);
    for (uint32_t word : out.x) {
      const double u = UniformFloat(word);
      sum += u;
      sum_sq += u * u;
    }
  }
  const double n = 4.0 * kDraws;
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 5.0 * std::sqrt(1.0 / 12.0 / n));
  EXPECT_NEAR(var, 1.0 / 12.0, 5.0 * std::sqrt(1.0 / 180.0 / n));  // Var(u^2)-based bound
}

}  // namespace
}  // namespace tandem::kernels
