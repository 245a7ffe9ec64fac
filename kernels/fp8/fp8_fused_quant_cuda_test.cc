// RmsNormQuantFp8 / SiluAndMulQuantFp8 (fp8_fused_quant_cuda.h) on fresh random inputs (GPU;
// skips without one):
//   * bit for bit the two kernels they replace: kernels/layers/cuda's RmsNorm / FusedAddRmsNorm
//     / SiluAndMul, then QuantizeActivations (kDynamicToken; after RMSNorm also
//     kDynamicGroup128) on their bf16 output: output, residual, codes and scales;
//   * against the CPU reference: kernels/layers' fp32 RmsNorm / SiluAndMul on the same bf16
//     inputs, rounded to bf16, quantized by kernels::QuantizeActivations: bf16 outputs within
//     2^-7 relative, scales within 2^-7, every dequantized code within an e4m3 half-step
//     (2^-4 relative, 2^-10 x scale near zero) of the reference value plus that 2^-7;
// m = 1, 3, 17 with one all-zero row (scale 1), widths 8 .. 16384 (one to eight 16-byte
// vectors a thread, partial vectors past the width), and the refusals.
#include "kernels/fp8/fp8_fused_quant_cuda.h"

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/layers/activation.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "kernels/layers/norm.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;

constexpr float kEps = 1e-5f;

// Random bf16 values; row `zero_row` (if in range) all zero.
std::vector<bf16> RandomRows(std::mt19937& rng, int64_t m, int64_t width, float stddev,
                             int64_t zero_row) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<bf16> v(m * width);
  for (int64_t i = 0; i < m * width; ++i) {
    v[i] = __float2bfloat16_rn(i / width == zero_row ? 0.0f : dist(rng));
  }
  return v;
}

std::vector<float> ToF(const std::vector<bf16>& v) { return cuda_test::ToFloat(v); }

std::vector<float> RoundBf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(__float2bfloat16_rn(v[i]));
  return out;
}

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

Quantized FromDevice(const DeviceBuffer<uint8_t>& codes, const DeviceBuffer<float>& scales) {
  return {codes.ToHost(), scales.ToHost()};
}

// The fused result against the two-kernel one, bit for bit.
void ExpectSameBits(const Quantized& fused, const Quantized& two) {
  ASSERT_EQ(fused.codes.size(), two.codes.size());
  int64_t code_diffs = 0, scale_diffs = 0;
  for (size_t i = 0; i < fused.codes.size(); ++i) code_diffs += fused.codes[i] != two.codes[i];
  for (size_t i = 0; i < fused.scales.size(); ++i) {
    scale_diffs += fused.scales[i] != two.scales[i];
  }
  EXPECT_EQ(code_diffs, 0) << "codes differ from RmsNorm/SiluAndMul + QuantizeActivations";
  EXPECT_EQ(scale_diffs, 0) << "scales differ";
}

void ExpectSameBf16(const std::vector<bf16>& a, const std::vector<bf16>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  int64_t diffs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diffs += __bfloat16_as_ushort(a[i]) != __bfloat16_as_ushort(b[i]);
  }
  EXPECT_EQ(diffs, 0) << what << " differs from the two-kernel path";
}

// The device result against the CPU reference `ref` ([m, width], the bf16-rounded fp32 values),
// quantized per token or per 1 x 128 group (`scheme`).
void ExpectNearReference(const std::vector<float>& got_out, const Quantized& got,
                         const std::vector<float>& ref, int64_t m, int64_t width,
                         Fp8ActivationScheme scheme = Fp8ActivationScheme::kDynamicToken) {
  constexpr float kBf16Rel = 0x1p-7f;
  for (size_t i = 0; i < ref.size() && !got_out.empty(); ++i) {
    ASSERT_NEAR(got_out[i], ref[i], kBf16Rel * std::fabs(ref[i]) + 1e-30f) << "element " << i;
  }
  const int64_t per_row = scheme == Fp8ActivationScheme::kDynamicGroup128 ? (width + 127) / 128 : 1;
  const int64_t group_cols = scheme == Fp8ActivationScheme::kDynamicGroup128 ? 128 : width;
  Quantized want{std::vector<uint8_t>(m * width), std::vector<float>(m * per_row)};
  kernels::QuantizeActivations(ref.data(), m, width, scheme, 0.0f, want.codes.data(),
                               want.scales.data());
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const int64_t si = r * per_row + c / group_cols;
      const float s = got.scales[si];
      ASSERT_NEAR(s, want.scales[si], kBf16Rel * want.scales[si]) << "row " << r << " col " << c;
      const float v = ref[r * width + c];
      const float deq = Fp8E4m3ToFloat(got.codes[r * width + c]) * s;
      ASSERT_NEAR(deq, v, (0x1p-4f + 2 * kBf16Rel) * std::fabs(v) + 0x1p-10f * s)
          << "row " << r << " column " << c;
    }
  }
}

void CheckNorm(std::mt19937& rng, int64_t m, int64_t hidden, bool add, bool group128 = false) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " hidden=" << hidden << (add ? " add" : "")
                                    << (group128 ? " 1 x 128 groups" : ""));
  const Fp8ActivationScheme scheme =
      group128 ? Fp8ActivationScheme::kDynamicGroup128 : Fp8ActivationScheme::kDynamicToken;
  const int64_t num_scales = NumActivationScales(scheme, m, hidden);
  const int64_t zero_row = m > 2 ? 1 : -1;
  const std::vector<bf16> x = RandomRows(rng, m, hidden, 1.0f, add ? -1 : zero_row);
  // With the add, residual + x is zero on the zero row: both are.
  std::vector<bf16> res = RandomRows(rng, m, hidden, 2.0f, zero_row);
  if (add && zero_row >= 0) {
    for (int64_t c = 0; c < hidden; ++c) {
      res[zero_row * hidden + c] = __float2bfloat16_rn(-__bfloat162float(x[zero_row * hidden + c]));
    }
  }
  const std::vector<bf16> weight = RandomRows(rng, 1, hidden, 0.5f, -1);
  DeviceBuffer<bf16> dx(x), dres(res), dw(weight), dout(m * hidden);
  DeviceBuffer<bf16> dx2(x), dres2(res), dout2(m * hidden);
  DeviceBuffer<uint8_t> codes(m * hidden), codes2(m * hidden);
  DeviceBuffer<float> scales(num_scales), scales2(num_scales);
  // Fused: out = norm (the add variant writes it over x, as the model does).
  bf16* out = add ? dx.get() : dout.get();
  ASSERT_TRUE(RmsNormQuantFp8(dx.get(), add ? dres.get() : nullptr, dw.get(), m, hidden, kEps, out,
                              {codes.get(), scales.get(), group128}, nullptr)
                  .ok());
  // The two kernels it replaces.
  bf16* out2 = add ? dx2.get() : dout2.get();
  if (add) {
    ASSERT_TRUE(
        FusedAddRmsNorm<bf16>(dx2.get(), dres2.get(), dw.get(), m, hidden, kEps, nullptr).ok());
  } else {
    ASSERT_TRUE(RmsNorm<bf16>(dx2.get(), dw.get(), m, hidden, kEps, dout2.get(), nullptr).ok());
  }
  ASSERT_TRUE(
      QuantizeActivations(out2, m, hidden, scheme, 0.0f, codes2.get(), scales2.get(), nullptr)
          .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<bf16> got_out = add ? dx.ToHost() : dout.ToHost();
  ExpectSameBf16(got_out, add ? dx2.ToHost() : dout2.ToHost(), "norm output");
  if (add) ExpectSameBf16(dres.ToHost(), dres2.ToHost(), "residual");
  const Quantized got = FromDevice(codes, scales);
  ExpectSameBits(got, FromDevice(codes2, scales2));
  // CPU: residual = bf16(residual + x), norm in fp32 (fp64 mean), rounded to bf16.
  std::vector<float> xf = ToF(x), rf = ToF(res), ref(m * hidden);
  if (add) {
    for (size_t i = 0; i < rf.size(); ++i)
      rf[i] = __bfloat162float(__float2bfloat16_rn(rf[i] + xf[i]));
    cpu::RmsNorm(rf.data(), ToF(weight).data(), m, hidden, kEps, ref.data());
  } else {
    cpu::RmsNorm(xf.data(), ToF(weight).data(), m, hidden, kEps, ref.data());
  }
  ExpectNearReference(ToF(got_out), got, RoundBf16(ref), m, hidden, scheme);
}

void CheckSilu(std::mt19937& rng, int64_t m, int64_t inter, bool write_out) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " inter=" << inter
                                    << (write_out ? " with bf16 out" : " codes only"));
  const std::vector<bf16> gate_up = RandomRows(rng, m, 2 * inter, 2.0f, m > 2 ? 2 : -1);
  DeviceBuffer<bf16> dgu(gate_up), dout(m * inter), dout2(m * inter);
  DeviceBuffer<uint8_t> codes(m * inter), codes2(m * inter);
  DeviceBuffer<float> scales(m), scales2(m);
  ASSERT_TRUE(SiluAndMulQuantFp8(dgu.get(), m, inter, write_out ? dout.get() : nullptr,
                                 {codes.get(), scales.get()}, nullptr)
                  .ok());
  ASSERT_TRUE(SiluAndMul<bf16>(dgu.get(), m, inter, dout2.get(), nullptr).ok());
  ASSERT_TRUE(QuantizeActivations(dout2.get(), m, inter, Fp8ActivationScheme::kDynamicToken, 0.0f,
                                  codes2.get(), scales2.get(), nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Quantized got = FromDevice(codes, scales);
  ExpectSameBits(got, FromDevice(codes2, scales2));
  std::vector<float> got_out;
  if (write_out) {
    ExpectSameBf16(dout.ToHost(), dout2.ToHost(), "SiLU-and-mul output");
    got_out = ToF(dout.ToHost());
  }
  std::vector<float> ref(m * inter);
  cpu::SiluAndMul(ToF(gate_up).data(), m, inter, ref.data());
  ExpectNearReference(got_out, got, RoundBf16(ref), m, inter);
}

TEST(Fp8FusedQuantCudaTest, RmsNormQuantMatchesNormThenQuantize) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (bool add : {false, true}) {
    for (int64_t m : {1, 3, 17}) {
      for (int64_t hidden : {8, 1000, 4096, 5128, 16384}) CheckNorm(rng, m, hidden, add);
    }
  }
}

// 1 x 128 groups (block-FP8 weights' activations): bit for bit RmsNorm / FusedAddRmsNorm +
// QuantizeActivations(kDynamicGroup128); widths of one partial group (8, 72), 2,048 (one vector a
// thread), 7,168 (DeepSeek-V3: 3.5), 10,944 (a partial last group) and 16,384.
TEST(Fp8FusedQuantCudaTest, RmsNormGroupQuantMatchesNormThenQuantize) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 1);
  for (bool add : {false, true}) {
    for (int64_t m : {1, 3, 17}) {
      for (int64_t hidden : {8, 72, 2048, 7168, 10944, 16384}) {
        CheckNorm(rng, m, hidden, add, /*group128=*/true);
      }
    }
  }
}

// Group-major scales (Fp8TokenCodes::group_major_ld, QuantizeActivations' group_major_ld: the
// block GEMM's layout, here with ld past m): the fused norm and QuantizeActivations write the
// token-major run's codes and, at [g * ld + row], its scales; the padding entries [m, ld) of each
// group are left as they were. (QuantizeActivations' scalar form, for k % 8 != 0: the
// scalar-row case in fp8_cuda_test.)
void CheckGroupMajor(std::mt19937& rng, int64_t m, int64_t hidden, bool add) {
  SCOPED_TRACE(::testing::Message()
               << "group-major m=" << m << " hidden=" << hidden << (add ? " add" : ""));
  const int64_t groups = (hidden + 127) / 128, ld = m + 3;
  const std::vector<bf16> x = RandomRows(rng, m, hidden, 1.0f, m > 2 ? 1 : -1);
  const std::vector<bf16> res = RandomRows(rng, m, hidden, 2.0f, -1);
  const std::vector<bf16> weight = RandomRows(rng, 1, hidden, 0.5f, -1);
  DeviceBuffer<bf16> dw(weight), dx(x), dres(res), dx2(x), dres2(res), dout(m * hidden),
      dout2(m * hidden);
  DeviceBuffer<uint8_t> codes(m * hidden), codes2(m * hidden), codes3(m * hidden);
  DeviceBuffer<float> token(m * groups);
  const std::vector<float> sentinel(groups * ld, -7.0f);
  DeviceBuffer<float> major(sentinel), major2(sentinel);
  ASSERT_TRUE(RmsNormQuantFp8(dx.get(), add ? dres.get() : nullptr, dw.get(), m, hidden, kEps,
                              dout.get(), {codes.get(), token.get(), true}, nullptr)
                  .ok());
  ASSERT_TRUE(RmsNormQuantFp8(dx2.get(), add ? dres2.get() : nullptr, dw.get(), m, hidden, kEps,
                              dout2.get(), {codes2.get(), major.get(), true, ld}, nullptr)
                  .ok());
  ASSERT_TRUE(QuantizeActivations(dout.get(), m, hidden, Fp8ActivationScheme::kDynamicGroup128,
                                  0.0f, codes3.get(), major2.get(), nullptr, false, ld)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> c1 = codes.ToHost();
  EXPECT_TRUE(codes2.ToHost() == c1) << "fused norm codes";
  EXPECT_TRUE(codes3.ToHost() == c1) << "QuantizeActivations codes";
  const std::vector<float> t = token.ToHost();
  for (const auto& [buf, what] :
       {std::pair{&major, "fused norm"}, std::pair{&major2, "quantize"}}) {
    const std::vector<float> got = buf->ToHost();
    int64_t diffs = 0;
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t i = 0; i < ld; ++i) {
        const float want = i < m ? t[i * groups + g] : -7.0f;
        diffs += got[Fp8GroupScaleIndex(i, g, groups, ld)] != want;
      }
    }
    EXPECT_EQ(diffs, 0) << what << " group-major scales";
  }
}

TEST(Fp8FusedQuantCudaTest, GroupMajorScalesAreTheTokenMajorOnesTransposed) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 2);
  for (bool add : {false, true}) {
    for (int64_t m : {1, 17, 40}) {
      for (int64_t hidden : {72, 2048, 7168, 10944}) CheckGroupMajor(rng, m, hidden, add);
    }
  }
  // Refused: group-major without groups, an ld below m.
  DeviceBuffer<bf16> a(4 * 256), w(256);
  DeviceBuffer<uint8_t> codes(4 * 256);
  DeviceBuffer<float> scales(64);
  EXPECT_TRUE(
      absl::IsInvalidArgument(RmsNormQuantFp8(a.get(), nullptr, w.get(), 4, 256, kEps, a.get(),
                                              {codes.get(), scales.get(), false, 4}, nullptr)));
  EXPECT_TRUE(
      absl::IsInvalidArgument(RmsNormQuantFp8(a.get(), nullptr, w.get(), 4, 256, kEps, a.get(),
                                              {codes.get(), scales.get(), true, 3}, nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      QuantizeActivations(a.get(), 4, 256, Fp8ActivationScheme::kDynamicToken, 0.0f, codes.get(),
                          scales.get(), nullptr, false, 4)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      QuantizeActivations(a.get(), 4, 256, Fp8ActivationScheme::kDynamicGroup128, 0.0f, codes.get(),
                          scales.get(), nullptr, false, 3)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SiluAndMulQuantFp8(a.get(), 1, 64, nullptr, {codes.get(), scales.get(), false, 1}, nullptr)));
}

TEST(Fp8FusedQuantCudaTest, SiluAndMulQuantMatchesSiluThenQuantize) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (int64_t m : {1, 3, 17}) {
    for (int64_t inter : {8, 344, 2056, 14336}) CheckSilu(rng, m, inter, inter != 344);
  }
}

TEST(Fp8FusedQuantCudaTest, Refusals) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> a(2 * 16392), w(16392);
  DeviceBuffer<uint8_t> codes(2 * 16392);
  DeviceBuffer<float> scales(2);
  const Fp8TokenCodes q{codes.get(), scales.get()};
  EXPECT_TRUE(absl::IsInvalidArgument(
      RmsNormQuantFp8(a.get(), nullptr, w.get(), 1, 16392, kEps, a.get(), q, nullptr)));  // wide
  EXPECT_TRUE(absl::IsInvalidArgument(
      RmsNormQuantFp8(a.get(), nullptr, w.get(), 1, 100, kEps, a.get(), q, nullptr)));  // % 8
  EXPECT_TRUE(absl::IsInvalidArgument(RmsNormQuantFp8(a.get(), nullptr, w.get(), 1, 64, kEps,
                                                      a.get(), {codes.get(), nullptr}, nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SiluAndMulQuantFp8(a.get() + 1, 1, 64, nullptr, q, nullptr)));  // unaligned
  EXPECT_TRUE(absl::IsInvalidArgument(SiluAndMulQuantFp8(a.get(), -1, 64, nullptr, q, nullptr)));
  EXPECT_TRUE(SiluAndMulQuantFp8(a.get(), 0, 64, nullptr, q, nullptr).ok());  // nothing to do
  EXPECT_TRUE(absl::IsInvalidArgument(SiluAndMulQuantFp8(
      a.get(), 1, 64, nullptr, {codes.get(), scales.get(), /*group128=*/true}, nullptr)));
  EXPECT_FALSE(Fp8FusedQuantSupported(16392));
  EXPECT_TRUE(Fp8FusedQuantSupported(14336));
}

}  // namespace
}  // namespace tandem::kernels::cuda
