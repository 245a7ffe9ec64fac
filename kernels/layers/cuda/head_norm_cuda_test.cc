// QkHeadRmsNorm against the CPU RmsNorm (kernels/layers/norm.h) run head by head on the same
// bf16/fp16-rounded inputs: within one rounding to T of the fp32 result; v heads untouched.
#include "kernels/layers/cuda/head_norm_cuda.h"

#include <cmath>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/layers/norm.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

template <typename T>
void CheckHeadNorm(int64_t tokens, int64_t hq, int64_t hk, int64_t d, std::mt19937& rng) {
  const int64_t stride = (hq + 2 * hk) * d + 8;  // padded rows: the stride is honoured
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> qkv(tokens * stride), qw(d), kw(d);
  for (float& v : qkv) v = normal(rng);
  for (float& v : qw) v = 1.0f + 0.1f * normal(rng);
  for (float& v : kw) v = 1.0f + 0.1f * normal(rng);
  cuda_test::RoundTo<T>(qkv);
  cuda_test::RoundTo<T>(qw);
  cuda_test::RoundTo<T>(kw);
  DeviceBuffer<T> dqkv(cuda_test::Convert<T>(qkv)), dq(cuda_test::Convert<T>(qw)),
      dk(cuda_test::Convert<T>(kw));
  ASSERT_TRUE(
      QkHeadRmsNorm<T>(dqkv.get(), stride, tokens, hq, hk, d, dq.get(), dk.get(), 1e-6f, nullptr)
          .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = cuda_test::ToFloat(dqkv.ToHost());
  const double tol = std::is_same_v<T, __half> ? 1.0 / 1024 : 1.0 / 128;
  std::vector<float> want(d);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < hq + 2 * hk; ++h) {
      const float* x = qkv.data() + t * stride + h * d;
      if (h < hq + hk) {
        cpu::RmsNorm(x, h < hq ? qw.data() : kw.data(), 1, d, 1e-6f, want.data());
      } else {
        want.assign(x, x + d);  // v: untouched, bit for bit
      }
      for (int64_t i = 0; i < d; ++i) {
        const float g = got[t * stride + h * d + i];
        const double limit = h < hq + hk ? tol * (std::abs(want[i]) + 1e-3) : 0.0;
        ASSERT_LE(std::abs(double{g} - want[i]), limit)
            << "token " << t << " head " << h << " dim " << i << " (d " << d << ")";
      }
    }
  }
}

TEST(QkHeadRmsNormTest, MatchesCpuPerHead) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  CheckHeadNorm<__nv_bfloat16>(7, 4, 2, 128, rng);
  CheckHeadNorm<__nv_bfloat16>(3, 8, 1, 64, rng);
  CheckHeadNorm<__half>(5, 4, 4, 16, rng);
  CheckHeadNorm<__half>(1, 2, 1, 256, rng);
}

TEST(QkHeadRmsNormTest, RefusesBadShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<__half> x(64), w(16);
  EXPECT_FALSE(QkHeadRmsNorm<__half>(x.get(), 32, 1, 2, 1, 16, w.get(), w.get(), 1e-6f, nullptr)
                   .ok());  // row shorter than 3 heads of 16
  EXPECT_FALSE(
      QkHeadRmsNorm<__half>(x.get(), 64, 1, 1, 1, 0, w.get(), w.get(), 1e-6f, nullptr).ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
