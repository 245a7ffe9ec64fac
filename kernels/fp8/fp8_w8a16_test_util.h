// Shared setup and CPU-reference checks of the batch-1 weight-only FP8 GEMV's GPU tests
// (fp8_w8a16_gemv_plain_cuda_test, _ring_, _latency_; testonly, CUDA builds): random e4m3
// weights with per-tensor / per-channel / grouped scales on host and device, the kernel run once
// into a NaN-filled output, the check against cpu::Fp8Linear (kNone) with the inner loop's
// tolerance, and the plain / fold / grouped shape sweeps every Fp8W16Math form runs.
#ifndef TANDEM_KERNELS_FP8_FP8_W8A16_TEST_UTIL_H_
#define TANDEM_KERNELS_FP8_FP8_W8A16_TEST_UTIL_H_

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"

namespace tandem::kernels::cuda::fp8_w16_test {

inline constexpr float kEps = 1e-5f;

// The three shared-memory ring inner loops.
inline constexpr Fp8W16Math kRings[] = {Fp8W16Math::kRing, Fp8W16Math::kRing2,
                                        Fp8W16Math::kRingHalf};

// n scales 2^U(-10, -4); per_tensor: n copies of the first.
std::vector<float> RandomScales(std::mt19937& rng, int64_t n, bool per_tensor);

// Random codes for a large weight: a fresh random block of 2^20 - 3 codes repeated (rows of any
// k start at different offsets in it), a fraction of the time per-code draws take at 0.5 G codes.
std::vector<uint8_t> TiledE4m3Codes(std::mt19937& rng, int64_t count);

// The host side of a weight: what the reference multiplies.
struct HostWeight {
  const uint8_t* codes;
  const float* scales;
  Fp8ScaleGrid grid;
};

// A random e4m3 weight with per-channel or per-tensor (n copies) scales, or (grouped) a random
// scale per row and 128-column group, host and device.
struct Weight {
  Weight(std::mt19937& rng, int64_t n, int64_t k, bool per_tensor, bool tiled = false,
         bool grouped = false);
  Fp8DeviceWeight device() const { return {d_codes.get(), d_scales.get(), grid}; }
  HostWeight host() const { return {codes.data(), scales.data(), grid}; }

  Fp8ScaleGrid grid;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  cuda_test::DeviceBuffer<uint8_t> d_codes;
  cuda_test::DeviceBuffer<float> d_scales;
};

// Checks got (one row of n outputs) against cpu::Fp8Linear (weight-only) on the activations x
// [k]: fp32 summation error plus the output rounding (bf16_out). The f16 forms (kTensorCore, the
// rings): the same fp32 bound (products of f16 are exact in fp32; the tensor core adds 16 at a
// step, k / 128 steps a warp, far inside 4e-6 sqrt(k)) plus the activations' f16 rounding below
// 2^-14 (<= 2^-25 each, times |w|).
void ExpectNearReference(const HostWeight& w, const std::vector<float>& x,
                         const __nv_bfloat16* bias, const std::vector<float>& got, bool bf16_out,
                         Fp8W16Math math);

// Fp8W16Gemv<TOut> (m = 1, PDL launch) of x [k] into a NaN-filled [n] output, synchronized, on
// the host. TOut: float or __nv_bfloat16.
template <typename TOut>
std::vector<TOut> RunPlain(const __nv_bfloat16* x, const Weight& w, const __nv_bfloat16* bias,
                           bool early, Fp8W16Math math, const Fp8W16SplitKWorkspace* ws = nullptr);

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The plain kernel, fp32 and bf16 out, early loads on and off, against the reference.
void CheckPlain(std::mt19937& rng, int64_t n, int64_t k, bool per_tensor, bool with_bias,
                Fp8W16Math math, bool grouped = false, const Fp8W16SplitKWorkspace* ws = nullptr);

// CheckPlain at n = 77 / 130 / 9000, k = 16 / 272 / 1040 / 4096 / 4112 / 14336.
void CheckPlainShapes(Fp8W16Math math, const Fp8W16SplitKWorkspace* ws = nullptr);

// The folded forms (NormIn, NormInSiluMul, AddTo) bit for bit against the unfolded kernels, and
// through them the reference.
void CheckFolds(std::mt19937& rng, int64_t n, int64_t k, bool with_bias, bool early,
                Fp8W16Math math, bool grouped = false, const Fp8W16SplitKWorkspace* ws = nullptr);

// CheckFolds at hidden sizes 272 .. 12272 (Llama-3-8B's / 70B's, the largest NormIn k).
void CheckFoldShapes(Fp8W16Math math, const Fp8W16SplitKWorkspace* ws = nullptr);

// Grouped weights: a random scale per row and 128-column group (never equal across groups).
// k = 144 / 272 / 1040 / 10944 end in a partial group (16 / 16 / 16 / 64 columns); 2048 / 7168
// are Qwen3-30B-A3B's / DeepSeek-V3's hidden sizes, 1408 / 10944 DeepSeek-V2-Lite's expert /
// dense intermediate sizes; k = 128 is one group (the per-channel kernels).
void CheckGroupedShapes(Fp8W16Math math, const Fp8W16SplitKWorkspace* ws = nullptr);

}  // namespace tandem::kernels::cuda::fp8_w16_test

#endif  // TANDEM_KERNELS_FP8_FP8_W8A16_TEST_UTIL_H_
