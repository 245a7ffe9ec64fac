// The W8A16 GEMV tests' shared setup and CPU-reference checks (fp8_w8a16_test_util.h).
#include "kernels/fp8/fp8_w8a16_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/layers/cuda/layers_cuda.h"

namespace tandem::kernels::cuda::fp8_w16_test {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;
using fp8_test::RandomBf16;
using fp8_test::RandomE4m3Codes;

// The inner loops that multiply f16 activations: all but kFp32Fma.
bool F16Activations(Fp8W16Math math) { return math != Fp8W16Math::kFp32Fma; }

}  // namespace

std::vector<float> RandomScales(std::mt19937& rng, int64_t n, bool per_tensor) {
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> scales(n);
  for (float& s : scales) s = std::exp2(log_scale(rng));
  if (per_tensor) std::fill(scales.begin(), scales.end(), scales[0]);
  return scales;
}

std::vector<uint8_t> TiledE4m3Codes(std::mt19937& rng, int64_t count) {
  const std::vector<uint8_t> block = RandomE4m3Codes(rng, (int64_t{1} << 20) - 3);
  const int64_t size = static_cast<int64_t>(block.size());
  std::vector<uint8_t> codes(count);
  for (int64_t i = 0; i < count; i += size) {
    std::memcpy(codes.data() + i, block.data(), std::min(size, count - i));
  }
  return codes;
}

Weight::Weight(std::mt19937& rng, int64_t n, int64_t k, bool per_tensor, bool tiled, bool grouped)
    : grid{n, k, 1, grouped ? kFp8W16ScaleGroupCols : k},
      codes(tiled ? TiledE4m3Codes(rng, n * k) : RandomE4m3Codes(rng, n * k)),
      scales(RandomScales(rng, grid.NumScales(), per_tensor)),
      d_codes(codes),
      d_scales(scales) {}

void ExpectNearReference(const HostWeight& w, const std::vector<float>& x, const bf16* bias,
                         const std::vector<float>& got, bool bf16_out, Fp8W16Math math) {
  const int64_t n = w.grid.rows, k = w.grid.cols;
  const Fp8WeightView view{w.codes, w.scales, w.grid, Fp8ActivationScheme::kNone, 0.0f};
  std::vector<float> bias_f(n, 0.0f), want(n), w_deq(n * k);
  if (bias != nullptr) {
    for (int64_t j = 0; j < n; ++j) bias_f[j] = __bfloat162float(bias[j]);
  }
  ASSERT_TRUE(cpu::Fp8Linear(x.data(), view, bias != nullptr ? bias_f.data() : nullptr, 1,
                             want.data(), nullptr)
                  .ok());
  cpu::DequantizeFp8Weight(view, 0, n, w_deq.data());
  for (int64_t j = 0; j < n; ++j) {
    double mag = std::fabs(bias_f[j]), wsum = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      mag += std::fabs(x[i] * w_deq[j * k + i]);
      wsum += std::fabs(w_deq[j * k + i]);
    }
    const double tol = 4e-6 * std::sqrt(double(k)) * mag +
                       (bf16_out ? 0x1p-8 * std::fabs(want[j]) : 0.0) +
                       (F16Activations(math) ? 0x1p-25 * wsum : 0.0) + 1e-30;
    ASSERT_NEAR(got[j], want[j], tol) << "col " << j;
  }
}

template <typename TOut>
std::vector<TOut> RunPlain(const bf16* x, const Weight& w, const bf16* bias, bool early,
                           Fp8W16Math math, const Fp8W16SplitKWorkspace* ws) {
  DeviceBuffer<TOut> out(w.grid.rows);
  cudaMemset(out.get(), 0xFF, out.size() * sizeof(TOut));  // NaN: an unwritten element fails
  const absl::Status st = Fp8W16Gemv<TOut>(x, w.device(), bias, 1, out.get(), nullptr,
                                           /*programmatic_launch=*/true, early, math, ws);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.ToHost();
}

template std::vector<float> RunPlain<float>(const bf16*, const Weight&, const bf16*, bool,
                                            Fp8W16Math, const Fp8W16SplitKWorkspace*);
template std::vector<bf16> RunPlain<bf16>(const bf16*, const Weight&, const bf16*, bool, Fp8W16Math,
                                          const Fp8W16SplitKWorkspace*);

void CheckPlain(std::mt19937& rng, int64_t n, int64_t k, bool per_tensor, bool with_bias,
                Fp8W16Math math, bool grouped, const Fp8W16SplitKWorkspace* ws) {
  SCOPED_TRACE(::testing::Message()
               << "plain math=" << static_cast<int>(math) << " n=" << n << " k=" << k
               << (grouped      ? " grouped"
                   : per_tensor ? " per-tensor"
                                : " per-channel")
               << (with_bias ? " bias" : ""));
  const Weight w(rng, n, k, per_tensor, false, grouped);
  ASSERT_EQ(Fp8W16GroupedScales(w.grid), grouped && k > kFp8W16ScaleGroupCols);
  const std::vector<bf16> x = RandomBf16(rng, k, 2.0f), bias = RandomBf16(rng, n, 1.0f);
  DeviceBuffer<bf16> dx(x), dbias(bias);
  const bf16* b = with_bias ? dbias.get() : nullptr;
  const std::vector<float> f32 = RunPlain<float>(dx.get(), w, b, false, math, ws);
  EXPECT_TRUE(SameBits(f32, RunPlain<float>(dx.get(), w, b, true, math, ws)))
      << "early loads (or a second run) change bits";
  const std::vector<bf16> b16 = RunPlain<bf16>(dx.get(), w, b, true, math, ws);
  const std::vector<float> xf = cuda_test::ToFloat(x);
  ExpectNearReference(w.host(), xf, with_bias ? bias.data() : nullptr, f32, false, math);
  ExpectNearReference(w.host(), xf, with_bias ? bias.data() : nullptr, cuda_test::ToFloat(b16),
                      true, math);
}

void CheckPlainShapes(Fp8W16Math math, const Fp8W16SplitKWorkspace* ws) {
  std::mt19937 rng(cuda_test::TestSeed() + 2 * static_cast<int>(math));
  CheckPlain(rng, 77, 16, false, true, math, false, ws);      // one chunk: lanes 1..31 idle
  CheckPlain(rng, 130, 272, true, false, math, false, ws);    // 17 chunks: a partial first batch
  CheckPlain(rng, 77, 1040, false, false, math, false, ws);   // k % 128 = 16
  CheckPlain(rng, 9000, 4112, false, true, math, false, ws);  // 257 chunks
  CheckPlain(rng, 9000, 4096, true, true, math, false, ws);
  CheckPlain(rng, 130, 14336, false, true, math, false, ws);  // 3.5 batches a lane
}

void CheckFolds(std::mt19937& rng, int64_t n, int64_t k, bool with_bias, bool early,
                Fp8W16Math math, bool grouped, const Fp8W16SplitKWorkspace* ws) {
  SCOPED_TRACE(::testing::Message() << "folds math=" << static_cast<int>(math) << " n=" << n
                                    << " k=" << k << (with_bias ? " bias" : "")
                                    << (early ? " early" : "") << (grouped ? " grouped" : ""));
  const std::vector<bf16> x = RandomBf16(rng, k, 1.5f), norm_w = RandomBf16(rng, k, 1.0f);
  DeviceBuffer<bf16> dx(x), dnorm(norm_w), normed(k);
  ASSERT_TRUE(RmsNorm<bf16>(dx.get(), dnorm.get(), 1, k, kEps, normed.get(), nullptr).ok());

  const Weight w(rng, n, k, false, false, grouped);
  const std::vector<bf16> bias = RandomBf16(rng, 2 * n, 1.0f);
  DeviceBuffer<bf16> dbias(bias), folded(n);
  const bf16* b = with_bias ? dbias.get() : nullptr;
  ASSERT_TRUE(Fp8W16GemvNormIn(dx.get(), dnorm.get(), kEps, w.device(), b, 1, folded.get(), nullptr,
                               true, early, math, ws)
                  .ok());
  const std::vector<bf16> unfolded = RunPlain<bf16>(normed.get(), w, b, early, math, ws);
  EXPECT_TRUE(SameBits(folded.ToHost(), unfolded)) << "NormIn != RmsNorm + Fp8W16Gemv";
  const std::vector<float> normed_f = cuda_test::ToFloat(normed.ToHost());
  ExpectNearReference(w.host(), normed_f, with_bias ? bias.data() : nullptr,
                      cuda_test::ToFloat(unfolded), true, math);

  // SiLU-and-mul: gate rows 0..n-1, up rows n..2n-1 of one [2n, k] weight.
  const Weight gu(rng, 2 * n, k, false, false, grouped);
  DeviceBuffer<bf16> act(n), gate_up_out(2 * n);
  ASSERT_TRUE(Fp8W16GemvNormInSiluMul(dx.get(), dnorm.get(), kEps, gu.device(), b, 1, act.get(),
                                      nullptr, true, early, math, ws)
                  .ok());
  // The gate rows and the up rows as two weights of n rows each, so that gate (up) row i sits in
  // the same row slot of a 16-row tensor-core tile as in the fold (row i % 16): the tensor cores'
  // fp32 sums may differ in the last bit between slots (one bf16 ulp of about 1 in 10^5 outputs
  // when gate and up are one [2n, k] weight and n % 16 != 0).
  const int64_t scales_per_row = gu.grid.GridCols();
  for (int half = 0; half < 2; ++half) {
    const Fp8DeviceWeight rows{gu.d_codes.get() + half * n * k,
                               gu.d_scales.get() + half * n * scales_per_row,
                               {n, k, 1, gu.grid.block_cols}};
    ASSERT_TRUE(Fp8W16Gemv<bf16>(normed.get(), rows, b == nullptr ? nullptr : b + half * n, 1,
                                 gate_up_out.get() + half * n, nullptr, true, early, math, ws)
                    .ok());
  }
  // SiluAndMul takes inter a multiple of 8: gate and up padded with zeros to n8 columns each.
  const int64_t n8 = (n + 7) / 8 * 8;
  const std::vector<bf16> gate_up_host = gate_up_out.ToHost();
  std::vector<bf16> padded(2 * n8, __float2bfloat16_rn(0.0f));
  std::copy(gate_up_host.begin(), gate_up_host.begin() + n, padded.begin());
  std::copy(gate_up_host.begin() + n, gate_up_host.end(), padded.begin() + n8);
  DeviceBuffer<bf16> d_padded(padded), act_ref(n8);
  ASSERT_TRUE(SiluAndMul<bf16>(d_padded.get(), 1, n8, act_ref.get(), nullptr).ok());
  std::vector<bf16> want_act = act_ref.ToHost();
  want_act.resize(n);
  EXPECT_TRUE(SameBits(act.ToHost(), want_act))
      << "NormInSiluMul != RmsNorm + Fp8W16Gemv + SiluAndMul";
  ExpectNearReference(gu.host(), normed_f, with_bias ? bias.data() : nullptr,
                      cuda_test::ToFloat(gate_up_out.ToHost()), true, math);

  // AddTo: residual = round(residual + round(product)).
  const std::vector<bf16> res0 = RandomBf16(rng, n, 3.0f);
  DeviceBuffer<bf16> residual(res0);
  ASSERT_TRUE(Fp8W16GemvAddTo(normed.get(), w.device(), b, 1, residual.get(), nullptr, true, early,
                              math, ws)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<bf16> got = residual.ToHost();
  for (int64_t j = 0; j < n; ++j) {
    const bf16 want =
        __float2bfloat16_rn(__bfloat162float(res0[j]) + __bfloat162float(unfolded[j]));
    ASSERT_EQ(std::memcmp(&got[j], &want, sizeof(bf16)), 0) << "AddTo col " << j;
  }
}

void CheckFoldShapes(Fp8W16Math math, const Fp8W16SplitKWorkspace* ws) {
  std::mt19937 rng(cuda_test::TestSeed() + 1 + 2 * static_cast<int>(math));
  CheckFolds(rng, 77, 272, true, false, math, false, ws);
  CheckFolds(rng, 130, 1040, false, true, math, false, ws);
  CheckFolds(rng, 9000, 4096, true, true, math, false, ws);  // Llama-3-8B's hidden size
  CheckFolds(rng, 33, 8192, false, false, math, false, ws);  // Llama-3-70B's
  CheckFolds(rng, 40, 12272, true, true, math, false, ws);   // the largest NormIn k
}

void CheckGroupedShapes(Fp8W16Math math, const Fp8W16SplitKWorkspace* ws) {
  std::mt19937 rng(cuda_test::TestSeed() + 11 + 2 * static_cast<int>(math));
  struct Case {
    int64_t n, k;
    bool bias;
  };
  for (const Case& c : {Case{77, 128, true}, Case{77, 144, true}, Case{130, 272, false},
                        Case{33, 1040, true}, Case{513, 1408, false}, Case{4097, 2048, true},
                        Case{1537, 7168, false}, Case{129, 10944, true}}) {
    CheckPlain(rng, c.n, c.k, false, c.bias, math, true, ws);
  }
}

}  // namespace tandem::kernels::cuda::fp8_w16_test
