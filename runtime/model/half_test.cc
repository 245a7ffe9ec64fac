#include "runtime/model/half.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// fp64 reference decoders written from the format definitions.
double RefF16(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31)
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  return sign * std::ldexp(1024 + m, e - 25);
}
double RefBf16(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int e = (h >> 7) & 0xff;
  const int m = h & 0x7f;
  if (e == 0) return sign * std::ldexp(m, -133);
  if (e == 255)
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  return sign * std::ldexp(128 + m, e - 134);
}

// Round-to-nearest-even reference: the positive codes in value order, with infinity standing in
// as the value one step past the largest finite number (what IEEE rounding compares against).
struct Rounder {
  std::vector<std::pair<double, uint16_t>> codes;
  Rounder(double (*decode)(uint16_t), uint16_t inf_code, double inf_as) {
    for (uint32_t c = 0; c < inf_code; ++c) codes.push_back({decode(c), static_cast<uint16_t>(c)});
    codes.push_back({inf_as, inf_code});
  }
  uint16_t Round(float f) const {
    const double v = std::fabs(static_cast<double>(f));
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (v >= codes.back().first) return sign | codes.back().second;
    auto hi = std::lower_bound(codes.begin(), codes.end(), std::make_pair(v, uint16_t{0}));
    if (hi->first == v) return sign | hi->second;
    auto lo = hi - 1;
    const double dlo = v - lo->first, dhi = hi->first - v;
    if (dlo < dhi) return sign | lo->second;
    if (dhi < dlo) return sign | hi->second;
    return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);
  }
};

TEST(HalfTest, Bf16KnownPatterns) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001)), 0x3f81);  // just above the tie
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7fffff)), 0x7f80);  // FLT_MAX overflows to inf
  EXPECT_EQ(FloatToBf16(FromBits(0x00000001)), 0x0000);  // smallest fp32 subnormal
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000)), 0x0002);  // subnormal tie to even
  // NaN stays NaN, sign kept, even when only low payload bits were set.
  EXPECT_EQ(FloatToBf16(FromBits(0x7f800001)), 0x7fc0);
  EXPECT_EQ(FloatToBf16(FromBits(0xffc00000)), 0xffc0);
  EXPECT_EQ(Bits(Bf16ToFloat(0x3f80)), 0x3f800000u);
  EXPECT_EQ(Bits(Bf16ToFloat(0x0001)), 0x00010000u);  // bf16 subnormal, exact
  EXPECT_EQ(Bits(Bf16ToFloat(0xff80)), 0xff800000u);
  EXPECT_EQ(Bits(Bf16ToFloat(0x7fc1)), 0x7fc10000u);
}

TEST(HalfTest, F16KnownPatterns) {
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);  // tie between max and "65536": even = inf
  EXPECT_EQ(FloatToF16(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (zero)
  EXPECT_EQ(FloatToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(FloatToF16(-std::ldexp(1.0f, -26)), 0x8000);
  EXPECT_EQ(FloatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even
  EXPECT_EQ(FloatToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd -> up
  EXPECT_EQ(FloatToF16(std::ldexp(1023.5f, -24)), 0x0400);  // carry into the smallest normal
  EXPECT_EQ(FloatToF16(FromBits(0x7f800001)) & 0x7c00, 0x7c00);
  EXPECT_NE(FloatToF16(FromBits(0x7f800001)) & 0x03ff, 0);
  EXPECT_EQ(FloatToF16(FromBits(0xffc00000)), 0xfe00);
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Bits(F16ToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(F16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Bits(F16ToFloat(0xfc00)), 0xff800000u);
  EXPECT_EQ(Bits(F16ToFloat(0x7e01)), 0x7fc02000u);
}

TEST(HalfTest, WideningIsExactForEveryCode) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const auto h = static_cast<uint16_t>(c);
    for (bool bf16 : {false, true}) {
      const double ref = bf16 ? RefBf16(h) : RefF16(h);
      const float got = bf16 ? Bf16ToFloat(h) : F16ToFloat(h);
      if (std::isnan(ref)) {
        ASSERT_TRUE(std::isnan(got)) << std::hex << c;
        // NaNs survive the round trip as NaNs with their sign.
        const uint16_t back = bf16 ? FloatToBf16(got) : FloatToF16(got);
        ASSERT_EQ(back & 0x8000, h & 0x8000);
        ASSERT_TRUE(std::isnan(bf16 ? Bf16ToFloat(back) : F16ToFloat(back)));
        continue;
      }
      ASSERT_EQ(static_cast<double>(got), ref) << std::hex << c << " bf16=" << bf16;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0);
      // Narrowing a representable value gives its code back.
      ASSERT_EQ(bf16 ? FloatToBf16(got) : FloatToF16(got), h) << std::hex << c;
    }
  }
}

TEST(HalfTest, MidpointsTieToEven) {
  // Midpoints of neighbouring codes need 12 (f16) or 9 (bf16) significant bits: exact in fp32.
  for (uint32_t c = 0; c + 1 < 0x7c00; ++c) {
    const float mid = static_cast<float>((RefF16(c) + RefF16(c + 1)) / 2);
    ASSERT_EQ(FloatToF16(mid), (c & 1) == 0 ? c : c + 1) << std::hex << c;
  }
  for (uint32_t c = 0; c + 1 < 0x7f80; ++c) {
    const float mid = static_cast<float>((RefBf16(c) + RefBf16(c + 1)) / 2);
    ASSERT_EQ(FloatToBf16(-mid), 0x8000 | ((c & 1) == 0 ? c : c + 1)) << std::hex << c;
  }
}

TEST(HalfTest, RandomFloatsMatchReferenceRounding) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const Rounder f16(RefF16, 0x7c00, 65536.0);
  const Rounder bf16(RefBf16, 0x7f80, std::ldexp(1.0, 128));
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> f16_range(-70000.0f, 70000.0f);
  for (int i = 0; i < 200000; ++i) {
    float f = FromBits(any_bits(rng));
    if (std::isnan(f)) continue;
    // Half of the draws in f16's range, spread over its exponents, so rounding gets exercised.
    const float g = (i % 2 == 0) ? f16_range(rng) * std::ldexp(1.0f, -(i % 40)) : f;
    ASSERT_EQ(FloatToBf16(f), bf16.Round(f)) << std::hex << Bits(f);
    ASSERT_EQ(FloatToF16(g), f16.Round(g)) << std::hex << Bits(g);
  }
}

}  // namespace
}  // namespace tandem::runtime
