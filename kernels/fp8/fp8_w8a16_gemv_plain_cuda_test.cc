// The batch-1 weight-only FP8 GEMV (fp8_w8a16_gemv_cuda.h), its plain and folded forms on the
// two register inner loops (Fp8W16Math: fp32 fmaf, tensor-core mma), against the CPU reference
// cpu::Fp8Linear with Fp8ActivationScheme::kNone on fresh random codes, scales and activations:
// n = 77 / 130 / 9000 (a block's warps partly idle), k = 16 / 272 / 1040 / 4096 / 4112 / 14336
// (a lane with no chunk, partial batches of loads, k not a multiple of 128), per-tensor and
// per-channel scales, bias on / off, bf16 and fp32 out, the first loads before or after the PDL
// wait (same bits); the folded forms bit for bit against the unfolded kernels (RmsNorm<bf16>,
// SiluAndMul<bf16>, the residual add) and through them against the reference; kAuto's pick;
// grouped weights (a random scale per row and 128-column group) on both inner loops, k = 144 ..
// 10944 with partial last groups, and their folds; refusals (GPU; skips without one). The ring
// forms: fp8_w8a16_gemv_ring_cuda_test; deep, split-k, persistent:
// fp8_w8a16_gemv_latency_cuda_test; the shared checks: fp8_w8a16_test_util.h.
#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;
using fp8_test::RandomBf16;
using fp8_w16_test::CheckFolds;
using fp8_w16_test::CheckFoldShapes;
using fp8_w16_test::CheckGroupedShapes;
using fp8_w16_test::CheckPlainShapes;
using fp8_w16_test::kEps;
using fp8_w16_test::RunPlain;
using fp8_w16_test::SameBits;
using fp8_w16_test::Weight;

TEST(Fp8W16GemvCudaTest, MatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kFp32Fma);
}

// kTensorCore: n = 77 / 130 leave a block's last rows past n, k = 16 / 272 / 1040 / 4112 end in
// a partial 64-column group, k = 272 gives warps 5..7 no group.
TEST(Fp8W16GemvCudaTest, TensorCoreMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kTensorCore);
}

TEST(Fp8W16GemvCudaTest, FoldsEqualTheUnfoldedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckFoldShapes(Fp8W16Math::kFp32Fma);
}

TEST(Fp8W16GemvCudaTest, TensorCoreFoldsEqualTheUnfoldedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckFoldShapes(Fp8W16Math::kTensorCore);
}

// kAuto: the tensor-core bits while the f16 staging fits 48 KiB (k <= 24,576), else fp32's.
TEST(Fp8W16GemvCudaTest, AutoPicksByTheStagingSize) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 5);
  for (const int64_t k : {int64_t{1040}, int64_t{24576}, int64_t{24592}}) {
    SCOPED_TRACE(::testing::Message() << "k=" << k);
    const Weight w(rng, 33, k, false);
    const std::vector<bf16> x = RandomBf16(rng, k, 2.0f);
    DeviceBuffer<bf16> dx(x);
    const Fp8W16Math want =
        2 * k <= kFp8W16AutoMaxStagingBytes ? Fp8W16Math::kTensorCore : Fp8W16Math::kFp32Fma;
    EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kAuto),
                         RunPlain<float>(dx.get(), w, nullptr, true, want)));
  }
}

TEST(Fp8W16GemvCudaTest, GroupedMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckGroupedShapes(Fp8W16Math::kFp32Fma);
}

TEST(Fp8W16GemvCudaTest, GroupedTensorCoreMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckGroupedShapes(Fp8W16Math::kTensorCore);
}

TEST(Fp8W16GemvCudaTest, GroupedFoldsEqualTheUnfoldedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (const Fp8W16Math math : {Fp8W16Math::kFp32Fma, Fp8W16Math::kTensorCore}) {
    std::mt19937 rng(cuda_test::TestSeed() + 12 + 2 * static_cast<int>(math));
    CheckFolds(rng, 77, 272, true, false, math, true);
    CheckFolds(rng, 130, 2048, false, true, math, true);
    CheckFolds(rng, 33, 7168, true, true, math, true);
    CheckFolds(rng, 40, 10944, false, false, math, true);
  }
}

TEST(Fp8W16GemvCudaTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint8_t> codes(64 * 16384);
  DeviceBuffer<float> s(64 * 128), out(2 * 64);
  DeviceBuffer<bf16> x(2 * 16384), nw(16384), o16(64);
  const Fp8DeviceWeight w{codes.get(), s.get(), {64, 64, 1, 64}};
  EXPECT_TRUE(Fp8W16Gemv<float>(x.get(), w, nullptr, 1, out.get(), nullptr).ok());
  EXPECT_FALSE(
      Fp8W16Gemv<float>(x.get(), w, nullptr, kFp8W16TokensMaxM + 1, out.get(), nullptr).ok());  // m
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(), w, nullptr, 0, out.get(), nullptr).ok());
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(), {codes.get(), s.get(), {64, 72, 1, 72}}, nullptr, 1,
                                 out.get(),
                                 nullptr)
                   .ok());  // k % 16
  EXPECT_TRUE(Fp8W16Gemv<float>(x.get(), {codes.get(), s.get(), {64, 256, 1, 128}}, nullptr, 1,
                                out.get(), nullptr)
                  .ok());  // 128-column groups
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(), {codes.get(), s.get(), {64, 256, 1, 64}}, nullptr, 1,
                                 out.get(), nullptr)
                   .ok());  // 64-column groups
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(), {codes.get(), s.get(), {64, 256, 2, 128}}, nullptr, 1,
                                 out.get(), nullptr)
                   .ok());  // scales shared by 2 rows
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get(),
                                 {codes.get(), s.get(), {1, kFp8W16MaxK + 16, 1, kFp8W16MaxK + 16}},
                                 nullptr, 1, out.get(), nullptr, false, false,
                                 Fp8W16Math::kTensorCore)
                   .ok());  // k past kFp8W16MaxK
  EXPECT_FALSE(Fp8W16Gemv<float>(x.get() + 1, w, nullptr, 1, out.get(), nullptr).ok());  // align
  EXPECT_FALSE(
      Fp8W16Gemv<float>(x.get(), w, nullptr, 1, static_cast<float*>(nullptr), nullptr).ok());
  EXPECT_FALSE(Fp8W16GemvNormIn(x.get(), nullptr, kEps, w, nullptr, 1, o16.get(), nullptr).ok());
  EXPECT_FALSE(Fp8W16GemvNormIn(x.get(), nw.get(), kEps,
                                {codes.get(), s.get(), {64, 16384, 1, 16384}}, nullptr, 1,
                                o16.get(), nullptr)
                   .ok());  // 64 KiB of staging
  EXPECT_FALSE(Fp8W16GemvNormInSiluMul(x.get(), nw.get(), kEps,
                                       {codes.get(), s.get(), {63, 64, 1, 64}}, nullptr, 1,
                                       o16.get(), nullptr)
                   .ok());  // odd gate_up rows
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace tandem::kernels::cuda
