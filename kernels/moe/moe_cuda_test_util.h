// Helpers shared by the CUDA MoE kernel tests (moe_cuda_test.cc: routing and permutation;
// moe_cuda_layer_test.cc: the experts and the combine): random inputs, routing on the device, the
// permutation's device buffers, poisoned outputs.
#ifndef TANDEM_KERNELS_MOE_MOE_CUDA_TEST_UTIL_H_
#define TANDEM_KERNELS_MOE_MOE_CUDA_TEST_UTIL_H_

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_cuda.h"

namespace tandem::kernels::cuda::moe_cuda_test {

using cuda_test::DeviceBuffer;

inline std::vector<float> Normal(int64_t n, float sd, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Logits whose experts differ by >= 0.04 within a token (a shuffled ramp plus small noise), so
// fp32 rounding differences between CPU and GPU cannot reorder them.
inline std::vector<float> SpreadLogits(int64_t T, int64_t E, std::mt19937& rng) {
  std::vector<float> out(T * E);
  std::vector<int> order(E);
  std::uniform_real_distribution<float> noise(0.0f, 0.01f);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t e = 0; e < E; ++e) out[t * E + e] = -2.5f + 5.0f * order[e] / E + noise(rng);
  }
  return out;
}

struct DeviceRouting {
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> weights;
};

inline DeviceRouting RouteOnDevice(const std::vector<float>& logits, int64_t T,
                                   GroupedRoutingParams p, const std::vector<float>& bias) {
  DeviceBuffer<float> d_logits(logits), d_bias(bias);
  if (!bias.empty()) p.correction_bias = d_bias.get();
  DeviceRouting r{DeviceBuffer<int32_t>(T * p.top_k), DeviceBuffer<float>(T * p.top_k)};
  EXPECT_TRUE(MoeRoute(d_logits.get(), T, p, r.ids.get(), r.weights.get(), nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return r;
}

struct DevicePerm {
  DeviceBuffer<int32_t> offsets, active, token_of_row, row_of_pair;
  DeviceMoePermutation view() const {
    return {offsets.get(), active.get(), token_of_row.get(), row_of_pair.get()};
  }
};

inline DevicePerm MakePerm(int64_t E, int64_t rows) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(rows, 1));
  return {DeviceBuffer<int32_t>(E + 1), DeviceBuffer<int32_t>(E), DeviceBuffer<int32_t>(n),
          DeviceBuffer<int32_t>(n)};
}

// Fills a device buffer of n elements with the byte 0x7f (a huge value / id): outputs a kernel
// fails to write show.
template <typename T>
void Poison(const DeviceBuffer<T>& b) {
  if (b.size() > 0) {
    TANDEM_CUDA_CHECK(cudaMemset(b.get(), 0x7f, b.size() * sizeof(T)));
  }
}

}  // namespace tandem::kernels::cuda::moe_cuda_test

#endif  // TANDEM_KERNELS_MOE_MOE_CUDA_TEST_UTIL_H_
