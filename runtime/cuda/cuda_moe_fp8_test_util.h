// Helpers of cuda_moe_fp8_test.cc (CudaFp8MoeExperts against the CPU): random stacked FP8 expert
// weights as the loader holds them, the CPU reference per expert (cpu::Fp8Linear) and SiLU * up as
// the kernels round, the stage tolerances and the comparison that prints and checks them.
#ifndef TANDEM_RUNTIME_CUDA_CUDA_MOE_FP8_TEST_UTIL_H_
#define TANDEM_RUNTIME_CUDA_CUDA_MOE_FP8_TEST_UTIL_H_

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_linear.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda::moe_fp8_test {

using bf16 = __nv_bfloat16;
using Scheme = kernels::Fp8ActivationScheme;

// A stacked host FP8 weight [rows, cols] as the loader holds it: quantized in 128 x 128 blocks
// (DeepSeek; each block's scale written on its rows' 128-column groups) or per row.
// A static scheme's input scale: kStaticInput for the experts' inputs (x ~ N(0, 1), bf16),
// kStaticAct for their act rows; a value past 448 x it saturates (the CPU's and GPU's alike).
constexpr float kStaticInput = 5.0f / 448, kStaticAct = 16.0f / 448;

inline Fp8LinearWeight RandomFp8(int64_t rows, int64_t cols, bool blocks, Scheme scheme,
                                 std::mt19937& rng, float input_scale = 0.0f) {
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(rows * cols);
  for (float& x : w) x = d(rng);
  Fp8LinearWeight f;
  f.grid = {rows, cols, 1, blocks ? 128 : cols};
  f.codes.resize(rows * cols);
  f.scales.resize(f.grid.NumScales());
  const kernels::Fp8ScaleGrid q = blocks ? kernels::Fp8ScaleGrid{rows, cols, 128, 128} : f.grid;
  std::vector<float> block_scales(q.NumScales());
  kernels::QuantizeWeight(w.data(), q, f.codes.data(), block_scales.data());
  const int64_t gc = f.grid.GridCols();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < gc; ++g) f.scales[r * gc + g] = block_scales[r / q.block_rows * gc + g];
  }
  f.activation = scheme;
  if (scheme == Scheme::kStaticTensor) f.input_scale = input_scale;
  return f;
}

inline const char* SchemeName(Scheme scheme) {
  switch (scheme) {
    case Scheme::kDynamicGroup128:
      return "128 x 128 blocks, 1 x 128 activations";
    case Scheme::kDynamicToken:
      return "per-channel, per-token";
    case Scheme::kStaticTensor:
      return "per-channel, static per-tensor activations";
    default:
      return "weight-only";
  }
}

inline std::vector<float> Bf16Rows(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = kernels::cuda_test::ToF(kernels::cuda_test::FromF<bf16>(d(rng)));
  return v;
}

inline float MaxAbs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

inline float Bf16(float x) { return kernels::cuda_test::ToF(kernels::cuda_test::FromF<bf16>(x)); }

// Tolerances of a stage against the CPU fed the GPU's own input (fractions of |want| and of the
// tensor's max |want|):
// one bf16 rounding of the GPU's output (at most 2^-9 of it), with a factor 2 of margin;
constexpr float kRound = 0x1p-8f;
// SiLU(g) * u on the same bf16 g, u: expf against std::exp can move the result by one bf16 step;
constexpr float kOneStep = 0x1p-7f;
// act from fp32 gate / up sums of another order (GPU vs CPU, or GEMM vs GEMV): their bf16
// roundings can differ by a step, and SiLU(g) * u moves by up to ~|g| steps (moe_fp8_cuda_test's);
constexpr float kActRel = 1.6e-2f;
// accumulation: Hopper's FP8 MMA adds 32 products aligned to the largest with 13 fraction bits
// (fp8_gemm_cuda.h), at k = 512 at most 16 x 2^-11 of per-instruction magnitudes that stay far
// below the output's max for these Gaussian inputs; fp32 order noise on the CPU side.
constexpr float kAccum = 2e-3f;

// |got - want| <= rel * |want| + of_max * max |want| everywhere; prints the largest deviation (as
// a fraction of max |want| and of the tolerance) and how many elements exceed it. `check`: fail
// on an excess (else the line is a diagnostic only).
inline void Compare(const std::vector<float>& got, const std::vector<float>& want, float rel,
                    float of_max, const std::string& what, bool check = true) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const float max_abs = MaxAbs(want);
  ASSERT_GT(max_abs, 0.0f) << what;
  double worst_dev = 0, worst_ratio = 0;
  size_t at = 0;
  int64_t over = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double dev = std::abs(double(got[i]) - want[i]);
    const double ratio = dev / (rel * std::abs(want[i]) + of_max * max_abs);
    worst_dev = std::max(worst_dev, dev);
    if (ratio > worst_ratio) worst_ratio = ratio, at = i;
    over += ratio > 1.0 ? 1 : 0;
  }
  std::printf("  %-44s max|dev| %.3g = %.2e of max %.3g; worst dev/tol %.3f; %lld of %zu over%s\n",
              what.c_str(), worst_dev, worst_dev / max_abs, max_abs, worst_ratio,
              static_cast<long long>(over), want.size(), check ? "" : " (diagnostic)");
  if (check) {
    EXPECT_EQ(over, 0) << what << ": worst element " << at << " got " << got[at] << " want "
                       << want[at] << " (tolerance " << rel << " |want| + " << of_max << " max)";
  }
}

// The permuted rows [o[e], o[e + 1]) of in [rows, k] through expert e's n rows of the stacked
// weight `all`: cpu::Fp8Linear (the activations quantized as the weight's scheme says), [rows, n].
inline std::vector<float> PerExpert(const std::vector<float>& in, int64_t k,
                                    const Fp8LinearWeight& all, int64_t n,
                                    const std::vector<int32_t>& o) {
  std::vector<float> out(static_cast<size_t>(o.back()) * n);
  for (size_t e = 0; e + 1 < o.size(); ++e) {
    if (o[e + 1] == o[e]) continue;
    const Fp8LinearWeight w = Fp8Rows(all, static_cast<int64_t>(e) * n, n);
    EXPECT_TRUE(kernels::cpu::Fp8Linear(in.data() + o[e] * k, w.View(), nullptr, o[e + 1] - o[e],
                                        out.data() + o[e] * n, nullptr)
                    .ok());
  }
  return out;
}

// SiLU(gate) * up of gu [rows, 2 * I] (per row gate, then up) as the kernels round: gate and up to
// bf16 first (a no-op on the GEMM's bf16 output; the GEMV rounds its fp32 sums), the result too.
inline std::vector<float> SiluMul(const std::vector<float>& gu, int64_t rows, int64_t I) {
  std::vector<float> a(rows * I);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < I; ++j) {
      const float g = Bf16(gu[r * 2 * I + j]), u = Bf16(gu[r * 2 * I + I + j]);
      a[r * I + j] = Bf16(g / (1.0f + std::exp(-g)) * u);
    }
  }
  return a;
}

inline std::vector<float> Minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// How the two paths' act rows differ: elements, and activation scales (per row or 1 x 128 group)
// that the down projection's quantization gives them (kernels::QuantizeActivations, the GPU's
// rule).
inline void PrintActDifference(const std::vector<float>& a, const std::vector<float>& b,
                               int64_t rows, int64_t I, Scheme scheme) {
  const int64_t n_scales = kernels::NumActivationScales(scheme, rows, I);
  std::vector<uint8_t> ca(rows * I), cb(rows * I);
  std::vector<float> sa(n_scales), sb(n_scales);
  kernels::QuantizeActivations(a.data(), rows, I, scheme, 0.0f, ca.data(), sa.data());
  kernels::QuantizeActivations(b.data(), rows, I, scheme, 0.0f, cb.data(), sb.data());
  int64_t values = 0, scales = 0, codes = 0;
  for (size_t i = 0; i < a.size(); ++i) values += a[i] != b[i] ? 1 : 0;
  for (int64_t i = 0; i < n_scales; ++i) scales += sa[i] != sb[i] ? 1 : 0;
  for (size_t i = 0; i < ca.size(); ++i) codes += ca[i] != cb[i] ? 1 : 0;
  std::printf(
      "  act GEMM vs GEMV: %lld of %zu bf16 values differ; down's activation scales: "
      "%lld of %lld differ; e4m3 codes: %lld differ\n",
      static_cast<long long>(values), a.size(), static_cast<long long>(scales),
      static_cast<long long>(n_scales), static_cast<long long>(codes));
}

}  // namespace tandem::runtime::cuda::moe_fp8_test

#endif  // TANDEM_RUNTIME_CUDA_CUDA_MOE_FP8_TEST_UTIL_H_
