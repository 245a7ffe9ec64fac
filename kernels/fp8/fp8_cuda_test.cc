// QuantizeActivations and Fp8Gemv (fp8_cuda.h) against the CPU reference (fp8.h,
// cpu::Fp8Linear) on fresh random inputs with random scales: per-tensor / per-channel (per-row
// scales over the whole row) and 128-column per-row blocks, the four activation schemes, m = 1..16,
// bias on and off (GPU; skips without one).
#include "kernels/fp8/fp8_cuda.h"

#include <cmath>
#include <memory>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_gemm_cuda.h"
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
  for (int64_t k : {16, 300, 4096}) {
    for (auto scheme : {Fp8ActivationScheme::kStaticTensor, Fp8ActivationScheme::kDynamicToken,
                        Fp8ActivationScheme::kDynamicGroup128}) {
      const int64_t m = 5;
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
    }
  }
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

// One cuBLASLt FP8 GEMM call against cpu::Fp8Linear on a random weight with random scales:
// per-tensor weights with a static activation scale (kTensor) or per-channel weights with
// dynamic per-token activations (kTokenChannel), bias on or off.
void CheckGemm(std::mt19937& rng, CublasLtFp8Gemm& gemm, Fp8GemmScaling scaling, int64_t m,
               int64_t n, int64_t k, bool with_bias) {
  const bool tensor = scaling == Fp8GemmScaling::kTensor;
  SCOPED_TRACE(::testing::Message()
               << "m=" << m << " n=" << n << " k=" << k << " "
               << (tensor ? "per-tensor" : "token x channel") << (with_bias ? " bias" : "")
               << (gemm.outer_vector_scales() ? " outer-vector" : " epilogue"));
  const Fp8ScaleGrid grid{n, k, tensor ? n : 1, k};
  std::vector<uint8_t> w_codes(n * k);
  for (uint8_t& c : w_codes) {
    do {
      c = static_cast<uint8_t>(rng() & 0xFF);
    } while ((c & 0x7F) == 0x7F);
  }
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> w_scales(grid.NumScales());
  for (float& s : w_scales) s = std::exp2(log_scale(rng));
  const auto scheme =
      tensor ? Fp8ActivationScheme::kStaticTensor : Fp8ActivationScheme::kDynamicToken;
  // Rows of different magnitudes: the per-token scales differ (and one zero row: scale 1).
  std::vector<bf16> x = RandomBf16(rng, m * k, 2.0f);
  std::uniform_real_distribution<float> row_gain(0.01f, 8.0f);
  for (int64_t r = 0; r < m; ++r) {
    const float g = r == m / 2 ? 0.0f : row_gain(rng);
    for (int64_t c = 0; c < k; ++c) {
      x[r * k + c] = __float2bfloat16_rn(__bfloat162float(x[r * k + c]) * g);
    }
  }
  const std::vector<float> xf = cuda_test::ToFloat(x);
  const std::vector<bf16> bias = RandomBf16(rng, n, 1.0f);
  const std::vector<float> bias_f = cuda_test::ToFloat(bias);
  Fp8WeightView view{w_codes.data(), w_scales.data(), grid, scheme, 0.05f};
  std::vector<float> want(m * n), w_deq(n * k);
  ASSERT_TRUE(
      cpu::Fp8Linear(xf.data(), view, with_bias ? bias_f.data() : nullptr, m, want.data(), nullptr)
          .ok());
  cpu::DequantizeFp8Weight(view, 0, n, w_deq.data());
  DeviceBuffer<bf16> dx(x), dbias(bias);
  DeviceBuffer<uint8_t> dw(w_codes), a_codes(m * k);
  DeviceBuffer<float> dws(w_scales), a_scales(tensor ? 1 : m);
  ASSERT_TRUE(
      QuantizeActivations(dx.get(), m, k, scheme, 0.05f, a_codes.get(), a_scales.get(), nullptr)
          .ok());
  DeviceBuffer<bf16> out(m * n);
  const absl::Status st =
      gemm.Linear(a_codes.get(), a_scales.get(), dw.get(), dws.get(), scaling, m, n, k, out.get(),
                  nullptr, with_bias ? dbias.get() : nullptr);
  ASSERT_TRUE(st.ok()) << st;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = cuda_test::ToFloat(out.ToHost());
  // The epilogue path rounds once to bf16; the cuBLASLt-scaled paths round again with a bias.
  const double rounding = tensor || gemm.outer_vector_scales() ? 0x1p-7 : 0x1p-8;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double mag = with_bias ? std::fabs(bias_f[j]) : 0.0;
      for (int64_t c = 0; c < k; ++c) mag += std::fabs(xf[r * k + c] * w_deq[j * k + c]) * 1.07;
      // Hopper's FP8 tensor cores accumulate with about 14 mantissa bits inside a wgmma chain
      // (DeepSeek-V3 report, 3.3.2; cuBLASLt promotes to fp32 between chains even without
      // FAST_ACCUM): about 2^-13 of the terms' magnitude, beyond the fp32 summation term.
      const double tol =
          (4e-6 * std::sqrt(double(k)) + 0x1p-13) * mag + rounding * std::fabs(want[r * n + j]);
      ASSERT_NEAR(got[r * n + j], want[r * n + j], tol + 1e-30) << "row " << r << " col " << j;
    }
  }
}

constexpr std::tuple<int64_t, int64_t, int64_t> kGemmShapes[] = {
    {64, 256, 512}, {200, 384, 4096}, {17, 96, 1024}, {333, 80, 272}};

// Per-tensor scales through cuBLASLt's scale pointers.
TEST(Fp8CudaTest, CublasLtGemmPerTensorMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  auto gemm = CublasLtFp8Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (auto [m, n, k] : kGemmShapes) {
    CheckGemm(rng, **gemm, Fp8GemmScaling::kTensor, m, n, k, m % 2 == 1);
  }
  EXPECT_EQ((*gemm)
                ->Linear(nullptr, nullptr, nullptr, nullptr, Fp8GemmScaling::kBlock128, 1, 1, 16,
                         nullptr, nullptr)
                .code(),
            absl::StatusCode::kUnimplemented);
}

// Per-token x per-channel on the epilogue path (unit-scaled fp32 product + ScaleFp8Accumulator),
// what sm_90 runs: forced with try_outer_vector = false, once with the default accumulator and
// once with one of 64 rows of n = 384 (and fewer than 128 rows of the others), so m is cut into
// several cuBLASLt calls, the last one partial.
TEST(Fp8CudaTest, CublasLtGemmTokenChannelEpilogueMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (int64_t acc_bytes : {CublasLtFp8Gemm::kDefaultAccumulatorBytes, int64_t{64 * 384 * 4}}) {
    auto gemm = CublasLtFp8Gemm::Create(CublasLtFp8Gemm::kDefaultWorkspaceBytes, acc_bytes,
                                        /*try_outer_vector=*/false);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    ASSERT_FALSE((*gemm)->outer_vector_scales());
    SCOPED_TRACE(::testing::Message() << "accumulator " << acc_bytes << " bytes, "
                                      << (*gemm)->EpilogueChunkRows(384) << " rows of n=384");
    for (auto [m, n, k] : kGemmShapes) {
      CheckGemm(rng, **gemm, Fp8GemmScaling::kTokenChannel, m, n, k, m % 2 == 0);
      CheckGemm(rng, **gemm, Fp8GemmScaling::kTokenChannel, m, n, k, m % 2 == 1);
    }
  }
  auto tiny = CublasLtFp8Gemm::Create(CublasLtFp8Gemm::kDefaultWorkspaceBytes, 16, false);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ((*tiny)->EpilogueChunkRows(384), 0);
  DeviceBuffer<uint8_t> codes(64 * 64);
  DeviceBuffer<float> scales(64);
  DeviceBuffer<bf16> out(64 * 64);
  EXPECT_EQ((*tiny)
                ->Linear(codes.get(), scales.get(), codes.get(), scales.get(),
                         Fp8GemmScaling::kTokenChannel, 64, 64, 64, out.get(), nullptr)
                .code(),
            absl::StatusCode::kResourceExhausted);  // no accumulator row fits
}

// cuBLASLt's outer-vector FP8 scale mode, only where Create found it (not on sm_90: CUDA 13's
// cuBLASLt has no kernel there); elsewhere this test says so and checks nothing else.
TEST(Fp8CudaTest, CublasLtGemmOuterVectorMatchesTheCpuReferenceWhereItExists) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto gemm = CublasLtFp8Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  if (!(*gemm)->outer_vector_scales()) {
    GTEST_SKIP() << "cuBLASLt has no outer-vector FP8 matmul on this GPU (sm_90 has none); "
                    "per-token x per-channel runs the epilogue path tested above";
  }
  std::mt19937 rng(cuda_test::TestSeed());
  for (auto [m, n, k] : kGemmShapes) {
    CheckGemm(rng, **gemm, Fp8GemmScaling::kTokenChannel, m, n, k, m % 2 == 1);
  }
}

// The epilogue kernel alone, both its vector (n % 4 == 0) and scalar forms, against fp64.
TEST(Fp8CudaTest, ScaleFp8AccumulatorMatchesFp64) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  std::normal_distribution<float> dist(0.0f, 100.0f);
  std::uniform_real_distribution<float> log_scale(-10.0f, 0.0f);
  for (auto [m, n] : {std::pair<int64_t, int64_t>{37, 4096}, {5, 131}, {3, 6}}) {
    for (bool with_bias : {false, true}) {
      std::vector<float> acc(m * n), as(m), ws(n);
      for (float& v : acc) v = dist(rng);
      for (float& v : as) v = std::exp2(log_scale(rng));
      for (float& v : ws) v = std::exp2(log_scale(rng));
      const std::vector<bf16> bias = RandomBf16(rng, n, 1.0f);
      DeviceBuffer<float> dacc(acc), das(as), dws(ws);
      DeviceBuffer<bf16> dbias(bias), out(m * n);
      ASSERT_TRUE(ScaleFp8Accumulator(dacc.get(), das.get(), dws.get(),
                                      with_bias ? dbias.get() : nullptr, m, n, out.get(), nullptr)
                      .ok());
      TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = cuda_test::ToFloat(out.ToHost());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const double product = double(acc[i * n + j]) * as[i] * ws[j];
          const double b = with_bias ? __bfloat162float(bias[j]) : 0.0;
          const double want = product + b;
          // One bf16 rounding of the fp32 result, plus fp32's own rounding of its terms.
          const double tol = 0x1p-8 * std::fabs(want) + 1e-6 * (std::fabs(product) + std::fabs(b));
          ASSERT_NEAR(got[i * n + j], want, tol + 1e-30)
              << "m=" << m << " n=" << n << " (" << i << ", " << j << ")";
        }
      }
    }
  }
  DeviceBuffer<float> f(4);
  DeviceBuffer<bf16> o(4);
  EXPECT_FALSE(
      ScaleFp8Accumulator(nullptr, f.get(), f.get(), nullptr, 1, 4, o.get(), nullptr).ok());
  EXPECT_FALSE(
      ScaleFp8Accumulator(f.get(), f.get(), f.get(), nullptr, 1, 0, o.get(), nullptr).ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
