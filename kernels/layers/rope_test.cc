#include "kernels/layers/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

// fp64 transcription of transformers' modeling_rope_utils (default, linear, llama3).
std::vector<double> RefInvFreq(double theta, int64_t dim, const RopeScaling& s) {
  std::vector<double> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(dim));
  }
  if (s.type == RopeType::kLinear) {
    for (double& f : inv) f /= s.factor;
  } else if (s.type == RopeType::kLlama3) {
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / s.low_freq_factor;
    const double high_freq_wavelen = old_len / s.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      double scaled = wavelen > low_freq_wavelen ? f / s.factor : f;
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
        scaled = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
      }
      f = scaled;
    }
  }
  return inv;
}

// transformers computes the exponent 2i/dim in fp32 (rounding error <= 6e-8 relative), which pow
// amplifies by ln(theta) (<= ~14 for theta <= 1e6): ~1e-6 relative from the fp64 formula, so
// 4e-6 is the tolerance against the exact formula. Hand-checked values below are tighter.
constexpr double kInvFreqRelTol = 4e-6;

void ExpectMatchesReference(double theta, int64_t dim, const RopeScaling& s) {
  SCOPED_TRACE(testing::Message() << "theta=" << theta << " dim=" << dim << " type="
                                  << static_cast<int>(s.type) << " factor=" << s.factor);
  const absl::StatusOr<std::vector<float>> got = ComputeRopeInvFreq(theta, dim, s);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<double> want = RefInvFreq(theta, dim, s);
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR((*got)[i], want[i], kInvFreqRelTol * want[i]) << "i=" << i;
  }
}

// YaRN (transformers' _compute_yarn_parameters) in fp64: the correction range from beta_fast /
// beta_slow at original_max_position_embeddings, floor/ceil when truncating, a linear ramp
// between interpolated (/ factor) and extrapolated frequencies.
std::vector<double> RefYarn(double theta, int64_t dim, const RopeScaling& s) {
  auto correction = [&](double rotations) {
    return dim * std::log(s.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  double low = correction(s.beta_fast), high = correction(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<double> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double extrapolation = 1.0 / std::pow(theta, static_cast<double>(2 * i) / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    inv[i] = extrapolation / s.factor * ramp + extrapolation * (1.0 - ramp);
  }
  return inv;
}

TEST(RopeInvFreqTest, YarnMatchesTransformersAndItsAttentionFactor) {
  for (auto [factor, original, truncate] :
       {std::tuple{40.0, int64_t{4096}, true}, std::tuple{4.0, int64_t{64}, true},
        std::tuple{8.0, int64_t{2048}, false}}) {
    RopeScaling s;
    s.type = RopeType::kYarn;
    s.factor = factor;
    s.original_max_position_embeddings = original;
    s.truncate = truncate;
    for (int64_t dim : {8, 64}) {
      const absl::StatusOr<std::vector<float>> got = ComputeRopeInvFreq(10000.0, dim, s);
      ASSERT_TRUE(got.ok()) << got.status();
      const std::vector<double> want = RefYarn(10000.0, dim, s);
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR((*got)[i], want[i], kInvFreqRelTol * want[i])
            << factor << " " << dim << " " << i;
      }
    }
  }
  RopeScaling s;
  s.type = RopeType::kYarn;
  s.factor = 40.0;
  EXPECT_NEAR(RopeAttentionFactor(s), 0.1 * std::log(40.0) + 1.0, 1e-12);  // get_mscale(factor)
  s.mscale = s.mscale_all_dim = 0.707;  // DeepSeek-V2-Lite: the two cancel
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(s), 1.0);
  s.mscale_all_dim = 0.8;
  EXPECT_NEAR(RopeAttentionFactor(s), (0.0707 * std::log(40.0) + 1) / (0.08 * std::log(40.0) + 1),
              1e-12);
  s.attention_factor = 1.5;  // explicit wins
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(s), 1.5);
  EXPECT_DOUBLE_EQ(YarnGetMscale(1.0, 0.7), 1.0);
  RopeScaling linear;
  linear.type = RopeType::kLinear;
  linear.factor = 4.0;
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(linear), 1.0);
}

TEST(RopeInvFreqTest, DefaultMatchesTransformers) {
  for (double theta : {10000.0, 500000.0, 1000000.0}) {
    for (int64_t dim : {2, 64, 80, 128, 256}) ExpectMatchesReference(theta, dim, RopeScaling{});
  }
}

TEST(RopeInvFreqTest, LinearMatchesTransformers) {
  for (double factor : {0.5, 2.0, 4.0, 3.3}) {
    RopeScaling s;
    s.type = RopeType::kLinear;
    s.factor = factor;
    ExpectMatchesReference(10000.0, 128, s);
  }
}

TEST(RopeInvFreqTest, Llama3MatchesTransformers) {
  // Llama 3.1 (factor 8, 8192) and Llama 3.2 (factor 32) settings, plus unusual factors.
  struct Params {
    double factor, low, high;
    int64_t original;
  };
  for (const Params p : {Params{8.0, 1.0, 4.0, 8192}, Params{32.0, 1.0, 4.0, 8192},
                         Params{4.0, 2.0, 3.0, 4096}, Params{16.0, 0.5, 8.0, 2048}}) {
    RopeScaling s;
    s.type = RopeType::kLlama3;
    s.factor = p.factor;
    s.low_freq_factor = p.low;
    s.high_freq_factor = p.high;
    s.original_max_position_embeddings = p.original;
    for (int64_t dim : {64, 128}) ExpectMatchesReference(500000.0, dim, s);
  }
}

TEST(RopeInvFreqTest, HandCheckedValues) {
  // theta = 10000, dim = 128: exponents 0, 0.25, 0.5 are exact in fp32, so inv_freq is
  // exactly 1, 1/10, 1/100 rounded to fp32; i = 1 is 10000^(-1/64) = 0.86596432336...
  const std::vector<float> def = *ComputeRopeInvFreq(10000.0, 128, RopeScaling{});
  ASSERT_EQ(def.size(), 64u);
  EXPECT_EQ(def[0], 1.0f);
  EXPECT_EQ(def[16], 0.1f);
  EXPECT_EQ(def[32], 0.01f);
  EXPECT_NEAR(def[1], 0.8659643233600653, 1e-7);

  RopeScaling linear;
  linear.type = RopeType::kLinear;
  linear.factor = 4.0;
  const std::vector<float> lin = *ComputeRopeInvFreq(10000.0, 128, linear);
  EXPECT_EQ(lin[0], 0.25f);
  EXPECT_EQ(lin[32], 0.0025f);  // division by a power of two is exact

  // Llama 3.1: theta 500000, factor 8, low 1, high 4, 8192. High frequencies (wavelen < 2048)
  // are untouched, low ones (wavelen > 8192) divided by 8, i = 29..34 interpolated. For i = 32:
  // inv = 500000^-0.5 = 1.41421356e-3, wavelen = 4442.88, smooth = (8192/4442.88 - 1)/3 =
  // 0.2812826, result = inv * ((1 - smooth)/8 + smooth) = 5.2484616e-4.
  RopeScaling llama3;
  llama3.type = RopeType::kLlama3;
  llama3.factor = 8.0;
  const std::vector<float> base = *ComputeRopeInvFreq(500000.0, 128, RopeScaling{});
  const std::vector<float> l3 = *ComputeRopeInvFreq(500000.0, 128, llama3);
  EXPECT_EQ(l3[0], 1.0f);
  for (int i = 0; i <= 28; ++i) EXPECT_EQ(l3[i], base[i]) << "high-frequency i=" << i;
  for (int i = 35; i < 64; ++i) EXPECT_EQ(l3[i], base[i] / 8.0f) << "low-frequency i=" << i;
  for (int i = 29; i <= 34; ++i) {
    EXPECT_LT(l3[i], base[i]) << i;
    EXPECT_GT(l3[i], base[i] / 8.0f) << i;
  }
  EXPECT_NEAR(l3[32], 5.248461609929547e-4, 2e-10);
}

TEST(RopeInvFreqTest, RejectsBadConfig) {
  RopeScaling linear_zero;
  linear_zero.type = RopeType::kLinear;
  linear_zero.factor = 0.0;
  RopeScaling llama3_inverted;
  llama3_inverted.type = RopeType::kLlama3;
  llama3_inverted.low_freq_factor = 4.0;
  llama3_inverted.high_freq_factor = 4.0;
  RopeScaling llama3_no_len;
  llama3_no_len.type = RopeType::kLlama3;
  llama3_no_len.original_max_position_embeddings = 0;
  struct Case {
    double theta;
    int64_t dim;
    RopeScaling scaling;
  };
  for (const Case& c : {Case{0.0, 128, {}}, Case{-1.0, 128, {}}, Case{NAN, 128, {}},
                        Case{INFINITY, 128, {}}, Case{10000.0, 0, {}}, Case{10000.0, 7, {}},
                        Case{10000.0, -2, {}}, Case{10000.0, 128, linear_zero},
                        Case{10000.0, 128, llama3_inverted}, Case{10000.0, 128, llama3_no_len}}) {
    EXPECT_EQ(ComputeRopeInvFreq(c.theta, c.dim, c.scaling).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "theta=" << c.theta << " dim=" << c.dim;
  }
}

// fp64 rotate-half on one head. The angle is the fp32 product, as transformers forms it; from
// there on everything is fp64.
void RefRotate(const std::vector<float>& inv_freq, int64_t pos, const float* x, int64_t head_dim,
               double* out) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(inv_freq[i] * static_cast<float>(pos));
    const double c = std::cos(angle), s = std::sin(angle);
    out[i] = x[i] * c - double{x[i + half]} * s;
    out[i + half] = x[i + half] * c + double{x[i]} * s;
  }
}

}  // namespace

namespace cpu {
namespace {

TEST(ApplyRopeTest, MatchesFp64RotateHalfWithGqa) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  struct Shape {
    int64_t num_tokens, head_dim, num_q_heads, num_kv_heads;
  };
  for (const Shape s : {Shape{1, 64, 1, 1}, Shape{5, 128, 8, 2}, Shape{3, 2, 4, 4},
                        Shape{7, 80, 14, 2}, Shape{2, 256, 6, 1}}) {
    SCOPED_TRACE(testing::Message()
                 << "tokens=" << s.num_tokens << " head_dim=" << s.head_dim
                 << " q_heads=" << s.num_q_heads << " kv_heads=" << s.num_kv_heads);
    RopeScaling llama3;
    llama3.type = RopeType::kLlama3;
    llama3.factor = 8.0;
    const std::vector<float> inv_freq = *ComputeRopeInvFreq(500000.0, s.head_dim, llama3);
    std::vector<int64_t> positions(static_cast<size_t>(s.num_tokens));
    for (int64_t& p : positions) p = rng() % 8192;
    positions[0] = s.num_tokens > 1 ? 131071 : 0;  // a long-context position too
    std::vector<float> q(static_cast<size_t>(s.num_tokens * s.num_q_heads * s.head_dim));
    std::vector<float> k(static_cast<size_t>(s.num_tokens * s.num_kv_heads * s.head_dim));
    for (float& v : q) v = dist(rng);
    for (float& v : k) v = dist(rng);
    const std::vector<float> q0 = q, k0 = k;

    ApplyRope(positions.data(), s.num_tokens, inv_freq.data(), s.head_dim, q.data(), s.num_q_heads,
              k.data(), s.num_kv_heads);

    std::vector<double> want(static_cast<size_t>(s.head_dim));
    auto check = [&](const std::vector<float>& before, const std::vector<float>& after,
                     int64_t heads, const char* name) {
      const int64_t half = s.head_dim / 2;
      for (int64_t t = 0; t < s.num_tokens; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t off = (t * heads + h) * s.head_dim;
          RefRotate(inv_freq, positions[t], before.data() + off, s.head_dim, want.data());
          for (int64_t i = 0; i < s.head_dim; ++i) {
            // Three rounded fp32 ops plus rounded cos/sin: error <= ~3 ulp of |x1| + |x2|.
            const double scale =
                std::abs(before[off + i % half]) + std::abs(before[off + i % half + half]);
            ASSERT_NEAR(after[off + i], want[i], 1e-6 * scale + 1e-30)
                << name << " token " << t << " head " << h << " i " << i;
          }
        }
      }
    };
    check(q0, q, s.num_q_heads, "q");
    check(k0, k, s.num_kv_heads, "k");
  }
}

TEST(ApplyRopeTest, PositionZeroIsIdentity) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(0.5f, 2.0f);
  const int64_t head_dim = 64;
  const std::vector<float> inv_freq = *ComputeRopeInvFreq(10000.0, head_dim, RopeScaling{});
  std::vector<float> q(2 * head_dim), k(head_dim);
  for (float& v : q) v = dist(rng);
  for (float& v : k) v = -dist(rng);
  const std::vector<float> q0 = q, k0 = k;
  const int64_t position = 0;
  ApplyRope(&position, 1, inv_freq.data(), head_dim, q.data(), 2, k.data(), 1);
  EXPECT_EQ(q, q0);
  EXPECT_EQ(k, k0);
}

}  // namespace
}  // namespace cpu
}  // namespace tandem::kernels
