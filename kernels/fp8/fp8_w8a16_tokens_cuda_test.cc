// The weight-only FP8 GEMV at 2-8 tokens (fp8_w8a16_tokens_cuda.cu): every token of the plain
// form against the CPU reference cpu::Fp8Linear (kNone) with the tensor-core form's tolerance
// (per-tensor, per-channel and grouped scales, bf16 and fp32 out, tiles fewer and more than the
// persistent grid, Llama-3-8B's down_proj at 8 tokens: the largest staging), the same bits with
// early loads on and off; the folds (NormIn, NormInSiluMul, AddTo) bit for bit against RmsNorm +
// the plain form (+ SiluAndMul, + the residual add); what does not fit refused (GPU; skips without
// one). The shared checks: fp8_w8a16_test_util.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_test_util.h"
#include "kernels/layers/cuda/layers_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;
using fp8_test::RandomBf16;
using fp8_w16_test::ExpectNearReference;
using fp8_w16_test::kEps;
using fp8_w16_test::SameBits;
using fp8_w16_test::Weight;

// The multi-token form is the deep kernel's tensor-core arithmetic: its tolerance.
constexpr Fp8W16Math kMath = Fp8W16Math::kTensorCoreDeep;

// Fp8W16Gemv<TOut> of x [m, k] into a NaN-filled [m, n] output (PDL launch), on the host.
template <typename TOut>
std::vector<TOut> RunTokens(const bf16* x, const Weight& w, const bf16* bias, int64_t m,
                            bool early) {
  DeviceBuffer<TOut> out(m * w.grid.rows);
  cudaMemset(out.get(), 0xFF, out.size() * sizeof(TOut));  // NaN: an unwritten element fails
  const absl::Status st =
      Fp8W16Gemv<TOut>(x, w.device(), bias, m, out.get(), nullptr, true, early, kMath);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.ToHost();
}

// Row i of a row-major [rows, cols] matrix.
template <typename T>
std::vector<T> RowOf(const std::vector<T>& v, int64_t i, int64_t cols) {
  return std::vector<T>(v.begin() + i * cols, v.begin() + (i + 1) * cols);
}

// Each token's output of the plain form against the reference, fp32 and bf16 out.
void CheckTokens(std::mt19937& rng, int64_t m, int64_t n, int64_t k, bool per_tensor,
                 bool with_bias, bool grouped) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k
                                    << (grouped      ? " grouped"
                                        : per_tensor ? " per-tensor"
                                                     : " per-channel")
                                    << (with_bias ? " bias" : ""));
  const Weight w(rng, n, k, per_tensor, /*tiled=*/n * k > (int64_t{1} << 26), grouped);
  const std::vector<bf16> x = RandomBf16(rng, m * k, 2.0f), bias = RandomBf16(rng, n, 1.0f);
  DeviceBuffer<bf16> dx(x), dbias(bias);
  ASSERT_TRUE(Fp8W16GemvSupported(dx.get(), w.device(), m));
  const bf16* b = with_bias ? dbias.get() : nullptr;
  const std::vector<float> f32 = RunTokens<float>(dx.get(), w, b, m, false);
  EXPECT_TRUE(SameBits(f32, RunTokens<float>(dx.get(), w, b, m, true)))
      << "early loads (or a second run) change bits";
  const std::vector<float> b16 = cuda_test::ToFloat(RunTokens<bf16>(dx.get(), w, b, m, true));
  const std::vector<float> xf = cuda_test::ToFloat(x);
  for (int64_t i = 0; i < m; ++i) {
    SCOPED_TRACE(::testing::Message() << "token " << i);
    ExpectNearReference(w.host(), RowOf(xf, i, k), with_bias ? bias.data() : nullptr,
                        RowOf(f32, i, n), false, kMath);
    ExpectNearReference(w.host(), RowOf(xf, i, k), with_bias ? bias.data() : nullptr,
                        RowOf(b16, i, n), true, kMath);
  }
}

TEST(Fp8W16TokensCudaTest, EveryTokenMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 41);
  for (const int64_t m : {2, 3, 5, 8}) {
    CheckTokens(rng, m, 77, 16, false, true, false);      // one chunk: most lanes past k
    CheckTokens(rng, m, 130, 272, true, false, false);    // 17 chunks, per-tensor
    CheckTokens(rng, m, 77, 1040, false, false, false);   // k % 128 = 16
    CheckTokens(rng, m, 9000, 4096, false, true, false);  // 563 tiles: CTAs walk several
    CheckTokens(rng, m, 129, 10944, false, true, true);   // grouped, a partial last group
    CheckTokens(rng, m, 300, 7168, false, false, true);   // grouped, DeepSeek-V3's hidden size
  }
  // Llama-3-8B's down_proj at 8 tokens (229,376 staged bytes: one CTA an SM) and 70B's at 4.
  CheckTokens(rng, 8, 4096, 14336, false, true, false);
  CheckTokens(rng, 4, 1000, 28672, false, false, false);
}

// The folds bit for bit against the unfolded kernels at m tokens (each token's RmsNorm is
// RmsNorm<bf16>'s row; the products the plain form's), and through them the reference.
void CheckTokenFolds(std::mt19937& rng, int64_t m, int64_t n, int64_t k, bool with_bias,
                     bool grouped) {
  SCOPED_TRACE(::testing::Message() << "folds m=" << m << " n=" << n << " k=" << k
                                    << (with_bias ? " bias" : "") << (grouped ? " grouped" : ""));
  const std::vector<bf16> x = RandomBf16(rng, m * k, 1.5f), norm_w = RandomBf16(rng, k, 1.0f);
  DeviceBuffer<bf16> dx(x), dnorm(norm_w), normed(m * k);
  ASSERT_TRUE(RmsNorm<bf16>(dx.get(), dnorm.get(), m, k, kEps, normed.get(), nullptr).ok());
  const std::vector<float> normed_f = cuda_test::ToFloat(normed.ToHost());

  const Weight w(rng, n, k, false, false, grouped);
  const std::vector<bf16> bias = RandomBf16(rng, 2 * n, 1.0f);
  DeviceBuffer<bf16> dbias(bias), folded(m * n);
  const bf16* b = with_bias ? dbias.get() : nullptr;
  ASSERT_TRUE(Fp8W16GemvNormIn(dx.get(), dnorm.get(), kEps, w.device(), b, m, folded.get(), nullptr,
                               true, true, kMath)
                  .ok());
  const std::vector<bf16> unfolded = RunTokens<bf16>(normed.get(), w, b, m, true);
  EXPECT_TRUE(SameBits(folded.ToHost(), unfolded)) << "NormIn != RmsNorm + Fp8W16Gemv";
  for (int64_t i = 0; i < m; ++i) {
    ExpectNearReference(w.host(), RowOf(normed_f, i, k), with_bias ? bias.data() : nullptr,
                        cuda_test::ToFloat(RowOf(unfolded, i, n)), true, kMath);
  }

  // SiLU-and-mul: gate rows 0..n-1, up rows n..2n-1 of one [2n, k] weight; the reference runs
  // the two halves as weights of n rows (each row in its fold's tile slot, as CheckFolds says).
  const Weight gu(rng, 2 * n, k, false, false, grouped);
  DeviceBuffer<bf16> act(m * n);
  ASSERT_TRUE(Fp8W16GemvNormInSiluMul(dx.get(), dnorm.get(), kEps, gu.device(), b, m, act.get(),
                                      nullptr, true, true, kMath)
                  .ok());
  const int64_t n8 = (n + 7) / 8 * 8, scales_per_row = gu.grid.GridCols();
  std::vector<bf16> padded(m * 2 * n8, __float2bfloat16_rn(0.0f));
  for (int half = 0; half < 2; ++half) {
    const Fp8DeviceWeight rows{gu.d_codes.get() + half * n * k,
                               gu.d_scales.get() + half * n * scales_per_row,
                               {n, k, 1, gu.grid.block_cols}};
    DeviceBuffer<bf16> part(m * n);
    ASSERT_TRUE(Fp8W16Gemv<bf16>(normed.get(), rows, b == nullptr ? nullptr : b + half * n, m,
                                 part.get(), nullptr, true, true, kMath)
                    .ok());
    const std::vector<bf16> host = part.ToHost();
    for (int64_t i = 0; i < m; ++i) {
      std::copy(host.begin() + i * n, host.begin() + (i + 1) * n,
                padded.begin() + i * 2 * n8 + half * n8);
    }
  }
  DeviceBuffer<bf16> d_padded(padded), act_ref(m * n8);
  ASSERT_TRUE(SiluAndMul<bf16>(d_padded.get(), m, n8, act_ref.get(), nullptr).ok());
  const std::vector<bf16> want_act = act_ref.ToHost(), got_act = act.ToHost();
  for (int64_t i = 0; i < m; ++i) {
    EXPECT_TRUE(SameBits(RowOf(got_act, i, n), std::vector<bf16>(want_act.begin() + i * n8,
                                                                 want_act.begin() + i * n8 + n)))
        << "NormInSiluMul != RmsNorm + Fp8W16Gemv + SiluAndMul, token " << i;
  }

  // AddTo: residual = round(residual + round(product)), every token.
  const std::vector<bf16> res0 = RandomBf16(rng, m * n, 3.0f);
  DeviceBuffer<bf16> residual(res0);
  ASSERT_TRUE(
      Fp8W16GemvAddTo(normed.get(), w.device(), b, m, residual.get(), nullptr, true, true, kMath)
          .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<bf16> got = residual.ToHost();
  for (int64_t j = 0; j < m * n; ++j) {
    const bf16 want =
        __float2bfloat16_rn(__bfloat162float(res0[j]) + __bfloat162float(unfolded[j]));
    ASSERT_EQ(std::memcmp(&got[j], &want, sizeof(bf16)), 0) << "AddTo element " << j;
  }
}

TEST(Fp8W16TokensCudaTest, FoldsEqualTheUnfoldedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 43);
  for (const auto& [m, n, k, grouped] :
       {std::tuple{2, 77, 272, false}, std::tuple{4, 4096, 4096, false},
        std::tuple{8, 1000, 4096, false}, std::tuple{7, 130, 8192, false},
        std::tuple{3, 200, 7168, true}, std::tuple{8, 129, 1040, true}}) {
    CheckTokenFolds(rng, m, n, k, /*with_bias=*/n % 2 == 0, grouped);
  }
}

// Past kFp8W16TokensMaxM tokens, or staging past one CTA's shared memory: not supported, and the
// launch refused with INVALID_ARGUMENT (nothing written).
TEST(Fp8W16TokensCudaTest, RefusesWhatDoesNotFit) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 47);
  for (const auto& [m, k, supported] :
       {std::tuple{9, 4096, false}, std::tuple{8, 28672, false}, std::tuple{5, 28672, false},
        std::tuple{4, 28672, true}, std::tuple{8, 14336, true}, std::tuple{0, 4096, false}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << m << " k=" << k);
    const Weight w(rng, 32, k, false);
    DeviceBuffer<bf16> dx(RandomBf16(rng, std::max(m, 1) * k, 1.0f));
    EXPECT_EQ(Fp8W16GemvSupported(dx.get(), w.device(), m), supported);
    DeviceBuffer<float> out(std::max(m, 1) * 32);
    const absl::Status st = Fp8W16Gemv<float>(dx.get(), w.device(), nullptr, m, out.get(), nullptr,
                                              false, false, kMath);
    EXPECT_EQ(st.ok(), supported) << st;
    if (!supported) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    }
  }
  // The norm folded in needs one more row (the norm weight): 8 tokens of k = 12,288 fit without
  // it (196,608 + 2 KiB) and with it (221,184 + 4 KiB + the norm's sums); 8 x 13,312 only without.
  const std::vector<bf16> norm_w = RandomBf16(rng, 13312, 1.0f);
  DeviceBuffer<bf16> dnorm(norm_w), dx(RandomBf16(rng, 8 * 13312, 1.0f));
  const Weight w12(rng, 32, 12288, false), w13(rng, 32, 13312, false);
  EXPECT_TRUE(Fp8W16GemvNormInSupported(dx.get(), dnorm.get(), w12.device(), 8));
  EXPECT_TRUE(Fp8W16GemvSupported(dx.get(), w13.device(), 8));
  EXPECT_FALSE(Fp8W16GemvNormInSupported(dx.get(), dnorm.get(), w13.device(), 8));
}

}  // namespace
}  // namespace tandem::kernels::cuda
