// e4m3fn conversion and activation / weight quantization against brute force over the 256 codes.
#include "kernels/fp8/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

// The nearest finite code by exhaustive search; ties to the even code (mantissa bit 0 clear).
uint8_t NearestCode(float x) {
  if (std::fabs(x) >= kFp8E4m3Max) return x < 0 ? 0xFE : 0x7E;
  int best = -1;
  double best_err = 0;
  for (int code = 0; code < 256; ++code) {
    const float v = Fp8E4m3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(v) || (std::signbit(v) != std::signbit(x))) continue;
    const double err = std::fabs(static_cast<double>(v) - x);
    if (best < 0 || err < best_err || (err == best_err && (code & 1) == 0)) {
      best = code;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(Fp8E4m3Test, DecodesTheFormat) {
  EXPECT_EQ(Fp8E4m3ToFloat(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(Fp8E4m3ToFloat(0x80)));
  EXPECT_EQ(Fp8E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4m3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(Fp8E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0xFF)));
}

TEST(Fp8E4m3Test, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    EXPECT_EQ(FloatToFp8E4m3(Fp8E4m3ToFloat(static_cast<uint8_t>(code))), code) << code;
  }
}

TEST(Fp8E4m3Test, RoundsToNearestEvenAndSaturates) {
  // Midpoints between neighbouring codes go to the even one.
  for (int code = 0; code < 0x7E; ++code) {
    const float lo = Fp8E4m3ToFloat(static_cast<uint8_t>(code));
    const float hi = Fp8E4m3ToFloat(static_cast<uint8_t>(code + 1));
    const float mid = 0.5f * (lo + hi);
    EXPECT_EQ(FloatToFp8E4m3(mid), (code & 1) == 0 ? code : code + 1) << code;
    EXPECT_EQ(FloatToFp8E4m3(-mid), 0x80 | ((code & 1) == 0 ? code : code + 1)) << code;
  }
  EXPECT_EQ(FloatToFp8E4m3(1e6f), 0x7E);
  EXPECT_EQ(FloatToFp8E4m3(-500.0f), 0xFE);
  EXPECT_EQ(FloatToFp8E4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(FloatToFp8E4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToFp8E4m3(1e-30f), 0x00);
}

TEST(Fp8E4m3Test, RandomValuesMatchBruteForce) {
  std::mt19937 rng(38);
  std::uniform_real_distribution<float> log2_mag(-12.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(log2_mag(rng)) * (rng() & 1 ? -1.0f : 1.0f);
    ASSERT_EQ(FloatToFp8E4m3(x), NearestCode(x)) << x;
  }
}

// Dequantized values are within half a step of the input; scales are amax / 448 per row, per
// 128-group, or the static one.
TEST(Fp8QuantizeTest, ActivationSchemes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t m = 3, k = 300;  // k not a multiple of 128: a partial last group
  std::vector<float> x(m * k);
  for (float& v : x) v = normal(rng);
  for (int64_t c = 0; c < k; ++c) x[1 * k + c] = 0.0f;  // a row of zeros gets scale 1
  std::vector<uint8_t> codes(m * k);
  for (auto scheme : {Fp8ActivationScheme::kStaticTensor, Fp8ActivationScheme::kDynamicToken,
                      Fp8ActivationScheme::kDynamicGroup128}) {
    std::vector<float> scales(NumActivationScales(scheme, m, k));
    QuantizeActivations(x.data(), m, k, scheme, 0.05f, codes.data(), scales.data());
    const int64_t groups = (k + 127) / 128;
    EXPECT_EQ(static_cast<int64_t>(scales.size()), scheme == Fp8ActivationScheme::kStaticTensor ? 1
                                                   : scheme == Fp8ActivationScheme::kDynamicToken
                                                       ? m
                                                       : m * groups);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t c0 = g * 128, c1 = std::min(k, c0 + 128);
        float amax = 0;
        const bool per_group = scheme == Fp8ActivationScheme::kDynamicGroup128;
        for (int64_t c = per_group ? c0 : 0; c < (per_group ? c1 : k); ++c) {
          amax = std::max(amax, std::fabs(x[r * k + c]));
        }
        float scale = 0.05f;
        if (scheme == Fp8ActivationScheme::kDynamicToken) {
          scale = scales[r];
          EXPECT_EQ(scale, amax > 0 ? amax / 448.0f : 1.0f);
        } else if (per_group) {
          scale = scales[r * groups + g];
          EXPECT_EQ(scale, amax > 0 ? amax / 448.0f : 1.0f);
        }
        for (int64_t c = c0; c < c1; ++c) {
          ASSERT_EQ(codes[r * k + c], NearestCode(x[r * k + c] / scale)) << r << " " << c;
        }
      }
    }
  }
}

TEST(Fp8QuantizeTest, WeightBlocks) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  const Fp8ScaleGrid grid{200, 260, 128, 128};  // partial blocks both ways
  ASSERT_EQ(grid.NumScales(), 2 * 3);
  std::vector<float> w(grid.rows * grid.cols);
  for (float& v : w) v = normal(rng);
  std::vector<uint8_t> codes(w.size());
  std::vector<float> scales(grid.NumScales());
  QuantizeWeight(w.data(), grid, codes.data(), scales.data());
  for (int64_t r = 0; r < grid.rows; ++r) {
    for (int64_t c = 0; c < grid.cols; ++c) {
      const float scale = scales[(r / 128) * 3 + c / 128];
      const float deq = Fp8E4m3ToFloat(codes[r * grid.cols + c]) * scale;
      // 3 mantissa bits: within 1/16 relative, or half the subnormal step.
      ASSERT_LE(std::fabs(deq - w[r * grid.cols + c]),
                std::max(std::fabs(w[r * grid.cols + c]) / 16.0f, scale * 0.001f))
          << r << " " << c;
    }
  }
  // Each block's largest element maps to +-448 exactly.
  EXPECT_FLOAT_EQ(scales[0] * 448.0f, [&] {
    float amax = 0;
    for (int64_t r = 0; r < 128; ++r) {
      for (int64_t c = 0; c < 128; ++c) amax = std::max(amax, std::fabs(w[r * grid.cols + c]));
    }
    return amax;
  }());
}

}  // namespace
}  // namespace tandem::kernels
