// MoeCombineAddTo (kernels/moe/moe_cuda.h) against the combine it mirrors followed by the
// residual add on the host, bit for bit (GPU; skips without one).
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using moe_cuda_test::Normal;

// MoeCombineAddTo (split and not) against the combine it mirrors (MoeCombineSplit / MoeCombine
// into a buffer) followed by the residual update on the host, round_T(residual + combined):
// bit for bit, the gated shared expert included; x untouched.
template <typename T>
void CheckCombineAddTo(int64_t tokens, int64_t k, int64_t H, bool shared, bool gated,
                       std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << "add-to T " << tokens << " k " << k << " H " << H
                                    << " shared " << shared << " gated " << gated);
  const int64_t rows = tokens * k + 3;
  DeviceBuffer<T> eout(cuda_test::Convert<T>(Normal(rows * H, 1.0f, rng)));
  DeviceBuffer<float> weights(Normal(tokens * k, 0.5f, rng));
  std::vector<int32_t> row_map(tokens * k);
  for (int32_t& r : row_map) {
    r = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(rows - 1))(rng);
  }
  DeviceBuffer<int32_t> drows(row_map);
  const std::vector<T> x = cuda_test::Convert<T>(Normal(tokens * H, 1.0f, rng));
  const std::vector<T> residual = cuda_test::Convert<T>(Normal(tokens * H, 4.0f, rng));
  DeviceBuffer<T> dshared(cuda_test::Convert<T>(Normal(tokens * H, 1.0f, rng)));
  DeviceBuffer<T> dgate(cuda_test::Convert<T>(Normal(H, 0.1f, rng)));
  const T* sh = shared ? dshared.get() : nullptr;
  const T* g = gated ? dgate.get() : nullptr;
  for (bool split : {false, true}) {
    DeviceBuffer<T> dx(x), out(tokens * H), dres(residual);
    const absl::Status st = split
                                ? MoeCombineSplit<T>(eout.get(), weights.get(), drows.get(), tokens,
                                                     k, H, sh, g, dx.get(), out.get(), nullptr)
                                : MoeCombine<T>(eout.get(), weights.get(), drows.get(), tokens, k,
                                                H, sh, g, dx.get(), out.get(), nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_TRUE(MoeCombineAddTo<T>(eout.get(), weights.get(), drows.get(), tokens, k, H, sh, g,
                                   dx.get(), dres.get(), split, nullptr, false)
                    .ok());
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<T> combined = out.ToHost(), got = dres.ToHost();
    for (int64_t i = 0; i < tokens * H; ++i) {
      const T want = cuda_test::FromF<T>(cuda_test::ToF(residual[i]) + cuda_test::ToF(combined[i]));
      ASSERT_EQ(cuda_test::ToF(got[i]), cuda_test::ToF(want))
          << "split " << split << " element " << i;
    }
    const std::vector<T> x_after = dx.ToHost();
    ASSERT_EQ(std::memcmp(x_after.data(), x.data(), x.size() * sizeof(T)), 0);
  }
  DeviceBuffer<T> dx(x);  // x overlapping the residual: refused
  EXPECT_FALSE(MoeCombineAddTo<T>(eout.get(), weights.get(), drows.get(), tokens, k, H, sh, g,
                                  dx.get(), dx.get(), true, nullptr, false)
                   .ok());
}

TEST(MoeCudaTest, CombineAddToMatchesCombineThenResidualAdd) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  CheckCombineAddTo<__nv_bfloat16>(1, 8, 2048, false, false, rng);  // Qwen3-30B-A3B decode
  CheckCombineAddTo<__nv_bfloat16>(33, 2, 4096, true, false, rng);
  CheckCombineAddTo<__half>(5, 20, 520, true, true, rng);  // k > 16, gated shared expert
  CheckCombineAddTo<__half>(7, 4, 72, true, true, rng);
  CheckCombineAddTo<__nv_bfloat16>(9, 1, 37, true, false, rng);  // element loads
}

}  // namespace
}  // namespace tandem::kernels::cuda
