// The batch-1 weight-only FP8 GEMV's latency forms (fp8_w8a16_deep_cuda.cu): kTensorCoreDeep and
// kTensorCorePersistent bit for bit against kTensorCore (plain, folded, grouped), and
// kTensorCoreSplitK against the CPU reference cpu::Fp8Linear (kNone) with S picked and forced,
// its counters back to zero, replayed in a CUDA graph (GPU; skips without one). The shared
// checks: fp8_w8a16_test_util.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
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
using fp8_w16_test::CheckFoldShapes;
using fp8_w16_test::CheckGroupedShapes;
using fp8_w16_test::CheckPlainShapes;
using fp8_w16_test::ExpectNearReference;
using fp8_w16_test::kEps;
using fp8_w16_test::RunPlain;
using fp8_w16_test::SameBits;
using fp8_w16_test::Weight;

// kTensorCoreDeep (16 loads in flight a lane): kTensorCore's bits, hence the reference, plain,
// folded and grouped.
TEST(Fp8W16GemvCudaTest, DeepEqualsTheTensorCore) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kTensorCoreDeep);
  CheckFoldShapes(Fp8W16Math::kTensorCoreDeep);
  CheckGroupedShapes(Fp8W16Math::kTensorCoreDeep);
  std::mt19937 rng(cuda_test::TestSeed() + 21);
  for (const auto& [n, k, grouped] :
       {std::tuple{77, 272, false}, std::tuple{130, 14336, false}, std::tuple{4096, 4096, false},
        std::tuple{129, 10944, true}}) {
    const Weight w(rng, n, k, false, false, grouped);
    DeviceBuffer<bf16> dx(RandomBf16(rng, k, 2.0f));
    EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCoreDeep),
                         RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCore)))
        << "deep != kTensorCore at n=" << n << " k=" << k;
  }
}

// A split-k workspace for weights of up to `rows` rows, counters zeroed.
struct SplitKBuffer {
  SplitKBuffer(int64_t rows, int splits) : mem(Fp8W16SplitKWorkspaceBytes(rows)) {
    EXPECT_EQ(cudaMemset(mem.get(), 0, mem.size()), cudaSuccess);
    ws = Fp8W16SplitKWorkspaceAt(mem.get(), rows, splits);
  }
  bool CountersZero() const {
    std::vector<unsigned int> c(ws.tiles);
    EXPECT_EQ(cudaMemcpy(c.data(), ws.counters, c.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return std::all_of(c.begin(), c.end(), [](unsigned int v) { return v == 0; });
  }
  DeviceBuffer<uint8_t> mem;
  Fp8W16SplitKWorkspace ws;
};

// kTensorCoreSplitK, S picked (on an H200: 4 at n <= 130 and k >= 4096, 2 at n = 4097 and k =
// 2048, else one split: kTensorCore) and forced to 2 (k = 272: 256 + 16 columns; k = 1040: 640 +
// 400) and 4 (k = 272: 3 splits of 128, 128, 16 columns; k = 1040: 3 of 384, 384, 272), k =
// 14336 with 130 rows: 4 x 3584: against the reference with kTensorCore's tolerance, every call
// twice (early loads off / on) with the same bits, the folds bit for bit against the unfolded
// split kernels (the same S for the same n and k), the counters zero after.
TEST(Fp8W16GemvCudaTest, SplitKMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (const int splits : {0, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << "splits=" << splits);
    SplitKBuffer buf(2 * 9000, splits);
    CheckPlainShapes(Fp8W16Math::kTensorCoreSplitK, &buf.ws);
    CheckFoldShapes(Fp8W16Math::kTensorCoreSplitK, &buf.ws);
    CheckGroupedShapes(Fp8W16Math::kTensorCoreSplitK, &buf.ws);
    EXPECT_TRUE(buf.CountersZero());
  }
}

// Replays of a captured split-k launch give the eager bits (the counters wrap back to 0).
TEST(Fp8W16GemvCudaTest, SplitKReplaysInAGraph) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 22);
  const int64_t n = 4096, k = 14336;  // Llama-3-8B's down_proj (S = 2, as picked on an H200)
  const Weight w(rng, n, k, false, true);
  DeviceBuffer<bf16> dx(RandomBf16(rng, k, 2.0f));
  SplitKBuffer buf(n, 2);
  const std::vector<float> eager =
      RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCoreSplitK, &buf.ws);
  DeviceBuffer<float> out(n);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const absl::Status st = Fp8W16Gemv<float>(dx.get(), w.device(), nullptr, 1, out.get(), stream,
                                            true, true, Fp8W16Math::kTensorCoreSplitK, &buf.ws);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    cudaMemsetAsync(out.get(), 0xFF, n * sizeof(float), stream);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(SameBits(out.ToHost(), eager)) << "replay " << replay;
  }
  EXPECT_TRUE(buf.CountersZero());
  ExpectNearReference(w.host(), cuda_test::ToFloat(dx.ToHost()), nullptr, eager, false,
                      Fp8W16Math::kTensorCoreSplitK);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// kTensorCorePersistent (the deep tiles on min(tiles, 2 SMs) CTAs, the activations staged once a
// CTA): against the reference and its own unfolded kernels as the other forms, then bit for bit
// against kTensorCore, plain (fp32 out), NormIn, NormInSiluMul and AddTo, per-channel and grouped,
// at n = 77 / 130 (5 / 9 tiles: one a CTA) and 9000 (563 tiles: past 2 x 132 SMs, 2-3 a CTA), k =
// 272 / 1040 / 4096 / 14336 (NormIn's k <= 12280: 14336 plain and AddTo only).
void ExpectPersistentBits(std::mt19937& rng, int64_t n, int64_t k, bool grouped) {
  SCOPED_TRACE(::testing::Message()
               << "persistent n=" << n << " k=" << k << (grouped ? " grouped" : ""));
  constexpr Fp8W16Math kP = Fp8W16Math::kTensorCorePersistent, kT = Fp8W16Math::kTensorCore;
  const Weight w(rng, n, k, false, false, grouped);
  DeviceBuffer<bf16> dx(RandomBf16(rng, k, 1.5f)), dnorm(RandomBf16(rng, k, 1.0f));
  DeviceBuffer<bf16> dbias(RandomBf16(rng, 2 * n, 1.0f));
  const std::vector<bf16> res0 = RandomBf16(rng, n, 3.0f);
  EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, dbias.get(), true, kP),
                       RunPlain<float>(dx.get(), w, dbias.get(), true, kT)))
      << "plain";
  EXPECT_TRUE(SameBits(RunPlain<float>(dx.get(), w, nullptr, false, kP),
                       RunPlain<float>(dx.get(), w, nullptr, false, kT)))
      << "plain, late loads";
  const auto add_to = [&](Fp8W16Math math) {
    DeviceBuffer<bf16> residual(res0);
    EXPECT_TRUE(Fp8W16GemvAddTo(dx.get(), w.device(), dbias.get(), 1, residual.get(), nullptr, true,
                                true, math)
                    .ok());
    return residual.ToHost();
  };
  EXPECT_TRUE(SameBits(add_to(kP), add_to(kT))) << "AddTo";
  if (!Fp8W16GemvNormInSupported(dx.get(), dnorm.get(), w.device(), 1)) return;  // k > 12280
  const Weight gu(rng, 2 * n, k, false, false, grouped);  // gate rows, then up rows
  const auto norm_in = [&](Fp8W16Math math, bool silu) {
    DeviceBuffer<bf16> out(n);
    const absl::Status st =
        silu ? Fp8W16GemvNormInSiluMul(dx.get(), dnorm.get(), kEps, gu.device(), dbias.get(), 1,
                                       out.get(), nullptr, true, true, math)
             : Fp8W16GemvNormIn(dx.get(), dnorm.get(), kEps, w.device(), dbias.get(), 1, out.get(),
                                nullptr, true, true, math);
    EXPECT_TRUE(st.ok()) << st;
    return out.ToHost();
  };
  EXPECT_TRUE(SameBits(norm_in(kP, false), norm_in(kT, false))) << "NormIn";
  EXPECT_TRUE(SameBits(norm_in(kP, true), norm_in(kT, true))) << "NormInSiluMul";
}

TEST(Fp8W16GemvCudaTest, PersistentEqualsTheTensorCore) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kTensorCorePersistent);
  CheckFoldShapes(Fp8W16Math::kTensorCorePersistent);
  CheckGroupedShapes(Fp8W16Math::kTensorCorePersistent);
  std::mt19937 rng(cuda_test::TestSeed() + 23);
  for (const int64_t n : {int64_t{77}, int64_t{130}, int64_t{9000}}) {
    for (const int64_t k : {int64_t{272}, int64_t{1040}, int64_t{4096}, int64_t{14336}}) {
      for (const bool grouped : {false, true}) ExpectPersistentBits(rng, n, k, grouped);
    }
  }
}

// kTensorCoreWide (128 bytes of a row a warp load; each row's two window halves added last): not
// kTensorCore's bits, so against the reference (plain, fp32 / bf16 out, early loads on and off:
// the same bits), folded (bit for bit against its own unfolded kernels), grouped; and within the
// fp32 bound of kTensorCore on the shapes of the 8B projections.
TEST(Fp8W16GemvCudaTest, WideMatchesTheReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckPlainShapes(Fp8W16Math::kTensorCoreWide);
  CheckFoldShapes(Fp8W16Math::kTensorCoreWide);
  CheckGroupedShapes(Fp8W16Math::kTensorCoreWide);
  std::mt19937 rng(cuda_test::TestSeed() + 29);
  for (const auto& [n, k, grouped] : {std::tuple{6144, 4096, false}, std::tuple{4096, 14336, false},
                                      std::tuple{28672, 4096, true}, std::tuple{77, 272, true}}) {
    const Weight w(rng, n, k, false, false, grouped);
    DeviceBuffer<bf16> dx(RandomBf16(rng, k, 2.0f));
    const std::vector<float> wide =
        RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCoreWide);
    const std::vector<float> mma =
        RunPlain<float>(dx.get(), w, nullptr, true, Fp8W16Math::kTensorCore);
    ASSERT_EQ(wide.size(), mma.size());
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < wide.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(wide[i]) - mma[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(mma[i])));
    }
    EXPECT_LE(worst, 1e-5 * scale) << "wide vs kTensorCore at n=" << n << " k=" << k;
    EXPECT_GT(scale, 0.0);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
