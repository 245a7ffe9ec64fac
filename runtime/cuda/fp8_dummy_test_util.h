// Test helpers of the device dummy FP8 draws (cuda_moe_fp8_dummy_test, cuda_mla_fp8_dummy_test):
// device weights copied back into the loader's host form, and the comparison with the host's
// draw (RandomModelWeights quantized by QuantizeWeightsFp8). Test only.
#ifndef TANDEM_RUNTIME_CUDA_FP8_DUMMY_TEST_UTIL_H_
#define TANDEM_RUNTIME_CUDA_FP8_DUMMY_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cuda/cuda_fp8_linear.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda::testing {

// Device weight `w` copied back and appended to `all` (per-row scales: rows stacked).
inline void AppendCopy(const CudaFp8Weight& w, Fp8LinearWeight* all) {
  std::vector<uint8_t> codes(static_cast<size_t>(w.codes.bytes()));
  std::vector<float> scales(static_cast<size_t>(w.scales.bytes() / 4));
  EXPECT_EQ(cudaMemcpy(codes.data(), w.codes.data(), codes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(scales.data(), w.scales.data(), scales.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  all->codes.insert(all->codes.end(), codes.begin(), codes.end());
  all->scales.insert(all->scales.end(), scales.begin(), scales.end());
}

// One device weight copied back.
inline Fp8LinearWeight CopyBack(const CudaFp8Weight& w) {
  Fp8LinearWeight out;
  out.grid = w.grid;
  out.activation = w.activation;
  AppendCopy(w, &out);
  return out;
}

// The first `count` device weights of one shape copied back and stacked, as the loader holds
// stacked experts.
inline Fp8LinearWeight CopyBack(const std::vector<CudaFp8Weight>& weights, int64_t count) {
  Fp8LinearWeight all;
  all.grid = weights.front().grid;
  all.grid.rows *= count;
  all.activation = weights.front().activation;
  for (int64_t e = 0; e < count; ++e) AppendCopy(weights[static_cast<size_t>(e)], &all);
  return all;
}

// Device codes within one e4m3 step of the host's, at most 0.1% of them off (the device's
// double-precision log / cos may move a drawn fp32 value by one ulp), scales within 1e-6.
inline void ExpectSameDraw(const Fp8LinearWeight& got, const Fp8LinearWeight& want,
                           const std::string& what) {
  ASSERT_EQ(got.grid.rows, want.grid.rows) << what;
  ASSERT_EQ(got.grid.cols, want.grid.cols) << what;
  ASSERT_EQ(got.grid.block_cols, want.grid.block_cols) << what;
  EXPECT_EQ(got.activation, want.activation) << what;
  ASSERT_EQ(got.codes.size(), want.codes.size()) << what;
  ASSERT_EQ(got.scales.size(), want.scales.size()) << what;
  int64_t differ = 0;
  for (size_t i = 0; i < got.codes.size(); ++i) {
    ASSERT_LE(std::abs(int{got.codes[i]} - int{want.codes[i]}), 1) << what << " code " << i;
    differ += got.codes[i] != want.codes[i];
  }
  EXPECT_LE(differ, static_cast<int64_t>(got.codes.size()) / 1000) << what;
  for (size_t i = 0; i < got.scales.size(); ++i) {
    ASSERT_GT(want.scales[i], 0.0f) << what;
    ASSERT_NEAR(got.scales[i], want.scales[i], 1e-6 * want.scales[i]) << what << " scale " << i;
  }
  std::printf("  %-28s %zu codes (%lld one step off), %zu scales equal\n", what.c_str(),
              got.codes.size(), static_cast<long long>(differ), got.scales.size());
}

}  // namespace tandem::runtime::cuda::testing

#endif  // TANDEM_RUNTIME_CUDA_FP8_DUMMY_TEST_UTIL_H_
