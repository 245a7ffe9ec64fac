// Random inputs of the FP8 GPU tests (testonly, CUDA builds): bf16 activations and e4m3 codes.
#ifndef TANDEM_KERNELS_FP8_FP8_CUDA_TEST_UTIL_H_
#define TANDEM_KERNELS_FP8_FP8_CUDA_TEST_UTIL_H_

#include <cuda_bf16.h>

#include <cstdint>
#include <random>
#include <vector>

namespace tandem::kernels::cuda::fp8_test {

// `count` bf16 values drawn from N(0, stddev).
inline std::vector<__nv_bfloat16> RandomBf16(std::mt19937& rng, int64_t count, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<__nv_bfloat16> v(count);
  for (__nv_bfloat16& x : v) x = __float2bfloat16_rn(dist(rng));
  return v;
}

// `count` e4m3 codes uniform over the 254 finite ones (products spanning many binades).
inline std::vector<uint8_t> RandomE4m3Codes(std::mt19937& rng, int64_t count) {
  std::vector<uint8_t> codes(count);
  for (uint8_t& code : codes) {
    do {
      code = static_cast<uint8_t>(rng() & 0xFF);
    } while ((code & 0x7F) == 0x7F);  // no NaN
  }
  return codes;
}

}  // namespace tandem::kernels::cuda::fp8_test

#endif  // TANDEM_KERNELS_FP8_FP8_CUDA_TEST_UTIL_H_
