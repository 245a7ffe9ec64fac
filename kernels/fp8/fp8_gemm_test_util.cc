#include "kernels/fp8/fp8_gemm_test_util.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_gemm_kernels.h"
#include "kernels/fp8/fp8_linear.h"

namespace tandem::kernels::cuda::fp8_gemm_test {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;

std::vector<bf16> RandomBf16(std::mt19937& rng, int64_t count, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<bf16> v(count);
  for (bf16& x : v) x = __float2bfloat16_rn(dist(rng));
  return v;
}

std::vector<uint8_t> RandomCodes(std::mt19937& rng, int64_t count) {
  std::vector<uint8_t> codes(count);
  for (uint8_t& c : codes) {
    do {
      c = static_cast<uint8_t>(rng() & 0xFF);
    } while ((c & 0x7F) == 0x7F);
  }
  return codes;
}

ErrorModel ModelFor(const float* a, const float* w, int64_t k) {
  ErrorModel e;
  double partial = 0;
  for (int64_t c0 = 0; c0 < k; c0 += kMmaK) {
    if (c0 % kPromoteK == 0) partial = 0;
    double largest = std::fabs(partial);
    for (int64_t c = c0; c < std::min(k, c0 + kMmaK); ++c) {
      const double p = double(a[c]) * w[c];
      e.mag += std::fabs(p);
      largest = std::max(largest, std::fabs(p));
      partial += p;
    }
    e.mma_mag += largest;
  }
  return e;
}

const char* Name(Scaling s) {
  return s == Scaling::kTensor ? "per-tensor" : s == Scaling::kBlock ? "block" : "token x channel";
}

double CheckGemm(std::mt19937& rng, CublasLtFp8Gemm& gemm, Scaling scaling, int64_t m, int64_t n,
                 int64_t k, bool with_bias, const Fp8BlockWgmmaForm* wgmma_form) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << m << " n=" << n << " k=" << k << " " << Name(scaling)
               << (with_bias ? " bias" : "")
               << (gemm.outer_vector_scales() ? " outer-vector" : " epilogue"));
  const Fp8ScaleGrid grid = scaling == Scaling::kTensor  ? Fp8ScaleGrid{n, k, n, k}
                            : scaling == Scaling::kBlock ? Fp8ScaleGrid{n, k, 128, 128}
                                                         : Fp8ScaleGrid{n, k, 1, k};
  const auto scheme = scaling == Scaling::kTensor  ? Fp8ActivationScheme::kStaticTensor
                      : scaling == Scaling::kBlock ? Fp8ActivationScheme::kDynamicGroup128
                                                   : Fp8ActivationScheme::kDynamicToken;
  const std::vector<uint8_t> w_codes = RandomCodes(rng, n * k);
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> w_scales(grid.NumScales());
  for (float& s : w_scales) s = std::exp2(log_scale(rng));
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
  const Fp8WeightView view{w_codes.data(), w_scales.data(), grid, scheme, 0.05f};
  std::vector<float> want(m * n), w_deq(n * k), a_deq(m * k);
  EXPECT_TRUE(
      cpu::Fp8Linear(xf.data(), view, with_bias ? bias_f.data() : nullptr, m, want.data(), nullptr)
          .ok());
  cpu::DequantizeFp8Weight(view, 0, n, w_deq.data());
  {  // The activations the product sees (the GPU's codes equal these: fp8_cuda_test).
    std::vector<uint8_t> codes(m * k);
    std::vector<float> scales(NumActivationScales(scheme, m, k));
    QuantizeActivations(xf.data(), m, k, scheme, 0.05f, codes.data(), scales.data());
    const Fp8WeightView as_weight{
        codes.data(), scales.data(),
        scheme == Fp8ActivationScheme::kStaticTensor   ? Fp8ScaleGrid{m, k, m, k}
        : scheme == Fp8ActivationScheme::kDynamicToken ? Fp8ScaleGrid{m, k, 1, k}
                                                       : Fp8ScaleGrid{m, k, 1, 128},
        Fp8ActivationScheme::kNone, 0.0f};
    cpu::DequantizeFp8Weight(as_weight, 0, m, a_deq.data());
  }
  // Device inputs: the weight scales in the layout each path reads.
  std::vector<float> dev_w_scales = w_scales;
  if (scaling == Scaling::kTensor) dev_w_scales.resize(1);
  if (scaling == Scaling::kBlock) {
    std::vector<float> rows(n * Block128Groups(k));  // the loader's per-row form
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(w_scales.begin() + r / 128 * Block128Groups(k), Block128Groups(k),
                  rows.begin() + r * Block128Groups(k));
    }
    absl::StatusOr<std::vector<float>> blocks =
        Block128WeightScales(rows.data(), Fp8ScaleGrid{n, k, 1, 128});
    EXPECT_TRUE(blocks.ok()) << blocks.status();
    if (!blocks.ok()) return 0;
    dev_w_scales = *std::move(blocks);
  }
  DeviceBuffer<bf16> dx(x), dbias(bias), out(m * n);
  DeviceBuffer<uint8_t> dw(w_codes), a_codes(m * k);
  DeviceBuffer<float> dws(dev_w_scales), a_scales(std::max<int64_t>(1, m * Block128Groups(k))),
      a_scales_t(m * Block128Groups(k));
  EXPECT_TRUE(
      QuantizeActivations(dx.get(), m, k, scheme, 0.05f, a_codes.get(), a_scales.get(), nullptr)
          .ok());
  const float* gemm_a_scales = a_scales.get();
  if (scaling == Scaling::kBlock) {
    EXPECT_TRUE(
        TransposeGroupScales(a_scales.get(), m, Block128Groups(k), a_scales_t.get(), nullptr).ok());
    gemm_a_scales = a_scales_t.get();
  }
  const Fp8GemmScaling gemm_scaling = scaling == Scaling::kTensor  ? Fp8GemmScaling::kTensor
                                      : scaling == Scaling::kBlock ? Fp8GemmScaling::kBlock128
                                                                   : Fp8GemmScaling::kTokenChannel;
  const absl::Status st =
      wgmma_form != nullptr
          ? Fp8BlockGemmWgmma(a_codes.get(), gemm_a_scales, dw.get(), dws.get(), m, n, k, out.get(),
                              with_bias ? dbias.get() : nullptr, nullptr, *wgmma_form)
          : gemm.Linear(a_codes.get(), gemm_a_scales, dw.get(), dws.get(), gemm_scaling, m, n, k,
                        out.get(), nullptr, with_bias ? dbias.get() : nullptr);
  EXPECT_TRUE(st.ok()) << st;
  if (!st.ok() || cudaDeviceSynchronize() != cudaSuccess) return 0;
  const std::vector<float> got = cuda_test::ToFloat(out.ToHost());
  double worst = 0;
  int64_t reported = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const ErrorModel e = ModelFor(&a_deq[r * k], &w_deq[j * k], k);
      const double err = std::fabs(double(got[r * n + j]) - want[r * n + j]);
      const double tol = 4e-6 * std::sqrt(double(k)) * e.mag + kMmaRel * e.mma_mag +
                         kRoundRel * std::fabs(want[r * n + j]) + 1e-30;
      worst = std::max(
          worst, (err - kRoundRel * std::fabs(want[r * n + j])) / (0x1p-13 * e.mma_mag + 1e-30));
      if (err > tol && reported++ < 5) {
        ADD_FAILURE() << "row " << r << " col " << j << ": got " << got[r * n + j] << " want "
                      << want[r * n + j] << " (tol " << tol << ", sum|p| " << e.mag
                      << ", sum of per-MMA largest " << e.mma_mag << ")";
      }
    }
  }
  return worst;
}

}  // namespace tandem::kernels::cuda::fp8_gemm_test
