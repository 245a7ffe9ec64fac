// The decode MoE layer's kernels chained as CudaMoeMlp chains them at one to a few tokens
// (MoeRouteAndPermute -> MoeExpertGemvGateUp -> MoeExpertGemvDown -> combine), several layers on
// one set of buffers with alternating routings: plain launches with MoeCombine, plain launches
// with MoeCombineSplit, and PDL launches (MoeCombineSplit), eagerly twice and as a replayed CUDA
// graph, must all give the same bits (GPU; skips without one). Written after a session's test of
// early down-GEMV loads saw its PDL chain differ from the plain one (kernels/moe/BENCHMARKS.md,
// fifteenth session): this separates the combine kernels from the launch mode.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using moe_cuda_test::DevicePerm;
using moe_cuda_test::MakePerm;
using moe_cuda_test::Normal;
using moe_cuda_test::Poison;
using moe_cuda_test::SpreadLogits;

enum class Mode { kPlainCombine, kPlainSplit, kPdlSplit };

template <typename T>
struct Chain {
  static constexpr int kLayers = 4;
  int64_t tokens, E, k, H, I;
  GroupedRoutingParams p;
  DeviceBuffer<T> x, gate_up, down, act, eout;
  DeviceBuffer<float> logits[2], weights;
  DeviceBuffer<int32_t> ids;
  DevicePerm perm;

  void Run(Mode mode, std::vector<DeviceBuffer<T>>& outs, cudaStream_t s) {
    const bool pdl = mode == Mode::kPdlSplit;
    const int64_t rows = tokens * k;
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(MoeRouteAndPermute(logits[l % 2].get(), tokens, p, ids.get(), weights.get(),
                                     perm.view(), nullptr, s, pdl)
                      .ok());
      ASSERT_TRUE(MoeExpertGemvGateUp<T>(x.get(), gate_up.get(), H, I, perm.view(), E, rows,
                                         act.get(), s, pdl)
                      .ok());
      ASSERT_TRUE(MoeExpertGemvDown<T>(act.get(), down.get(), H, I, perm.view(), E, rows,
                                       eout.get(), s, pdl)
                      .ok());
      const absl::Status st =
          mode == Mode::kPlainCombine
              ? MoeCombine<T>(eout.get(), weights.get(), perm.row_of_pair.get(), tokens, k, H,
                              nullptr, nullptr, x.get(), outs[l].get(), s)
              : MoeCombineSplit<T>(eout.get(), weights.get(), perm.row_of_pair.get(), tokens, k, H,
                                   nullptr, nullptr, x.get(), outs[l].get(), s, pdl);
      ASSERT_TRUE(st.ok()) << st;
    }
  }
};

template <typename T>
std::vector<std::vector<uint16_t>> Bits(const std::vector<DeviceBuffer<T>>& outs) {
  std::vector<std::vector<uint16_t>> bits;
  for (const auto& o : outs) {
    const std::vector<T> h = o.ToHost();
    std::vector<uint16_t> b(h.size());
    std::memcpy(b.data(), h.data(), h.size() * sizeof(T));
    bits.push_back(std::move(b));
  }
  return bits;
}

// The first differing element of two runs' layer outputs, or "" when equal.
std::string FirstDifference(const std::vector<std::vector<uint16_t>>& a,
                            const std::vector<std::vector<uint16_t>>& b) {
  for (size_t l = 0; l < a.size(); ++l) {
    for (size_t i = 0; i < a[l].size(); ++i) {
      if (a[l][i] != b[l][i]) {
        return "layer " + std::to_string(l) + " element " + std::to_string(i);
      }
    }
  }
  return "";
}

template <typename T>
void CheckChain(int64_t tokens, int64_t E, int64_t k, int64_t H, int64_t I, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message()
               << "T " << tokens << " E " << E << " k " << k << " H " << H << " I " << I);
  const int64_t rows = tokens * k;
  Chain<T> c{tokens,
             E,
             k,
             H,
             I,
             {},
             DeviceBuffer<T>(cuda_test::Convert<T>(Normal(tokens * H, 1.0f, rng))),
             DeviceBuffer<T>(cuda_test::Convert<T>(Normal(E * 2 * I * H, 0.2f, rng))),
             DeviceBuffer<T>(cuda_test::Convert<T>(Normal(E * H * I, 0.2f, rng))),
             DeviceBuffer<T>(rows * I),
             DeviceBuffer<T>(rows * H),
             {DeviceBuffer<float>(SpreadLogits(tokens, E, rng)),
              DeviceBuffer<float>(SpreadLogits(tokens, E, rng))},
             DeviceBuffer<float>(rows),
             DeviceBuffer<int32_t>(rows),
             MakePerm(E, rows)};
  c.p.num_experts = E;
  c.p.top_k = k;
  c.p.renormalize = true;
  auto make_outs = [&] {
    std::vector<DeviceBuffer<T>> outs;
    for (int l = 0; l < Chain<T>::kLayers; ++l) {
      outs.emplace_back(tokens * H);
      Poison(outs.back());
    }
    return outs;
  };
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto run = [&](Mode mode) -> std::vector<std::vector<uint16_t>> {
    std::vector<DeviceBuffer<T>> outs = make_outs();
    Poison(c.eout);
    Poison(c.act);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    c.Run(mode, outs, stream);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return Bits(outs);
  };
  const auto plain_combine = run(Mode::kPlainCombine);
  const auto plain_combine2 = run(Mode::kPlainCombine);
  const auto plain_split = run(Mode::kPlainSplit);
  const auto pdl = run(Mode::kPdlSplit);
  const auto pdl2 = run(Mode::kPdlSplit);
  EXPECT_EQ(FirstDifference(plain_combine, plain_combine2), "") << "plain launches twice";
  EXPECT_EQ(FirstDifference(plain_combine, plain_split), "") << "MoeCombine vs MoeCombineSplit";
  EXPECT_EQ(FirstDifference(plain_split, pdl), "") << "plain vs PDL launches";
  EXPECT_EQ(FirstDifference(pdl, pdl2), "") << "PDL launches twice";
  std::vector<DeviceBuffer<T>> graphed = make_outs();
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  c.Run(Mode::kPdlSplit, graphed, stream);
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    for (auto& o : graphed) Poison(o);
    Poison(c.eout);
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(FirstDifference(plain_split, Bits(graphed)), "") << "graph replay " << replay;
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(MoeChainCudaTest, PlainPdlAndGraphChainsGiveTheSameBits) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  CheckChain<__nv_bfloat16>(1, 16, 8, 2048, 768, rng);  // Qwen3-30B-A3B widths
  CheckChain<__nv_bfloat16>(2, 16, 8, 2048, 768, rng);
  CheckChain<__nv_bfloat16>(16, 64, 6, 128, 1064, rng);  // odd expert width
  CheckChain<__half>(3, 8, 2, 40, 37, rng);
}

}  // namespace
}  // namespace tandem::kernels::cuda
