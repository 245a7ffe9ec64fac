// Fp8Linear against an fp64 reference built from the same codes and scales: every scale grid
// (per-tensor, per-channel, 128 x 128 blocks, partial blocks), every activation scheme, odd
// shapes with k not a multiple of 128, with and without bias, on 0-3 threads.
#include "kernels/fp8/fp8_linear.h"

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

struct Case {
  int64_t m, n, k;
  int64_t block_rows, block_cols;  // 0: the whole dimension
  Fp8ActivationScheme activation;
};

// A random FP8 weight: random codes (no NaN) with random positive scales per block.
struct RandomWeight {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Fp8WeightView view;
};

RandomWeight MakeWeight(const Case& c, std::mt19937* rng) {
  RandomWeight w;
  w.view.grid = {c.n, c.k, c.block_rows == 0 ? c.n : c.block_rows,
                 c.block_cols == 0 ? c.k : c.block_cols};
  w.codes.resize(c.n * c.k);
  for (uint8_t& code : w.codes) {
    do {
      code = static_cast<uint8_t>((*rng)() & 0xFF);
    } while ((code & 0x7F) == 0x7F || (code & 0x78) > 0x50);  // |value| <= 8: no huge products
  }
  std::uniform_real_distribution<float> log_scale(-8.0f, -2.0f);
  w.scales.resize(w.view.grid.NumScales());
  for (float& s : w.scales) s = std::exp2(log_scale(*rng));
  w.view.codes = w.codes.data();
  w.view.scales = w.scales.data();
  w.view.activation = c.activation;
  w.view.input_scale = 0.02f;
  return w;
}

// The activations as the scheme quantizes them, dequantized in double.
std::vector<double> ReferenceActivations(const std::vector<float>& a, const Case& c) {
  std::vector<double> out(a.begin(), a.end());
  if (c.activation == Fp8ActivationScheme::kNone) return out;
  std::vector<uint8_t> codes(c.m * c.k);
  std::vector<float> scales(NumActivationScales(c.activation, c.m, c.k));
  QuantizeActivations(a.data(), c.m, c.k, c.activation, 0.02f, codes.data(), scales.data());
  const int64_t groups = (c.k + 127) / 128;
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t j = 0; j < c.k; ++j) {
      double scale = scales[0];
      if (c.activation == Fp8ActivationScheme::kDynamicToken) scale = scales[r];
      if (c.activation == Fp8ActivationScheme::kDynamicGroup128) {
        scale = scales[r * groups + j / 128];
      }
      out[r * c.k + j] = static_cast<double>(Fp8E4m3ToFloat(codes[r * c.k + j])) * scale;
    }
  }
  return out;
}

void CheckCase(const Case& c, bool with_bias, int threads, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << c.m << " n=" << c.n << " k=" << c.k << " blocks " << c.block_rows << "x"
               << c.block_cols << " scheme " << static_cast<int>(c.activation) << " bias "
               << with_bias << " threads " << threads);
  std::mt19937 rng(seed);
  RandomWeight w = MakeWeight(c, &rng);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> a(c.m * c.k), bias(c.n);
  for (float& v : a) v = normal(rng);
  for (float& v : bias) v = normal(rng);
  std::vector<float> out(c.m * c.n + 1, 12345.0f);  // one sentinel past the end
  std::unique_ptr<ThreadPool> pool = threads > 0 ? std::make_unique<ThreadPool>(threads) : nullptr;
  ASSERT_TRUE(cpu::Fp8Linear(a.data(), w.view, with_bias ? bias.data() : nullptr, c.m, out.data(),
                             pool.get())
                  .ok());
  EXPECT_EQ(out[c.m * c.n], 12345.0f);
  const std::vector<double> act = ReferenceActivations(a, c);
  const Fp8ScaleGrid& g = w.view.grid;
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t n = 0; n < c.n; ++n) {
      double sum = with_bias ? bias[n] : 0.0, abs_sum = std::fabs(sum);
      for (int64_t j = 0; j < c.k; ++j) {
        const double wv = static_cast<double>(Fp8E4m3ToFloat(w.codes[n * c.k + j])) *
                          w.scales[(n / g.block_rows) * g.GridCols() + j / g.block_cols];
        sum += act[r * c.k + j] * wv;
        abs_sum += std::fabs(act[r * c.k + j] * wv);
      }
      ASSERT_NEAR(out[r * c.n + n], sum, 2e-6 * std::sqrt(c.k + 1.0) * abs_sum + 1e-30)
          << "row " << r << " col " << n;
    }
  }
}

TEST(Fp8LinearTest, MatchesFp64ReferenceOnEveryGridAndScheme) {
  const Fp8ActivationScheme schemes[] = {
      Fp8ActivationScheme::kNone, Fp8ActivationScheme::kStaticTensor,
      Fp8ActivationScheme::kDynamicToken, Fp8ActivationScheme::kDynamicGroup128};
  // {block_rows, block_cols}: per-tensor, per-channel, DeepSeek blocks, per-row 128-groups.
  const int64_t grids[][2] = {{0, 0}, {1, 0}, {128, 128}, {1, 128}};
  const int64_t shapes[][3] = {{1, 5, 100}, {3, 130, 129}, {17, 257, 300}, {2, 1, 1}};
  uint32_t seed = 1;
  for (auto scheme : schemes) {
    for (const auto& grid : grids) {
      for (const auto& shape : shapes) {
        const Case c{shape[0], shape[1], shape[2], grid[0], grid[1], scheme};
        CheckCase(c, /*with_bias=*/seed % 2 == 0, static_cast<int>(seed % 4), seed);
        ++seed;
      }
    }
  }
}

TEST(Fp8LinearTest, LargeWeightGoesThroughInChunks) {
  // n * k past the 4 Mi-element chunk: several dequantized chunks, written into place.
  CheckCase(Case{2, 1100, 4100, 128, 128, Fp8ActivationScheme::kDynamicGroup128}, true, 2, 99);
}

TEST(Fp8LinearTest, RefusesBadWeights) {
  std::vector<uint8_t> codes(4);
  std::vector<float> scales(1, 1.0f);
  Fp8WeightView w{codes.data(), scales.data(), {2, 2, 2, 2}};
  std::vector<float> a(2, 1.0f), out(2);
  EXPECT_TRUE(cpu::Fp8Linear(a.data(), w, nullptr, 1, out.data(), nullptr).ok());
  Fp8WeightView bad = w;
  bad.scales = nullptr;
  EXPECT_FALSE(cpu::Fp8Linear(a.data(), bad, nullptr, 1, out.data(), nullptr).ok());
  bad = w;
  bad.grid.block_cols = 0;
  EXPECT_FALSE(cpu::Fp8Linear(a.data(), bad, nullptr, 1, out.data(), nullptr).ok());
  bad = w;
  bad.activation = Fp8ActivationScheme::kStaticTensor;
  bad.input_scale = 0.0f;
  EXPECT_EQ(cpu::Fp8Linear(a.data(), bad, nullptr, 1, out.data(), nullptr).message(),
            "FP8 static activation scale must be positive and finite, got 0");
}

}  // namespace
}  // namespace tandem::kernels
