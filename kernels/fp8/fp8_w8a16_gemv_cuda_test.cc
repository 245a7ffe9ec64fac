// The batch-1 weight-only FP8 GEMV (fp8_w8a16_gemv_cuda.h) against the CPU reference
// cpu::Fp8Linear with Fp8ActivationScheme::kNone on fresh random codes, scales and activations:
// n = 77 / 130 / 9000 (a block's warps partly idle), k = 16 / 272 / 1040 / 4096 / 4112 / 14336
// (a lane with no chunk, partial batches of loads, k not a multiple of 128), per-tensor and
// per-channel scales, bias on / off, bf16 and fp32 out, the first loads before or after the PDL
// wait (same bits); the inner loops (Fp8W16Math: fp32 fmaf, tensor-core mma, the shared-memory
// ring forms); the folded forms bit for bit against the unfolded kernels (RmsNorm<bf16>,
// SiluAndMul<bf16>, the residual add) and through them against the reference; the ring forms bit
// for bit against the tensor-core kernel at the Llama-3-8B / 70B projections (and sampled rows
// against the reference there); grouped weights (a random scale per row and 128-column group)
// on both inner loops, kAuto and the ring maths' fallback, k = 144 .. 10944 with partial last
// groups, and their folds; refusals; the latency forms (deep, split-k, persistent: the deep and
// persistent ones bit for bit against kTensorCore) (GPU; skips without one).
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/layers/cuda/layers_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;
using fp8_test::RandomBf16;
using fp8_test::RandomE4m3Codes;

constexpr float kEps = 1e-5f;

std::vector<float> RandomScales(std::mt19937& rng, int64_t n, bool per_tensor) {
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> scales(n);
  for (float& s : scales) s = std::exp2(log_scale(rng));
  if (per_tensor) std::fill(scales.begin(), scales.end(), scales[0]);
  return scales;
}

// Random codes for a large weight: a fresh random block of 2^20 - 3 codes repeated (rows of any
// k start at different offsets in it), a fraction of the time per-code draws take at 0.5 G codes.
std::vector<uint8_t> TiledE4m3Codes(std::mt19937& rng, int64_t count) {
  const std::vector<uint8_t> block = RandomE4m3Codes(rng, (int64_t{1} << 20) - 3);
  const int64_t size = static_cast<int64_t>(block.size());
  std::vector<uint8_t> codes(count);
  for (int64_t i = 0; i < count; i += size) {
    std::memcpy(codes.data() + i, block.data(), std::min(size, count - i));
  }
  return codes;
}

// The host side of a weight: what the reference multiplies.
struct HostWeight {
  const uint8_t* codes;
  const float* scales;
  Fp8ScaleGrid grid;
};

// A random e4m3 weight with per-channel or per-tensor (n copies) scales, or (grouped) a random
// scale per row and 128-column group, host and device.
struct Weight {
  Weight(std::mt19937& rng, int64_t n, int64_t k, bool per_tensor, bool tiled = false,
         bool grouped = false)
      : grid{n, k, 1, grouped ? kFp8W16ScaleGroupCols : k},
        codes(tiled ? TiledE4m3Codes(rng, n * k) : RandomE4m3Codes(rng, n * k)),
        scales(RandomScales(rng, grid.NumScales(), per_tensor)),
        d_codes(codes),
        d_scales(scales) {}
  Fp8DeviceWeight device() const { return {d_codes.get(), d_scales.get(), grid}; }
  HostWeight host() const { return {codes.data(), scales.data(), grid}; }

  Fp8ScaleGrid grid;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  DeviceBuffer<uint8_t> d_codes;
  DeviceBuffer<float> d_scales;
};

// The inner loops that multiply f16 activations: all but kFp32Fma.
bool F16Activations(Fp8W16Math math) { return math != Fp8W16Math::kFp32Fma; }

// Checks got (one row of n outputs) against cpu::Fp8Linear (weight-only) on the activations x
// [k]: fp32 summation error plus the output rounding (bf16_out). The f16 forms (kTensorCore, the
// rings): the same fp32 bound (products of f16 are exact in fp32; the tensor core adds 16 at a
// step, k / 128 steps a warp, far inside 4e-6 sqrt(k)) plus the activations' f16 rounding below
// 2^-14 (<= 2^-25 each, times |w|).
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
                           Fp8W16Math math, const Fp8W16SplitKWorkspace* ws = nullptr) {
  DeviceBuffer<TOut> out(w.grid.rows);
  cudaMemset(out.get(), 0xFF, out.size() * sizeof(TOut));  // NaN: an unwritten element fails
  const absl::Status st = Fp8W16Gemv<TOut>(x, w.device(), bias, 1, out.get(), nullptr,
                                           /*programmatic_launch=*/true, early, math, ws);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.ToHost();
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The plain kernel, fp32 and bf16 out, early loads on and off, against the reference.
void CheckPlain(std::mt19937& rng, int64_t n, int64_t k, bool per_tensor, bool with_bias,
                Fp8W16Math math, bool grouped = false, const Fp8W16SplitKWorkspace* ws = nullptr) {
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

void CheckPlainShapes(Fp8W16Math math, const Fp8W16SplitKWorkspace* ws = nullptr) {
  std::mt19937 rng(cuda_test::TestSeed() + 2 * static_cast<int>(math));
  CheckPlain(rng, 77, 16, false, true, math, false, ws);      // one chunk: lanes 1..31 idle
  CheckPlain(rng, 130, 272, true, false, math, false, ws);    // 17 chunks: a partial first batch
  CheckPlain(rng, 77, 1040, false, false, math, false, ws);   // k % 128 = 16
  CheckPlain(rng, 9000, 4112, false, true, math, false, ws);  // 257 chunks
  CheckPlain(rng, 9000, 4096, true, true, math, false, ws);
  CheckPlain(rng, 130, 14336, false, true, math, false, ws);  // 3.5 batches a lane
}

TEST(Fp8W16GemvCudaTest, MatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kFp32Fma);
}

// kTensorCore: n = 77 / 130 leave a block's last rows past n, k = 16 / 272 / 1040 / 4112 end in
// a partial 64-column group, k = 272 gives warps 5..7 no group.
TEST(Fp8W16GemvCudaTest, TensorCoreMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kTensorCore);
}

// The folded forms bit for bit against the unfolded kernels, and through them the reference.
void CheckFolds(std::mt19937& rng, int64_t n, int64_t k, bool with_bias, bool early,
                Fp8W16Math math, bool grouped = false, const Fp8W16SplitKWorkspace* ws = nullptr) {
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

void CheckFoldShapes(Fp8W16Math math, const Fp8W16SplitKWorkspace* ws = nullptr) {
  std::mt19937 rng(cuda_test::TestSeed() + 1 + 2 * static_cast<int>(math));
  CheckFolds(rng, 77, 272, true, false, math, false, ws);
  CheckFolds(rng, 130, 1040, false, true, math, false, ws);
  CheckFolds(rng, 9000, 4096, true, true, math, false, ws);  // Llama-3-8B's hidden size
  CheckFolds(rng, 33, 8192, false, false, math, false, ws);  // Llama-3-70B's
  CheckFolds(rng, 40, 12272, true, true, math, false, ws);   // the largest NormIn k
}

TEST(Fp8W16GemvCudaTest, FoldsEqualTheUnfoldedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckFoldShapes(Fp8W16Math::kFp32Fma);
}

TEST(Fp8W16GemvCudaTest, TensorCoreFoldsEqualTheUnfoldedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckFoldShapes(Fp8W16Math::kTensorCore);
}

// kAuto: the tensor-core bits while the f16 staging fits 48 KiB (k <= 24,576), else fp32's.
TEST(Fp8W16GemvCudaTest, AutoPicksByTheStagingSize) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 5);
  for (const int64_t k : {int64_t{1040}, int64_t{24576}, int64_t{24592}}) {
    SCOPED_TRACE(::testing::Message() << "k=" << k);
    const Weight w(rng, 33, k, false);
    const std::vector<bf16> x = RandomBf16(rng, k, 2.0f);
    DeviceBuffer<bf16> dx(x);
    const Fp8W16Math want =
        2 * k <= kFp8W16AutoMaxStagingBytes ? Fp8W16Math::kTensorCore : Fp8W16Math::kFp32Fma;
    EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kAuto),
                         RunPlain<float>(dx.get(), w, nullptr, true, want)));
  }
}

constexpr Fp8W16Math kRings[] = {Fp8W16Math::kRing, Fp8W16Math::kRing2, Fp8W16Math::kRingHalf};

// The ring forms at the odd shapes: n = 77 / 130 give one tile a CTA and a partial last tile,
// n = 9000 several tiles a CTA (the ring wraps across tiles), k = 16 one stage of one chunk
// (fewer stages than the ring's slots), k = 1040 / 4112 a partial last stage, k = 14336 14
// stages a tile. kRing against the reference (as the other loops); all three bit for bit against
// kTensorCore on the same inputs, early loads or not (they differ only in grid size and stage
// count: 11-12 stages a CTA on a whole SM, 4-6 on half).
TEST(Fp8W16GemvCudaTest, RingMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kRing);
}

TEST(Fp8W16GemvCudaTest, RingsEqualTheTensorCoreAtOddShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 11);
  const int64_t shapes[][2] = {{77, 16},     {130, 272},   {77, 1040},
                               {9000, 4112}, {9000, 4096}, {130, 14336}};
  for (const auto& [n, k] : shapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    const Weight w(rng, n, k, false);
    const std::vector<bf16> x = RandomBf16(rng, k, 2.0f), bias = RandomBf16(rng, n, 1.0f);
    DeviceBuffer<bf16> dx(x), dbias(bias);
    const std::vector<float> want =
        RunPlain<float>(dx.get(), w, dbias.get(), true, Fp8W16Math::kTensorCore);
    for (const Fp8W16Math math : kRings) {
      for (const bool early : {false, true}) {
        EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, dbias.get(), early, math), want))
            << "math=" << static_cast<int>(math) << (early ? " early" : "");
      }
    }
  }
}

// kRing's folds at the odd shapes (kRing2 / kRingHalf: bit for bit against kTensorCore's folds at
// the Llama shapes below; the three differ only in grid size and stage count).
TEST(Fp8W16GemvCudaTest, RingFoldsEqualTheUnfoldedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckFoldShapes(Fp8W16Math::kRing);
}

// got (n outputs) against the reference on 96 rows of w: the first and last 40 (the last tile
// partial or not) and 16 spread over the rest.
void ExpectRowsNearReference(const Weight& w, const std::vector<float>& x,
                             const std::vector<float>& got, Fp8W16Math math) {
  const int64_t n = w.grid.rows, k = w.grid.cols;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < 40; ++i) rows.insert(rows.end(), {i, n - 40 + i});
  for (int64_t i = 0; i < 16; ++i) rows.push_back(n / 16 * i + 7 * i);
  std::vector<uint8_t> codes;
  std::vector<float> scales, sub;
  for (const int64_t r : rows) {
    codes.insert(codes.end(), w.codes.begin() + r * k, w.codes.begin() + (r + 1) * k);
    scales.push_back(w.scales[r]);
    sub.push_back(got[r]);
  }
  const int64_t m = static_cast<int64_t>(rows.size());
  ExpectNearReference({codes.data(), scales.data(), {m, k, 1, k}}, x, nullptr, sub, false, math);
}

// One Llama-3 projection as the decode step runs it (fold: 0 NormIn, 1 AddTo, 2 NormInSiluMul):
// every ring form bit for bit against kTensorCore, plain (fp32 out) and folded, and the plain
// outputs' sampled rows against the reference.
struct RealShape {
  const char* name;
  int64_t n, k;
  int fold;
};

std::vector<bf16> RunFolded(const RealShape& s, const bf16* x, const bf16* norm_w, const Weight& w,
                            const std::vector<bf16>& residual, Fp8W16Math math) {
  DeviceBuffer<bf16> out(residual);
  absl::Status st;
  if (s.fold == 0) {
    st = Fp8W16GemvNormIn(x, norm_w, kEps, w.device(), nullptr, 1, out.get(), nullptr, true, true,
                          math);
  } else if (s.fold == 2) {
    st = Fp8W16GemvNormInSiluMul(x, norm_w, kEps, w.device(), nullptr, 1, out.get(), nullptr, true,
                                 true, math);
  } else {
    st = Fp8W16GemvAddTo(x, w.device(), nullptr, 1, out.get(), nullptr, true, true, math);
  }
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.ToHost();
}

void CheckRealShape(std::mt19937& rng, const RealShape& s) {
  SCOPED_TRACE(::testing::Message() << s.name << " n=" << s.n << " k=" << s.k);
  const Weight w(rng, s.n, s.k, false, /*tiled=*/true);
  const std::vector<bf16> x = RandomBf16(rng, s.k, 1.5f), norm_w = RandomBf16(rng, s.k, 1.0f);
  DeviceBuffer<bf16> dx(x), dnorm(norm_w), normed(s.k);
  ASSERT_TRUE(RmsNorm<bf16>(dx.get(), dnorm.get(), 1, s.k, kEps, normed.get(), nullptr).ok());
  const std::vector<float> normed_f = cuda_test::ToFloat(normed.ToHost());
  const std::vector<float> tc =
      RunPlain<float>(normed.get(), w, nullptr, true, Fp8W16Math::kTensorCore);
  ExpectRowsNearReference(w, normed_f, tc, Fp8W16Math::kTensorCore);
  const std::vector<bf16> residual = RandomBf16(rng, s.fold == 2 ? s.n / 2 : s.n, 3.0f);
  const bf16* in = s.fold == 1 ? normed.get() : dx.get();
  const std::vector<bf16> want =
      RunFolded(s, in, dnorm.get(), w, residual, Fp8W16Math::kTensorCore);
  for (const Fp8W16Math math : kRings) {
    SCOPED_TRACE(::testing::Message() << "math=" << static_cast<int>(math));
    const std::vector<float> ring = RunPlain<float>(normed.get(), w, nullptr, true, math);
    EXPECT_TRUE(SameBits(ring, tc)) << "plain != kTensorCore";
    ExpectRowsNearReference(w, normed_f, ring, math);
    EXPECT_TRUE(SameBits(RunFolded(s, in, dnorm.get(), w, residual, math), want))
        << "folded != kTensorCore";
  }
}

TEST(Fp8W16GemvCudaTest, RingsEqualTheTensorCoreAtTheLlamaShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 7);
  const RealShape shapes[] = {
      {"8B qkv", 6144, 4096, 0},       {"8B o", 4096, 4096, 1},      {"8B gate_up", 28672, 4096, 2},
      {"8B down", 4096, 14336, 1},     {"70B qkv", 10240, 8192, 0},  {"70B o", 8192, 8192, 1},
      {"70B gate_up", 57344, 8192, 2}, {"70B down", 8192, 28672, 1},
  };
  for (const RealShape& s : shapes) CheckRealShape(rng, s);
}

// k = 49,152: 96 KiB of f16 activations leave kRing2 / kRingHalf no room for 3 stages in half an
// SM, so they run the tensor-core kernel; kRing runs the ring (7 stages beside the 96 KiB). All
// three give the tensor-core kernel's bits.
TEST(Fp8W16GemvCudaTest, RingsBesideLargeStagingOrFallingBack) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 9);
  const Weight w(rng, 33, 49152, false);
  const std::vector<bf16> x = RandomBf16(rng, 49152, 2.0f);
  DeviceBuffer<bf16> dx(x);
  const std::vector<float> want =
      RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCore);
  for (const Fp8W16Math math : kRings) {
    EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, math), want))
        << "math=" << static_cast<int>(math);
  }
}

// Grouped weights: a random scale per row and 128-column group (never equal across groups).
// k = 144 / 272 / 1040 / 10944 end in a partial group (16 / 16 / 16 / 64 columns); 2048 / 7168
// are Qwen3-30B-A3B's / DeepSeek-V3's hidden sizes, 1408 / 10944 DeepSeek-V2-Lite's expert /
// dense intermediate sizes; k = 128 is one group (the per-channel kernels).
void CheckGroupedShapes(Fp8W16Math math, const Fp8W16SplitKWorkspace* ws = nullptr) {
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

TEST(Fp8W16GemvCudaTest, GroupedMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckGroupedShapes(Fp8W16Math::kFp32Fma);
}

TEST(Fp8W16GemvCudaTest, GroupedTensorCoreMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckGroupedShapes(Fp8W16Math::kTensorCore);
}

TEST(Fp8W16GemvCudaTest, GroupedFoldsEqualTheUnfoldedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (const Fp8W16Math math : {Fp8W16Math::kFp32Fma, Fp8W16Math::kTensorCore}) {
    std::mt19937 rng(cuda_test::TestSeed() + 12 + 2 * static_cast<int>(math));
    CheckFolds(rng, 77, 272, true, false, math, true);
    CheckFolds(rng, 130, 2048, false, true, math, true);
    CheckFolds(rng, 33, 7168, true, true, math, true);
    CheckFolds(rng, 40, 10944, false, false, math, true);
  }
}

// kAuto on a grouped weight: the tensor-core bits (k <= 24,576), fp32's past; the ring maths run
// the tensor-core kernel (no grouped ring form).
TEST(Fp8W16GemvCudaTest, GroupedAutoAndRingsPickTheGroupedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 13);
  for (const int64_t k : {int64_t{7168}, int64_t{28672}}) {
    SCOPED_TRACE(::testing::Message() << "k=" << k);
    const Weight w(rng, 300, k, false, false, true);
    DeviceBuffer<bf16> dx(RandomBf16(rng, k, 1.0f));
    const std::vector<float> fma =
        RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kFp32Fma);
    const std::vector<float> mma =
        RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCore);
    EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kAuto),
                         k * 2 <= kFp8W16AutoMaxStagingBytes ? mma : fma));
    for (const Fp8W16Math math : kRings) {
      EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, math), mma))
          << "math=" << static_cast<int>(math);
    }
  }
}

TEST(Fp8W16GemvCudaTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint8_t> codes(64 * 16384);
  DeviceBuffer<float> s(64 * 128), out(2 * 64);
  DeviceBuffer<bf16> x(2 * 16384), nw(16384), o16(64);
  const Fp8DeviceWeight w{codes.get(), s.get(), {64, 64, 1, 64}};
  EXPECT_TRUE(Fp8W16Gemv<float>(x.get(), w, nullptr, 1, out.get(), nullptr).ok());
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(), w, nullptr, 2, out.get(), nullptr).ok());  // m
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(), w, nullptr, 0, out.get(), nullptr).ok());
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(), {codes.get(), s.get(), {64, 72, 1, 72}}, nullptr, 1,
                                 out.get(),
                                 nullptr)
                   .ok());  // k % 16
  EXPECT_TRUE(Fp8W16Gemv<float>(x.get(), {codes.get(), s.get(), {64, 256, 1, 128}}, nullptr, 1,
                                out.get(), nullptr)
                  .ok());  // 128-column groups
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(), {codes.get(), s.get(), {64, 256, 1, 64}}, nullptr, 1,
                                 out.get(), nullptr)
                   .ok());  // 64-column groups
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(), {codes.get(), s.get(), {64, 256, 2, 128}}, nullptr, 1,
                                 out.get(), nullptr)
                   .ok());  // scales shared by 2 rows
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(),
                                 {codes.get(), s.get(), {1, kFp8W16MaxK + 16, 1, kFp8W16MaxK + 16}},
                                 nullptr, 1, out.get(), nullptr, false, false,
                                 Fp8W16Math::kTensorCore)
                   .ok());  // k past kFp8W16MaxK
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get() + 1, w, nullptr, 1, out.get(), nullptr).ok());  // align
  EXPECT_FALSE(
      Fp8W16Gemv<float>(x.get(), w, nullptr, 1, static_cast<float*>(nullptr), nullptr).ok());
  EXPECT_FALSE(Fp8W16GemvNormIn(x.get(), nullptr, kEps, w, nullptr, 1, o16.get(), nullptr).ok());
  EXPECT_FALSE(Fp8W16GemvNormIn(x.get(), nw.get(), kEps,
                                {codes.get(), s.get(), {64, 16384, 1, 16384}}, nullptr, 1,
                                o16.get(), nullptr)
                   .ok());  // 64 KiB of staging
  EXPECT_FALSE(Fp8W16GemvNormInSiluMul(x.get(), nw.get(), kEps,
                                       {codes.get(), s.get(), {63, 64, 1, 64}}, nullptr, 1,
                                       o16.get(), nullptr)
                   .ok());  // odd gate_up rows
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// kTensorCoreDeep (16 loads in flight a lane): kTensorCore's bits, hence the reference, plain,
// folded and grouped.
TEST(Fp8W16GemvCudaTest, DeepEqualsTheTensorCore) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kTensorCoreDeep);
  CheckFoldShapes(Fp8W16Math::kTensorCoreDeep);
  CheckGroupedShapes(Fp8W16Math::kTensorCoreDeep);
  std::mt19937 rng(cuda_test::TestSeed() + 21);
  for (const auto& [n, k, grouped] :
       {std::tuple{77, 272, false}, std::tuple{130, 14336, false}, std::tuple{4096, 4096, false},
        std::tuple{129, 10944, true}}) {
    const Weight w(rng, n, k, false, false, grouped);
    DeviceBuffer<bf16> dx(RandomBf16(rng, k, 2.0f));
    EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCoreDeep),
                         RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCore)))
        << "deep != kTensorCore at n=" << n << " k=" << k;
  }
}

// A split-k workspace for weights of up to `rows` rows, counters zeroed.
struct SplitKBuffer {
  SplitKBuffer(int64_t rows, int splits) : mem(Fp8W16SplitKWorkspaceBytes(rows)) {
    EXPECT_EQ(cudaMemset(mem.get(), 0, mem.size()), cudaSuccess);
    ws = Fp8W16SplitKWorkspaceAt(mem.get(), rows, splits);
  }
  bool CountersZero() const {
    std::vector<unsigned int> c(ws.tiles);
    EXPECT_EQ(cudaMemcpy(c.data(), ws.counters, c.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return std::all_of(c.begin(), c.end(), [](unsigned int v) { return v == 0; });
  }
  DeviceBuffer<uint8_t> mem;
  Fp8W16SplitKWorkspace ws;
};

// kTensorCoreSplitK, S picked (on an H200: 4 at n <= 130 and k >= 4096, 2 at n = 4097 and k =
// 2048, else one split: kTensorCore) and forced to 2 (k = 272: 256 + 16 columns; k = 1040: 640 +
// 400) and 4 (k = 272: 3 splits of 128, 128, 16 columns; k = 1040: 3 of 384, 384, 272), k =
// 14336 with 130 rows: 4 x 3584: against the reference with kTensorCore's tolerance, every call
// twice (early loads off / on) with the same bits, the folds bit for bit against the unfolded
// split kernels (the same S for the same n and k), the counters zero after.
TEST(Fp8W16GemvCudaTest, SplitKMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (const int splits : {0, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << "splits=" << splits);
    SplitKBuffer buf(2 * 9000, splits);
    CheckPlainShapes(Fp8W16Math::kTensorCoreSplitK, &buf.ws);
    CheckFoldShapes(Fp8W16Math::kTensorCoreSplitK, &buf.ws);
    CheckGroupedShapes(Fp8W16Math::kTensorCoreSplitK, &buf.ws);
    EXPECT_TRUE(buf.CountersZero());
  }
}

// Replays of a captured split-k launch give the eager bits (the counters wrap back to 0).
TEST(Fp8W16GemvCudaTest, SplitKReplaysInAGraph) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 22);
  const int64_t n = 4096, k = 14336;  // Llama-3-8B's down_proj (S = 2, as picked on an H200)
  const Weight w(rng, n, k, false, true);
  DeviceBuffer<bf16> dx(RandomBf16(rng, k, 2.0f));
  SplitKBuffer buf(n, 2);
  const std::vector<float> eager =
      RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCoreSplitK, &buf.ws);
  DeviceBuffer<float> out(n);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const absl::Status st = Fp8W16Gemv<float>(dx.get(), w.device(), nullptr, 1, out.get(), stream,
                                            true, true, Fp8W16Math::kTensorCoreSplitK, &buf.ws);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    cudaMemsetAsync(out.get(), 0xFF, n * sizeof(float), stream);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(SameBits(out.ToHost(), eager)) << "replay " << replay;
  }
  EXPECT_TRUE(buf.CountersZero());
  ExpectNearReference(w.host(), cuda_test::ToFloat(dx.ToHost()), nullptr, eager, false,
                      Fp8W16Math::kTensorCoreSplitK);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// kTensorCorePersistent (the deep tiles on min(tiles, 2 SMs) CTAs, the activations staged once a
// CTA): against the reference and its own unfolded kernels as the other forms, then bit for bit
// against kTensorCore, plain (fp32 out), NormIn, NormInSiluMul and AddTo, per-channel and grouped,
// at n = 77 / 130 (5 / 9 tiles: one a CTA) and 9000 (563 tiles: past 2 x 132 SMs, 2-3 a CTA), k =
// 272 / 1040 / 4096 / 14336 (NormIn's k <= 12280: 14336 plain and AddTo only).
void ExpectPersistentBits(std::mt19937& rng, int64_t n, int64_t k, bool grouped) {
  SCOPED_TRACE(::testing::Message()
               << "persistent n=" << n << " k=" << k << (grouped ? " grouped" : ""));
  constexpr Fp8W16Math kP = Fp8W16Math::kTensorCorePersistent, kT = Fp8W16Math::kTensorCore;
  const Weight w(rng, n, k, false, false, grouped);
  DeviceBuffer<bf16> dx(RandomBf16(rng, k, 1.5f)), dnorm(RandomBf16(rng, k, 1.0f));
  DeviceBuffer<bf16> dbias(RandomBf16(rng, 2 * n, 1.0f));
  const std::vector<bf16> res0 = RandomBf16(rng, n, 3.0f);
  EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, dbias.get(), true, kP),
                       RunPlain<float>(dx.get(), w, dbias.get(), true, kT)))
      << "plain";
  EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, false, kP),
                       RunPlain<float>(dx.get(), w, nullptr, false, kT)))
      << "plain, late loads";
  const auto add_to = [&](Fp8W16Math math) {
    DeviceBuffer<bf16> residual(res0);
    EXPECT_TRUE(Fp8W16GemvAddTo(dx.get(), w.device(), dbias.get(), 1, residual.get(), nullptr, true,
                                true, math)
                    .ok());
    return residual.ToHost();
  };
  EXPECT_TRUE(SameBits(add_to(kP), add_to(kT))) << "AddTo";
  if (!Fp8W16GemvNormInSupported(dx.get(), dnorm.get(), w.device(), 1)) return;  // k > 12280
  const Weight gu(rng, 2 * n, k, false, false, grouped);  // gate rows, then up rows
  const auto norm_in = [&](Fp8W16Math math, bool silu) {
    DeviceBuffer<bf16> out(n);
    const absl::Status st =
        silu ? Fp8W16GemvNormInSiluMul(dx.get(), dnorm.get(), kEps, gu.device(), dbias.get(), 1,
                                       out.get(), nullptr, true, true, math)
             : Fp8W16GemvNormIn(dx.get(), dnorm.get(), kEps, w.device(), dbias.get(), 1, out.get(),
                                nullptr, true, true, math);
    EXPECT_TRUE(st.ok()) << st;
    return out.ToHost();
  };
  EXPECT_TRUE(SameBits(norm_in(kP, false), norm_in(kT, false))) << "NormIn";
  EXPECT_TRUE(SameBits(norm_in(kP, true), norm_in(kT, true))) << "NormInSiluMul";
}

TEST(Fp8W16GemvCudaTest, PersistentEqualsTheTensorCore) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kTensorCorePersistent);
  CheckFoldShapes(Fp8W16Math::kTensorCorePersistent);
  CheckGroupedShapes(Fp8W16Math::kTensorCorePersistent);
  std::mt19937 rng(cuda_test::TestSeed() + 23);
  for (const int64_t n : {int64_t{77}, int64_t{130}, int64_t{9000}}) {
    for (const int64_t k : {int64_t{272}, int64_t{1040}, int64_t{4096}, int64_t{14336}}) {
      for (const bool grouped : {false, true}) ExpectPersistentBits(rng, n, k, grouped);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
