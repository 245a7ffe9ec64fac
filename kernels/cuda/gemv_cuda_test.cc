// SmallMLinear against an fp64 reference on fresh random inputs (GPU; skips without one).
#include "kernels/cuda/gemv_cuda.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using bf16 = __nv_bfloat16;

using cuda_test::TestSeed;

template <typename TOut>
double RelOut() {
  if constexpr (std::is_same_v<TOut, float>) return 0x1p-23;
  if constexpr (std::is_same_v<TOut, bf16>) return 0x1p-8;
  return 0x1p-11;
}

template <typename T, typename TOut>
void RunCase(std::mt19937& rng, int64_t m, int64_t n, int64_t k, bool with_bias) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << m << " n=" << n << " k=" << k << " bias=" << with_bias);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // Inputs rounded to T first, so the reference sees exactly what the kernel reads.
  auto make = [&](int64_t count) {
    std::vector<T> v(count);
    for (T& x : v) x = cuda_test::FromF<T>(dist(rng));
    return v;
  };
  const std::vector<T> a = make(m * k), w = make(n * k), bias = make(n);
  DeviceBuffer<T> da(a), dw(w), db(bias);
  DeviceBuffer<TOut> dout(m * n);
  const absl::Status st = SmallMLinear<T, TOut>(da.get(), dw.get(), with_bias ? db.get() : nullptr,
                                                m, n, k, dout.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<TOut> got = dout.ToHost();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = with_bias ? cuda_test::ToF(bias[j]) : 0.0, mag = std::fabs(want);
      for (int64_t p = 0; p < k; ++p) {
        const double prod = double{cuda_test::ToF(a[i * k + p])} * cuda_test::ToF(w[j * k + p]);
        want += prod;
        mag += std::fabs(prod);
      }
      const double tol = RelOut<TOut>() * std::fabs(want) + (k + 2) * 0x1p-24 * mag;
      const double g = cuda_test::ToF(got[i * n + j]);
      ASSERT_LE(std::fabs(g - want), tol)
          << "out[" << i << ", " << j << "] = " << g << ", want " << want;
    }
  }
}

TEST(GemvCudaTest, MatchesFp64Reference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t m : {1, 2, 3, 4, 5, 8}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 8},
                        {7, 72},
                        {1000, 264},
                        {333, 4096},
                        {64, 14336},
                        {4104, 1032}}) {
      for (bool bias : {false, true}) {
        RunCase<bf16, bf16>(rng, m, n, k, bias);
        RunCase<bf16, float>(rng, m, n, k, bias);
        RunCase<__half, __half>(rng, m, n, k, bias);
        RunCase<__half, float>(rng, m, n, k, bias);
      }
    }
  }
}

TEST(GemvCudaTest, RejectsUnsupportedArguments) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> a(64), w(64);
  DeviceBuffer<bf16> out(64);
  EXPECT_FALSE(SmallMLinearSupported(a.get(), w.get(), 0, 8, 8));
  EXPECT_FALSE(SmallMLinearSupported(a.get(), w.get(), kGemvMaxM + 1, 1, 8));
  EXPECT_FALSE(SmallMLinearSupported(a.get(), w.get(), 1, 1, 12));     // k not a multiple of 8
  EXPECT_FALSE(SmallMLinearSupported(a.get() + 1, w.get(), 1, 1, 8));  // a not 16-byte aligned
  EXPECT_TRUE(SmallMLinearSupported(a.get(), w.get(), 2, 4, 16));
  const absl::Status st =
      SmallMLinear<bf16, bf16>(a.get(), w.get(), nullptr, 1, 1, 12, out.get(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ((SmallMLinear<bf16, bf16>(a.get(), w.get(), nullptr, 1, 1, 8, nullptr, nullptr)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kernels::cuda
