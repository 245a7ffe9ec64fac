// The batch-1 weight-only FP8 GEMV's shared-memory ring forms (Fp8W16Math::kRing / kRing2 /
// kRingHalf, fp8_w8a16_ring_cuda.cu): kRing against the CPU reference cpu::Fp8Linear (kNone) at
// the plain test's shapes and its folds bit for bit against the unfolded kernels; all three bit
// for bit against the tensor-core kernel at odd shapes and at the Llama-3-8B / 70B projections
// (plain and folded, sampled rows against the reference there); k = 49,152 where two of them fall
// back; grouped weights, where kAuto picks by staging size and the rings run the tensor-core kernel
// (GPU; skips without one). The shared checks: fp8_w8a16_test_util.h.
#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_test_util.h"
#include "kernels/layers/cuda/layers_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;
using fp8_test::RandomBf16;
using fp8_w16_test::CheckFoldShapes;
using fp8_w16_test::CheckPlainShapes;
using fp8_w16_test::ExpectNearReference;
using fp8_w16_test::kEps;
using fp8_w16_test::kRings;
using fp8_w16_test::RunPlain;
using fp8_w16_test::SameBits;
using fp8_w16_test::Weight;

// The ring forms at the odd shapes: n = 77 / 130 give one tile a CTA and a partial last tile,
// n = 9000 several tiles a CTA (the ring wraps across tiles), k = 16 one stage of one chunk
// (fewer stages than the ring's slots), k = 1040 / 4112 a partial last stage, k = 14336 14
// stages a tile. kRing against the reference (as the other loops); all three bit for bit against
// kTensorCore on the same inputs, early loads or not (they differ only in grid size and stage
// count: 11-12 stages a CTA on a whole SM, 4-6 on half).
TEST(Fp8W16GemvCudaTest, RingMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kRing);
}

TEST(Fp8W16GemvCudaTest, RingsEqualTheTensorCoreAtOddShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 11);
  const int64_t shapes[][2] = {{77, 16},     {130, 272},   {77, 1040},
                               {9000, 4112}, {9000, 4096}, {130, 14336}};
  for (const auto& [n, k] : shapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    const Weight w(rng, n, k, false);
    const std::vector<bf16> x = RandomBf16(rng, k, 2.0f), bias = RandomBf16(rng, n, 1.0f);
    DeviceBuffer<bf16> dx(x), dbias(bias);
    const std::vector<float> want =
        RunPlain<float>(dx.get(), w, dbias.get(), true, Fp8W16Math::kTensorCore);
    for (const Fp8W16Math math : kRings) {
      for (const bool early : {false, true}) {
        EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, dbias.get(), early, math), want))
            << "math=" << static_cast<int>(math) << (early ? " early" : "");
      }
    }
  }
}

// kRing's folds at the odd shapes (kRing2 / kRingHalf: bit for bit against kTensorCore's folds at
// the Llama shapes below; the three differ only in grid size and stage count).
TEST(Fp8W16GemvCudaTest, RingFoldsEqualTheUnfoldedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckFoldShapes(Fp8W16Math::kRing);
}

// got (n outputs) against the reference on 96 rows of w: the first and last 40 (the last tile
// partial or not) and 16 spread over the rest.
void ExpectRowsNearReference(const Weight& w, const std::vector<float>& x,
                             const std::vector<float>& got, Fp8W16Math math) {
  const int64_t n = w.grid.rows, k = w.grid.cols;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < 40; ++i) rows.insert(rows.end(), {i, n - 40 + i});
  for (int64_t i = 0; i < 16; ++i) rows.push_back(n / 16 * i + 7 * i);
  std::vector<uint8_t> codes;
  std::vector<float> scales, sub;
  for (const int64_t r : rows) {
    codes.insert(codes.end(), w.codes.begin() + r * k, w.codes.begin() + (r + 1) * k);
    scales.push_back(w.scales[r]);
    sub.push_back(got[r]);
  }
  const int64_t m = static_cast<int64_t>(rows.size());
  ExpectNearReference({codes.data(), scales.data(), {m, k, 1, k}}, x, nullptr, sub, false, math);
}

// One Llama-3 projection as the decode step runs it (fold: 0 NormIn, 1 AddTo, 2 NormInSiluMul):
// every ring form bit for bit against kTensorCore, plain (fp32 out) and folded, and the plain
// outputs' sampled rows against the reference.
struct RealShape {
  const char* name;
  int64_t n, k;
  int fold;
};

std::vector<bf16> RunFolded(const RealShape& s, const bf16* x, const bf16* norm_w, const Weight& w,
                            const std::vector<bf16>& residual, Fp8W16Math math) {
  DeviceBuffer<bf16> out(residual);
  absl::Status st;
  if (s.fold == 0) {
    st = Fp8W16GemvNormIn(x, norm_w, kEps, w.device(), nullptr, 1, out.get(), nullptr, true, true,
                          math);
  } else if (s.fold == 2) {
    st = Fp8W16GemvNormInSiluMul(x, norm_w, kEps, w.device(), nullptr, 1, out.get(), nullptr, true,
                                 true, math);
  } else {
    st = Fp8W16GemvAddTo(x, w.device(), nullptr, 1, out.get(), nullptr, true, true, math);
  }
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.ToHost();
}

void CheckRealShape(std::mt19937& rng, const RealShape& s) {
  SCOPED_TRACE(::testing::Message() << s.name << " n=" << s.n << " k=" << s.k);
  const Weight w(rng, s.n, s.k, false, /*tiled=*/true);
  const std::vector<bf16> x = RandomBf16(rng, s.k, 1.5f), norm_w = RandomBf16(rng, s.k, 1.0f);
  DeviceBuffer<bf16> dx(x), dnorm(norm_w), normed(s.k);
  ASSERT_TRUE(RmsNorm<bf16>(dx.get(), dnorm.get(), 1, s.k, kEps, normed.get(), nullptr).ok());
  const std::vector<float> normed_f = cuda_test::ToFloat(normed.ToHost());
  const std::vector<float> tc =
      RunPlain<float>(normed.get(), w, nullptr, true, Fp8W16Math::kTensorCore);
  ExpectRowsNearReference(w, normed_f, tc, Fp8W16Math::kTensorCore);
  const std::vector<bf16> residual = RandomBf16(rng, s.fold == 2 ? s.n / 2 : s.n, 3.0f);
  const bf16* in = s.fold == 1 ? normed.get() : dx.get();
  const std::vector<bf16> want =
      RunFolded(s, in, dnorm.get(), w, residual, Fp8W16Math::kTensorCore);
  for (const Fp8W16Math math : kRings) {
    SCOPED_TRACE(::testing::Message() << "math=" << static_cast<int>(math));
    const std::vector<float> ring = RunPlain<float>(normed.get(), w, nullptr, true, math);
    EXPECT_TRUE(SameBits(ring, tc)) << "plain != kTensorCore";
    ExpectRowsNearReference(w, normed_f, ring, math);
    EXPECT_TRUE(SameBits(RunFolded(s, in, dnorm.get(), w, residual, math), want))
        << "folded != kTensorCore";
  }
}

TEST(Fp8W16GemvCudaTest, RingsEqualTheTensorCoreAtTheLlamaShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 7);
  const RealShape shapes[] = {
      {"8B qkv", 6144, 4096, 0},       {"8B o", 4096, 4096, 1},      {"8B gate_up", 28672, 4096, 2},
      {"8B down", 4096, 14336, 1},     {"70B qkv", 10240, 8192, 0},  {"70B o", 8192, 8192, 1},
      {"70B gate_up", 57344, 8192, 2}, {"70B down", 8192, 28672, 1},
  };
  for (const RealShape& s : shapes) CheckRealShape(rng, s);
}

// k = 49,152: 96 KiB of f16 activations leave kRing2 / kRingHalf no room for 3 stages in half an
// SM, so they run the tensor-core kernel; kRing runs the ring (7 stages beside the 96 KiB). All
// three give the tensor-core kernel's bits.
TEST(Fp8W16GemvCudaTest, RingsBesideLargeStagingOrFallingBack) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 9);
  const Weight w(rng, 33, 49152, false);
  const std::vector<bf16> x = RandomBf16(rng, 49152, 2.0f);
  DeviceBuffer<bf16> dx(x);
  const std::vector<float> want =
      RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCore);
  for (const Fp8W16Math math : kRings) {
    EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, math), want))
        << "math=" << static_cast<int>(math);
  }
}

// kAuto on a grouped weight: the tensor-core bits (k <= 24,576), fp32's past; the ring maths run
// the tensor-core kernel (no grouped ring form).
TEST(Fp8W16GemvCudaTest, GroupedAutoAndRingsPickTheGroupedKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 13);
  for (const int64_t k : {int64_t{7168}, int64_t{28672}}) {
    SCOPED_TRACE(::testing::Message() << "k=" << k);
    const Weight w(rng, 300, k, false, false, true);
    DeviceBuffer<bf16> dx(RandomBf16(rng, k, 1.0f));
    const std::vector<float> fma =
        RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kFp32Fma);
    const std::vector<float> mma =
        RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCore);
    EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kAuto),
                         k * 2 <= kFp8W16AutoMaxStagingBytes ? mma : fma));
    for (const Fp8W16Math math : kRings) {
      EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, math), mma))
          << "math=" << static_cast<int>(math);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
