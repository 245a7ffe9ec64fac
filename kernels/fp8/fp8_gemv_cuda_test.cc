// Fp8SmallMLinear (fp8_gemv_cuda.h), all three kernels, against the CPU reference cpu::Fp8Linear on
// fresh random inputs with random scales: m = 1, 3, 8, 9, 16; n and k not multiples of the
// tiles (n = 77, 8200; k = 272, 1040); per-tensor (one scale on every row), per-channel and
// 128-column weight blocks; weight-only, static, per-token and 1 x 128 activations, each from
// QuantizeActivations' codes and quantized inside the register kernel (fused), where both must
// give the same bits; bf16 and fp32 output, bias on and off; then the streaming kernel's work
// splits (an idle warp, clusters of 8 blocks, several tiles a block) and the pipelined kernel's
// edges (partial tiles and groups, idle warps, 4 and 8 warps) (GPU; skips without one).
#include "kernels/fp8/fp8_gemv_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_linear.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;
using fp8_test::RandomBf16;
using fp8_test::RandomE4m3Codes;
using Scheme = Fp8ActivationScheme;

constexpr float kStaticScale = 0.05f;

enum class WeightScales { kTensor, kChannel, kBlock128 };

struct Case {
  int64_t m, n, k;
  WeightScales scales;
  Scheme scheme;
  bool bias;
};

// The device output as floats, NaN-poisoned before the call so an unwritten element fails.
template <typename TOut>
std::vector<float> Run(const Fp8SmallMActivations& act, const Fp8DeviceWeight& w, const bf16* bias,
                       int64_t m, Fp8GemvKernel kernel = Fp8GemvKernel::kStreaming) {
  DeviceBuffer<TOut> out(m * w.grid.rows);
  cudaMemset(out.get(), 0xFF, out.size() * sizeof(TOut));
  const absl::Status st =
      Fp8SmallMLinear<TOut>(act, w, bias, m, out.get(), nullptr, false, true, kernel);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if constexpr (std::is_same_v<TOut, float>) {
    return out.ToHost();
  } else {
    return cuda_test::ToFloat(out.ToHost());
  }
}

void Check(std::mt19937& rng, const Case& c) {
  const int64_t m = c.m, n = c.n, k = c.k;
  SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k << " weight scales "
                                    << static_cast<int>(c.scales) << " scheme "
                                    << static_cast<int>(c.scheme) << (c.bias ? " bias" : ""));
  const Fp8ScaleGrid grid{n, k, 1, c.scales == WeightScales::kBlock128 ? 128 : k};
  const std::vector<uint8_t> w_codes = RandomE4m3Codes(rng, n * k);
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> w_scales(grid.NumScales());
  for (float& s : w_scales) s = std::exp2(log_scale(rng));
  if (c.scales == WeightScales::kTensor) std::fill(w_scales.begin(), w_scales.end(), w_scales[0]);
  // Rows of different magnitudes (different per-token scales), one of them zero (scale 1).
  std::vector<bf16> x = RandomBf16(rng, m * k, 2.0f);
  std::uniform_real_distribution<float> row_gain(0.01f, 8.0f);
  for (int64_t r = 0; r < m; ++r) {
    const float gain = m > 2 && r == m / 2 ? 0.0f : row_gain(rng);
    for (int64_t i = 0; i < k; ++i) {
      x[r * k + i] = __float2bfloat16_rn(__bfloat162float(x[r * k + i]) * gain);
    }
  }
  const std::vector<bf16> bias = RandomBf16(rng, n, 1.0f);
  const std::vector<float> xf = cuda_test::ToFloat(x), bias_f = cuda_test::ToFloat(bias);
  const Fp8WeightView view{w_codes.data(), w_scales.data(), grid, c.scheme, kStaticScale};
  std::vector<float> want(m * n), w_deq(n * k);
  ASSERT_TRUE(
      cpu::Fp8Linear(xf.data(), view, c.bias ? bias_f.data() : nullptr, m, want.data(), nullptr)
          .ok());
  cpu::DequantizeFp8Weight(view, 0, n, w_deq.data());

  DeviceBuffer<uint8_t> dw(w_codes);
  DeviceBuffer<float> dws(w_scales);
  DeviceBuffer<bf16> dx(x), dbias(bias);
  const Fp8DeviceWeight w{dw.get(), dws.get(), grid};
  const bf16* b = c.bias ? dbias.get() : nullptr;
  Fp8SmallMActivations values;  // weight-only, or quantized inside the kernel
  values.scheme = c.scheme;
  values.values = dx.get();
  values.static_scale = kStaticScale;
  // outs[1] is bf16, and with codes outs[4] and outs[6]; the rest fp32. Weight-only FP8 runs
  // both kernels on the bf16 values; a quantizing scheme runs the register kernel with the
  // quantization fused, then every kernel on QuantizeActivations' codes (the pipelined one
  // where it applies: m <= 8, scales constant along k; else what it falls back to).
  std::vector<std::vector<float>> outs = {Run<float>(values, w, b, m), Run<bf16>(values, w, b, m)};
  if (c.scheme == Scheme::kNone) {
    outs.push_back(Run<float>(values, w, b, m, Fp8GemvKernel::kRegisterLoads));
  } else {
    DeviceBuffer<uint8_t> codes(m * k);
    DeviceBuffer<float> scales(NumActivationScales(c.scheme, m, k));
    ASSERT_TRUE(QuantizeActivations(dx.get(), m, k, c.scheme, kStaticScale, codes.get(),
                                    scales.get(), nullptr)
                    .ok());
    Fp8SmallMActivations pre;
    pre.scheme = c.scheme;
    pre.codes = codes.get();
    pre.scales = scales.get();
    outs.push_back(Run<float>(pre, w, b, m, Fp8GemvKernel::kRegisterLoads));
    // The fused quantization gives QuantizeActivations' codes and scales, and the products run
    // in the same order in the same kernel: the same bits.
    ASSERT_EQ(std::memcmp(outs[0].data(), outs[2].data(), outs[0].size() * sizeof(float)), 0)
        << "fused quantization differs from QuantizeActivations + the kernel";
    outs.push_back(Run<float>(pre, w, b, m));  // the streaming kernel
    outs.push_back(Run<bf16>(pre, w, b, m));
    outs.push_back(Run<float>(pre, w, b, m, Fp8GemvKernel::kPipelined));
    outs.push_back(Run<bf16>(pre, w, b, m, Fp8GemvKernel::kPipelined));
    // The other pipelined forms issue their first loads elsewhere around the PDL wait (or
    // prefetch them into L2), nothing else: kPipelined's bits.
    for (Fp8GemvKernel form :
         {Fp8GemvKernel::kPipelinedOneEarly, Fp8GemvKernel::kPipelinedPrefetchL2,
          Fp8GemvKernel::kPipelinedLate}) {
      const std::vector<float> got = Run<float>(pre, w, b, m, form);
      ASSERT_EQ(std::memcmp(got.data(), outs[5].data(), got.size() * sizeof(float)), 0)
          << "pipelined form " << static_cast<int>(form) << " differs from kPipelined";
    }
  }
  for (size_t v = 0; v < outs.size(); ++v) {
    const bool bf16_out = v == 1 || v == 4 || v == 6;
    const double rounding = bf16_out ? 0x1p-8 : 0.0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double mag = c.bias ? std::fabs(bias_f[j]) : 0.0;
        for (int64_t i = 0; i < k; ++i) mag += std::fabs(xf[r * k + i] * w_deq[j * k + i]) * 1.07;
        // fp32 summation, plus Hopper's FP8 MMA accumulating with ~14 bits inside each
        // 128-column group (DeepSeek-V3 report 3.3.2), plus the output rounding.
        const double tol =
            (4e-6 * std::sqrt(double(k)) + 0x1p-13) * mag + rounding * std::fabs(want[r * n + j]);
        ASSERT_NEAR(outs[v][r * n + j], want[r * n + j], tol + 1e-30)
            << "output " << v << " row " << r << " col " << j;
      }
    }
  }
}

TEST(Fp8GemvCudaTest, MatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (Scheme scheme :
       {Scheme::kNone, Scheme::kStaticTensor, Scheme::kDynamicToken, Scheme::kDynamicGroup128}) {
    for (int64_t m : {1, 3, 8, 9, 16}) {
      Check(rng, {m, 77, 1040, WeightScales::kBlock128, scheme, m % 2 == 1});
      Check(rng, {m, 8200, 272, WeightScales::kChannel, scheme, m % 2 == 0});
      Check(rng, {m, 130, 272, WeightScales::kTensor, scheme, true});
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// The streaming kernel's work splits: one 128-column group (a block's second warp idle), a
// cluster of 8 blocks per tile (few tiles, long k, a partial last group), and more tiles than
// one wave holds (each block walks several, its ring running across tile boundaries).
TEST(Fp8GemvCudaTest, StreamingSplitsMatchTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 1);
  for (int64_t m : {1, 5, 16}) {
    Check(rng, {m, 300, 96, WeightScales::kChannel, Scheme::kDynamicToken, true});
    Check(rng, {m, 70, 4112, WeightScales::kBlock128, Scheme::kDynamicGroup128, m == 5});
    Check(rng, {m, 70, 4112, WeightScales::kChannel, Scheme::kNone, false});
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int64_t m : {1, 16}) {
    Check(rng, {m, 24000, 272, WeightScales::kChannel, Scheme::kDynamicToken, true});
    Check(rng, {m, 24000, 272, WeightScales::kBlock128, Scheme::kStaticTensor, false});
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The pipelined kernel's edges (m <= 8, per-tensor / per-channel weights, static or per-token
// activations): a partial 16-row tile (n = 77, 8 + 1), fewer groups than warps (k = 96: one
// partial group), a partial last group after whole ones on 8 warps (k = 272, 1040) and on 4
// (n = 4240 > 4224 rows), more groups per warp than its loads in flight (k = 4112: 32 whole
// groups over 8 warps, then a partial one) and n past one wave of blocks.
TEST(Fp8GemvCudaTest, PipelinedEdgesMatchTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 2);
  for (int64_t m : {1, 2, 5, 8}) {
    Check(rng, {m, 77, 96, WeightScales::kChannel, Scheme::kDynamicToken, true});
    Check(rng, {m, 77, 1040, WeightScales::kTensor, Scheme::kStaticTensor, false});
    Check(rng, {m, 4240, 272, WeightScales::kChannel, Scheme::kDynamicToken, m == 5});
    Check(rng, {m, 33, 4112, WeightScales::kChannel, Scheme::kDynamicToken, false});
    if (::testing::Test::HasFatalFailure()) return;
  }
  Check(rng, {1, 9000, 4096, WeightScales::kChannel, Scheme::kDynamicToken, true});
}

TEST(Fp8GemvCudaTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint8_t> w(64 * 64), codes(17 * 64);
  DeviceBuffer<float> s(64), out(17 * 64);
  DeviceBuffer<bf16> x(17 * 64);
  Fp8SmallMActivations act;
  act.values = x.get();
  const Fp8DeviceWeight weight{w.get(), s.get(), {64, 64, 1, 64}};
  EXPECT_FALSE(Fp8SmallMLinear<float>(act, weight, nullptr, 17, out.get(), nullptr).ok());
  EXPECT_FALSE(Fp8SmallMLinear<float>(act, weight, nullptr, 0, out.get(), nullptr).ok());
  EXPECT_FALSE(Fp8SmallMLinear<float>(act, {w.get(), s.get(), {64, 60, 1, 60}}, nullptr, 1,
                                      out.get(), nullptr)
                   .ok());  // k % 16
  EXPECT_FALSE(Fp8SmallMLinear<float>(act, {w.get(), s.get(), {64, 64, 128, 128}}, nullptr, 1,
                                      out.get(), nullptr)
                   .ok());  // block rows
  EXPECT_FALSE(Fp8SmallMLinear<float>(act, {w.get(), s.get(), {64, 64, 1, 32}}, nullptr, 1,
                                      out.get(), nullptr)
                   .ok());             // 32-column blocks
  act.scheme = Scheme::kStaticTensor;  // fused static quantization without a scale
  EXPECT_FALSE(Fp8SmallMLinear<float>(act, weight, nullptr, 1, out.get(), nullptr).ok());
  act.codes = codes.get();  // codes without scales
  EXPECT_FALSE(Fp8SmallMLinear<float>(act, weight, nullptr, 1, out.get(), nullptr).ok());
  act.scales = s.get();
  EXPECT_TRUE(Fp8SmallMLinear<float>(act, weight, nullptr, 16, out.get(), nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace tandem::kernels::cuda
