// The FP8 experts' fused activation passes (moe_fp8_cuda.h) bit for bit against the two kernels
// each replaces, on random bf16 inputs (rows of zeros, a row with one huge value, values past a
// static scale's range included):
//   * MoeSiluAndMulQuantFp8 == MoeSiluAndMul then QuantizeActivations of its bf16 output: act,
//     codes and scales, every FP8 scheme (1 x 128 groups, per token, static), widths a multiple of
//     128 (Qwen3-30B-A3B's 768, Mixtral's 14336), of 8 only (136: a partial last group) and of
//     neither (100: the two-kernel fallback), act written or not; per token, rows held in
//     registers (up to 2,048: 768, 136, 2,048) and wider ones in two passes (2,056, 14,336);
//   * MoeGatherFp8Rows of x quantized once == QuantizeActivations of the gathered bf16 rows
//     (MoeGatherRows): codes and scales, every scheme, rows repeated and skipped.
// And the refusals (also without a GPU).
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_fp8_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;
using Scheme = Fp8ActivationScheme;

constexpr Scheme kSchemes[] = {Scheme::kDynamicGroup128, Scheme::kDynamicToken,
                               Scheme::kStaticTensor};
constexpr float kStaticScale = 3.0f / 448;  // |x| past 3 saturates

// Random bf16 [rows, cols] ~ N(0, 2); row 1 all zeros, row 2 one value of 900 (if they exist).
std::vector<bf16> RandomRows(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<bf16> v(rows * cols);
  for (bf16& x : v) x = __float2bfloat16(d(rng));
  if (rows > 1) std::fill_n(v.begin() + cols, cols, __float2bfloat16(0.0f));
  if (rows > 2) v[2 * cols + cols / 3] = __float2bfloat16(900.0f);
  return v;
}

template <typename T>
void ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++differ;
    }
  }
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << got.size() << " differ, first at "
                       << first;
}

class MoeFp8ActTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

TEST_F(MoeFp8ActTest, SiluAndMulQuantEqualsTheTwoKernels) {
  std::mt19937 rng(cuda_test::TestSeed());
  for (const int64_t inter : {768, 136, 100, 1408, 2048, 2056, 14336}) {
    for (const int64_t rows : {1, 37, 300}) {
      if (inter == 14336 && rows == 300) continue;  // enough rows at that width
      const std::vector<bf16> gu = RandomRows(rng, rows, 2 * inter);
      DeviceBuffer<bf16> d_gu(gu), act_want(rows * inter), act(rows * inter);
      DeviceBuffer<uint8_t> codes_want(rows * inter), codes(rows * inter);
      const int64_t n_scales = rows * ((inter + 127) / 128);
      for (const Scheme scheme : kSchemes) {
        for (const bool with_act : {true, false}) {
          if (!with_act && inter % 8 != 0) continue;  // the fallback needs act
          SCOPED_TRACE(::testing::Message() << "inter " << inter << " rows " << rows << " scheme "
                                            << static_cast<int>(scheme) << " act " << with_act);
          DeviceBuffer<float> scales_want(std::vector<float>(n_scales, -1.0f));
          DeviceBuffer<float> scales(std::vector<float>(n_scales, -1.0f));
          ASSERT_TRUE(MoeSiluAndMul<bf16>(d_gu.get(), rows, inter, act_want.get(), nullptr).ok());
          ASSERT_TRUE(QuantizeActivations(act_want.get(), rows, inter, scheme, kStaticScale,
                                          codes_want.get(), scales_want.get(), nullptr)
                          .ok());
          ASSERT_EQ(cudaMemset(act.get(), 0xff, rows * inter * sizeof(bf16)), cudaSuccess);
          ASSERT_TRUE(MoeSiluAndMulQuantFp8(d_gu.get(), rows, inter, scheme, kStaticScale,
                                            with_act ? act.get() : nullptr, codes.get(),
                                            scales.get(), nullptr)
                          .ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ExpectSameBits(codes.ToHost(), codes_want.ToHost(), "codes");
          ExpectSameBits(scales.ToHost(), scales_want.ToHost(), "scales");
          if (with_act) ExpectSameBits(act.ToHost(), act_want.ToHost(), "act");
        }
      }
    }
  }
}

TEST_F(MoeFp8ActTest, GatherOfQuantizedRowsEqualsQuantizingTheGatheredRows) {
  std::mt19937 rng(cuda_test::TestSeed() + 1);
  for (const int64_t k : {2048, 7168, 400}) {
    const int64_t T = 53, rows = 2 * T + 7;
    const std::vector<bf16> x = RandomRows(rng, T, k);
    std::vector<int32_t> tor(rows);
    for (int32_t& t : tor) t = static_cast<int32_t>(rng() % (T - 3));  // the last 3 skipped
    tor[0] = 1;                                                        // the zero row
    tor[1] = 2;                                                        // the huge value
    DeviceBuffer<bf16> dx(x), gathered(rows * k);
    DeviceBuffer<int32_t> d_tor(tor);
    DeviceBuffer<uint8_t> x_codes(T * k), codes_want(rows * k), codes(rows * k);
    const int64_t groups = (k + 127) / 128;
    ASSERT_TRUE(MoeGatherRows<bf16>(dx.get(), k, d_tor.get(), rows, gathered.get(), nullptr).ok());
    for (const Scheme scheme : kSchemes) {
      SCOPED_TRACE(::testing::Message() << "k " << k << " scheme " << static_cast<int>(scheme));
      DeviceBuffer<float> x_scales(T * groups), scales_want(std::vector<float>(rows * groups, -1));
      DeviceBuffer<float> scales(std::vector<float>(rows * groups, -1));
      ASSERT_TRUE(QuantizeActivations(gathered.get(), rows, k, scheme, kStaticScale,
                                      codes_want.get(), scales_want.get(), nullptr)
                      .ok());
      ASSERT_TRUE(QuantizeActivations(dx.get(), T, k, scheme, kStaticScale, x_codes.get(),
                                      x_scales.get(), nullptr)
                      .ok());
      ASSERT_TRUE(MoeGatherFp8Rows(x_codes.get(), x_scales.get(), k, scheme, d_tor.get(), rows,
                                   codes.get(), scales.get(), nullptr)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ExpectSameBits(codes.ToHost(), codes_want.ToHost(), "codes");
      // kStaticTensor: the scale is x's scales[0] (the gather copies none).
      if (scheme != Scheme::kStaticTensor) {
        ExpectSameBits(scales.ToHost(), scales_want.ToHost(), "scales");
      } else {
        EXPECT_EQ(x_scales.ToHost()[0], kStaticScale);
      }
    }
  }
}

TEST(MoeFp8ActRefusals, RefusesWhatTheyCannotTake) {
  alignas(16) static uint8_t codes[256];
  alignas(16) static float scales[64];
  alignas(16) static bf16 rows[256];
  alignas(16) static int32_t tor[4];
  auto gather = [&](const uint8_t* c, int64_t k, Scheme s, int64_t n) {
    return MoeGatherFp8Rows(c, scales, k, s, tor, n, codes, scales, nullptr).code();
  };
  EXPECT_EQ(gather(codes, 100, Scheme::kDynamicToken, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gather(codes, 0, Scheme::kDynamicToken, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gather(codes, 128, Scheme::kNone, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gather(codes, 128, Scheme::kDynamicToken, -1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gather(codes + 8, 128, Scheme::kDynamicToken, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gather(nullptr, 128, Scheme::kDynamicToken, 2), absl::StatusCode::kInvalidArgument);
  auto silu = [&](int64_t inter, Scheme s, float scale, bf16* act) {
    return MoeSiluAndMulQuantFp8(rows, 2, inter, s, scale, act, codes, scales, nullptr).code();
  };
  EXPECT_EQ(silu(64, Scheme::kNone, 1.0f, rows), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(silu(64, Scheme::kStaticTensor, 0.0f, rows), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(silu(0, Scheme::kDynamicToken, 1.0f, rows), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(silu(60, Scheme::kDynamicToken, 1.0f, nullptr),  // the fallback needs act
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MoeSiluAndMulQuantFp8(rows, 2, 64, Scheme::kDynamicToken, 1.0f, rows, nullptr, scales,
                                  nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kernels::cuda
