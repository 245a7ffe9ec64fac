// The CPU-reference check shared by the FP8 GEMM GPU tests (fp8_gemm_cuda_test.cc): one
// CublasLtFp8Gemm call (or one Fp8BlockGemmWgmma form) on random e4m3 codes and scales against
// cpu::Fp8Linear, with a tolerance modelling Hopper's FP8 MMA (fp8_gemm_cuda_test.cc's header:
// a few 2^-13 of each 32-product instruction's largest magnitude, promoted to fp32 every 128).
#ifndef TANDEM_KERNELS_FP8_FP8_GEMM_TEST_UTIL_H_
#define TANDEM_KERNELS_FP8_FP8_GEMM_TEST_UTIL_H_

#include <cuda_bf16.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/fp8/fp8_block_gemm_cuda.h"
#include "kernels/fp8/fp8_gemm_cuda.h"

namespace tandem::kernels::cuda::fp8_gemm_test {

inline constexpr int64_t kMmaK = 32;         // e4m3 products per Hopper MMA instruction
inline constexpr int64_t kPromoteK = 128;    // fp32 promotion interval assumed for partial sums
inline constexpr double kMmaRel = 0x1p-11;   // 4 x 2^-13 per instruction's largest magnitude
inline constexpr double kRoundRel = 0x1p-8;  // one bf16 rounding (2^-9) with a factor 2 of margin

std::vector<__nv_bfloat16> RandomBf16(std::mt19937& rng, int64_t count, float stddev);

// Random e4m3 codes over the whole range (no NaN): products spanning many binades.
std::vector<uint8_t> RandomCodes(std::mt19937& rng, int64_t count);

// The bound on |got - want| for one output from the exact products p[c] = a[c] * w[c]: fp32
// summation, the MMA's per-instruction alignment, bf16 rounding.
struct ErrorModel {
  double mag = 0;      // Sigma |p|
  double mma_mag = 0;  // Sigma over instructions of max(|p in it|, |partial sum so far|)
};
ErrorModel ModelFor(const float* a, const float* w, int64_t k);

enum class Scaling { kTensor, kTokenChannel, kBlock };
const char* Name(Scaling s);

// One CublasLtFp8Gemm call against cpu::Fp8Linear: a random weight with random scales of the
// scaling's grid (per-tensor; per-channel; 128 x 128 blocks) and bf16 activations quantized
// as the scaling's scheme says (static; per token; 1 x 128 groups), rows of different
// magnitudes and one zero row. Returns the largest |error| / (2^-13 * mma_mag) seen (failures
// are gtest failures). With `wgmma_form` (block scaling only), Fp8BlockGemmWgmma runs that form
// instead of `gemm`.
double CheckGemm(std::mt19937& rng, CublasLtFp8Gemm& gemm, Scaling scaling, int64_t m, int64_t n,
                 int64_t k, bool with_bias, const Fp8BlockWgmmaForm* wgmma_form = nullptr);

}  // namespace tandem::kernels::cuda::fp8_gemm_test

#endif  // TANDEM_KERNELS_FP8_FP8_GEMM_TEST_UTIL_H_
