// Random inputs of the FP8 GPU tests (testonly, CUDA builds): bf16 activations and e4m3 codes;
// the Hopper FP8 MMA tolerance of one output (CheckFp8MmaDot).
#ifndef TANDEM_KERNELS_FP8_FP8_CUDA_TEST_UTIL_H_
#define TANDEM_KERNELS_FP8_FP8_CUDA_TEST_UTIL_H_

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
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

// One output of a Hopper FP8 tensor-core GEMM with 1 x 128 / 128 x 128 scales (CUTLASS's
// blockwise kernels) against the fp64 dot product of the dequantized rows: each 32-product MMA
// instruction may lose a few 2^-13 of its largest magnitude, the sum is promoted to fp32 every
// 128 columns, and the output is one bf16 rounding.
struct Fp8MmaDot {
  double want = 0;   // the fp64 dot product
  double tol = 0;    // the allowed |got - want|
  double ratio = 0;  // (|got - want| - rounding) / (2^-13 x per-MMA magnitude)
  bool ok = false;   // |got - want| <= tol
};
inline Fp8MmaDot CheckFp8MmaDot(const float* a_row, const float* w_row, int64_t k, float got) {
  constexpr int64_t kMmaK = 32;         // e4m3 products per Hopper MMA instruction
  constexpr int64_t kPromoteK = 128;    // fp32 promotion interval
  constexpr double kMmaRel = 0x1p-11;   // 4 x 2^-13 per instruction's largest magnitude
  constexpr double kRoundRel = 0x1p-8;  // one bf16 rounding (2^-9) with a factor 2 of margin
  double want = 0, mag = 0, mma_mag = 0, partial = 0;
  for (int64_t c0 = 0; c0 < k; c0 += kMmaK) {
    if (c0 % kPromoteK == 0) partial = 0;
    double largest = std::fabs(partial);
    for (int64_t i = c0; i < std::min(c0 + kMmaK, k); ++i) {  // the last MMA partial at k % 32
      const double p = double(a_row[i]) * w_row[i];
      want += p;
      mag += std::fabs(p);
      largest = std::max(largest, std::fabs(p));
      partial += p;
    }
    mma_mag += largest;
  }
  const double err = std::fabs(double(got) - want);
  Fp8MmaDot d;
  d.want = want;
  d.tol =
      4e-6 * std::sqrt(double(k)) * mag + kMmaRel * mma_mag + kRoundRel * std::fabs(want) + 1e-30;
  d.ratio = (err - kRoundRel * std::fabs(want)) / (0x1p-13 * mma_mag + 1e-30);
  d.ok = err <= d.tol;
  return d;
}

}  // namespace tandem::kernels::cuda::fp8_test

#endif  // TANDEM_KERNELS_FP8_FP8_CUDA_TEST_UTIL_H_
