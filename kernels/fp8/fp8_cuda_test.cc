// QuantizeActivations and Fp8Gemv (fp8_cuda.h) against the CPU reference (fp8.h,
// cpu::Fp8Linear) on fresh random inputs with random scales: per-tensor / per-channel (per-row
// scales over the whole row) and 128-column per-row blocks, the four activation schemes, m = 1..16,
// bias on and off (GPU; skips without one). QuantizeWeightTiles128 / DequantizeWeight (device dummy
// weights) against QuantizeWeight / cpu::DequantizeFp8Weight. The GEMM and its epilogue:
// fp8_gemm_cuda_test.cc.
#include "kernels/fp8/fp8_cuda.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_linear.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;

constexpr Fp8ActivationScheme kSchemes[] = {
    Fp8ActivationScheme::kNone, Fp8ActivationScheme::kStaticTensor,
    Fp8ActivationScheme::kDynamicToken, Fp8ActivationScheme::kDynamicGroup128};

std::vector<bf16> RandomBf16(std::mt19937& rng, int64_t count, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<bf16> v(count);
  for (bf16& x : v) x = __float2bfloat16_rn(dist(rng));
  return v;
}

// The GPU's codes and scales equal the CPU's, bit for bit, on the same bf16 inputs.
TEST(Fp8CudaTest, QuantizeActivationsEqualsTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  // k % 8 == 0 runs the vectorized kernels (QuantizeRowsVec8Kernel, QuantizeGroupsVec8Kernel: 1
  // group, 1 + a partial group, 32 groups, 85.5 groups (DeepSeek-V2-Lite's dense 10,944), and an
  // odd group count at 37 rows); k = 300 the general QuantizeKernel.
  for (int64_t k : {16, 200, 300, 4096, 10944, 2432}) {
    for (auto scheme : {Fp8ActivationScheme::kStaticTensor, Fp8ActivationScheme::kDynamicToken,
                        Fp8ActivationScheme::kDynamicGroup128}) {
      const int64_t m = k == 2432 ? 37 : 5;
      std::vector<bf16> x = RandomBf16(rng, m * k, 3.0f);
      for (int64_t c = 0; c < k; ++c) x[2 * k + c] = __float2bfloat16_rn(0.0f);  // scale 1
      const std::vector<float> xf = cuda_test::ToFloat(x);
      const int64_t ns = NumActivationScales(scheme, m, k);
      std::vector<uint8_t> want_codes(m * k);
      std::vector<float> want_scales(ns);
      kernels::QuantizeActivations(xf.data(), m, k, scheme, 0.03f, want_codes.data(),
                                   want_scales.data());
      DeviceBuffer<bf16> dx(x);
      DeviceBuffer<uint8_t> codes(m * k);
      DeviceBuffer<float> scales(ns);
      ASSERT_TRUE(
          QuantizeActivations(dx.get(), m, k, scheme, 0.03f, codes.get(), scales.get(), nullptr)
              .ok());
      TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(codes.ToHost(), want_codes) << "k=" << k << " scheme " << static_cast<int>(scheme);
      EXPECT_EQ(scales.ToHost(), want_scales) << "k=" << k;
      if (scheme != Fp8ActivationScheme::kDynamicGroup128) continue;
      // Group-major (the block GEMM's layout, ld = m + 1): the same codes, the CPU's scales at
      // [g * ld + row], the padding column untouched (both kernel forms: k = 300 the scalar one).
      const int64_t groups = ns / m, ld = m + 1;
      DeviceBuffer<uint8_t> codes2(m * k);
      DeviceBuffer<float> major(std::vector<float>(groups * ld, -1.0f));
      ASSERT_TRUE(QuantizeActivations(dx.get(), m, k, scheme, 0.03f, codes2.get(), major.get(),
                                      nullptr, false, ld)
                      .ok());
      TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(codes2.ToHost(), want_codes) << "group-major, k=" << k;
      std::vector<float> want_major(groups * ld, -1.0f);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
          want_major[Fp8GroupScaleIndex(r, g, groups, ld)] = want_scales[r * groups + g];
        }
      }
      EXPECT_EQ(major.ToHost(), want_major) << "group-major, k=" << k;
    }
  }
}

// Device dummy weights of 128 x 128-block configs: QuantizeWeightTiles128 against
// kernels::QuantizeWeight with a 128 x 128 grid (the tile scales expanded to rows; in cuBLASLt's
// block layout with padding 1), partial tiles both ways and an all-zero tile (scale 1), then
// DequantizeWeight against cpu::DequantizeFp8Weight rounded once to bf16. Bit-exact: the same
// fp32 inputs, IEEE division and round-to-nearest-even on both.
TEST(Fp8CudaTest, WeightTilesAndDequantizeEqualTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{300, 400}, {128, 512}, {64, 48}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    std::vector<float> w(n * k);
    for (float& v : w) v = d(rng) * 0.05f;
    if (n > 128 && k > 128) {
      for (int64_t r = 128; r < 256; ++r) std::fill_n(w.begin() + r * k + 128, 128, 0.0f);
    }
    const Fp8ScaleGrid tiles{n, k, 128, 128};
    const int64_t groups = tiles.GridCols(), ld = (groups + 3) / 4 * 4;
    std::vector<uint8_t> want_codes(n * k);
    std::vector<float> tile_scales(tiles.NumScales()), want_rows(n * groups);
    std::vector<float> want_blocks(tiles.GridRows() * ld, 1.0f);
    QuantizeWeight(w.data(), tiles, want_codes.data(), tile_scales.data());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t g = 0; g < groups; ++g)
        want_rows[r * groups + g] = tile_scales[r / 128 * groups + g];
    }
    for (int64_t b = 0; b < tiles.GridRows(); ++b) {
      std::copy_n(tile_scales.begin() + b * groups, groups, want_blocks.begin() + b * ld);
    }
    DeviceBuffer<float> dw(w), rows(n * groups), blocks(tiles.GridRows() * ld);
    DeviceBuffer<uint8_t> codes(n * k);
    ASSERT_TRUE(
        QuantizeWeightTiles128(dw.get(), n, k, codes.get(), rows.get(), blocks.get(), ld, nullptr)
            .ok());
    const Fp8ScaleGrid per_row{n, k, 1, 128};
    DeviceBuffer<bf16> wide(n * k);
    ASSERT_TRUE(DequantizeWeight(codes.get(), rows.get(), per_row, wide.get(), nullptr).ok());
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(codes.ToHost(), want_codes);
    EXPECT_EQ(rows.ToHost(), want_rows);
    EXPECT_EQ(blocks.ToHost(), want_blocks);
    std::vector<float> want_wide(n * k);
    cpu::DequantizeFp8Weight({want_codes.data(), want_rows.data(), per_row}, 0, n,
                             want_wide.data());
    const std::vector<float> got_wide = cuda_test::ToFloat(wide.ToHost());
    for (int64_t i = 0; i < n * k; ++i) {
      ASSERT_EQ(got_wide[i], cuda_test::ToF(cuda_test::FromF<bf16>(want_wide[i]))) << i;
    }
  }
  EXPECT_FALSE(QuantizeWeightTiles128(nullptr, 4, 4, nullptr, nullptr, nullptr, 0, nullptr).ok());
}

void CheckGemv(std::mt19937& rng, int64_t m, int64_t n, int64_t k, int64_t block_cols,
               Fp8ActivationScheme scheme, bool with_bias) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k << " block_cols "
                                    << block_cols << " scheme " << static_cast<int>(scheme));
  // A random FP8 weight with random per-row block scales.
  const Fp8ScaleGrid grid{n, k, 1, block_cols};
  std::vector<uint8_t> w_codes(n * k);
  for (uint8_t& c : w_codes) {
    do {
      c = static_cast<uint8_t>(rng() & 0xFF);
    } while ((c & 0x7F) == 0x7F);
  }
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> w_scales(grid.NumScales());
  for (float& s : w_scales) s = std::exp2(log_scale(rng));
  const std::vector<bf16> x = RandomBf16(rng, m * k, 2.0f);
  const std::vector<bf16> bias = RandomBf16(rng, n, 1.0f);
  // Reference: the CPU FP8 linear layer on the same bf16 values, then rounded like the output.
  Fp8WeightView view{w_codes.data(), w_scales.data(), grid, scheme, 0.05f};
  const std::vector<float> xf = cuda_test::ToFloat(x), bias_f = cuda_test::ToFloat(bias);
  std::vector<float> want(m * n);
  ASSERT_TRUE(
      cpu::Fp8Linear(xf.data(), view, with_bias ? bias_f.data() : nullptr, m, want.data(), nullptr)
          .ok());
  // |terms| bound for the tolerance: sum over k of |a| |w| (dequantized).
  std::vector<float> w_deq(n * k);
  cpu::DequantizeFp8Weight(view, 0, n, w_deq.data());
  DeviceBuffer<uint8_t> dw(w_codes);
  DeviceBuffer<float> dws(w_scales);
  DeviceBuffer<bf16> dx(x), dbias(bias);
  DeviceBuffer<uint8_t> a_codes(m * k);
  DeviceBuffer<float> a_scales(std::max<int64_t>(1, NumActivationScales(scheme, m, k)));
  Fp8DeviceActivations act;
  act.scheme = scheme;
  if (scheme == Fp8ActivationScheme::kNone) {
    act.values = dx.get();
  } else {
    ASSERT_TRUE(
        QuantizeActivations(dx.get(), m, k, scheme, 0.05f, a_codes.get(), a_scales.get(), nullptr)
            .ok());
    act.codes = a_codes.get();
    act.scales = a_scales.get();
  }
  DeviceBuffer<float> out(m * n);
  ASSERT_TRUE(Fp8Gemv<float>(act, Fp8DeviceWeight{dw.get(), dws.get(), grid},
                             with_bias ? dbias.get() : nullptr, m, out.get(), nullptr)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = out.ToHost();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double mag = with_bias ? std::fabs(bias_f[j]) : 0.0;
      for (int64_t c = 0; c < k; ++c) mag += std::fabs(xf[r * k + c] * w_deq[j * k + c]) * 1.07;
      ASSERT_NEAR(got[r * n + j], want[r * n + j], 4e-6 * std::sqrt(double(k)) * mag + 1e-30)
          << "row " << r << " col " << j;
    }
  }
}

TEST(Fp8CudaTest, GemvMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (auto scheme : kSchemes) {
    for (int64_t m : {1, 3, 8, 9, 16}) {
      CheckGemv(rng, m, 77, 4096, 128, scheme, m % 2 == 1);    // 128x128-style blocks
      CheckGemv(rng, m, 130, 4096, 4096, scheme, m % 2 == 0);  // per-channel / per-tensor
      CheckGemv(rng, m, 33, 272, 128, scheme, false);          // k not a multiple of 128
    }
  }
}

TEST(Fp8CudaTest, GemvRefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint8_t> w(64 * 64);
  DeviceBuffer<float> s(64);
  DeviceBuffer<bf16> x(17 * 64);
  DeviceBuffer<float> out(17 * 64);
  Fp8DeviceActivations act;
  act.values = x.get();
  const Fp8DeviceWeight weight{w.get(), s.get(), {64, 64, 1, 64}};
  EXPECT_FALSE(Fp8Gemv<float>(act, weight, nullptr, 17, out.get(), nullptr).ok());  // m > 16
  EXPECT_FALSE(
      Fp8Gemv<float>(act, {w.get(), s.get(), {64, 60, 1, 60}}, nullptr, 1, out.get(), nullptr)
          .ok());  // k % 16
  EXPECT_FALSE(
      Fp8Gemv<float>(act, {w.get(), s.get(), {64, 64, 128, 128}}, nullptr, 1, out.get(), nullptr)
          .ok());  // block rows
  EXPECT_TRUE(Fp8Gemv<float>(act, weight, nullptr, 16, out.get(), nullptr).ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
