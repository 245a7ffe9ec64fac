// CudaMoeMlp on 16-bit experts in prefill-sized steps (issue 32): a one-layer Qwen3-MoE (32
// experts, top-4, hidden 256, expert width 136: gate_up's 272 columns end inside a 256-column
// tile) on fresh random bf16 weights and tokens, 300 tokens (1,200 rows: ~38 an expert, the
// ping-pong 64 x 256 tiles) and 1,100 (~138 an expert: the 128 x 256 tiles). On sm_90 these steps
// take MoeGroupedWgmma; with CudaMoeKernels::fused_glu (the default) gate_up runs with SiLU * up
// in its epilogue (MoeGroupedWgmmaGateUpSilu), without it MoeGroupedWgmma + MoeSiluAndMul:
//   * fused_glu_steps() counts the fused steps (on sm_90 the fused run takes it, the other not);
//   * the two outputs are bit-identical;
//   * each matches the CPU layer (router logits in fp64 from the same bf16 weights, SoftmaxTopK,
//     cpu::FusedMoe in fp32) within 3e-2 of max |out| (gate, up, SiLU * up and each expert's
//     output are rounded to bf16 once each on the device) on every token whose 4th and 5th
//     router logits are at least 1e-3 apart (a closer pair may route differently in fp32; at
//     least 90% of the tokens are checked).
// GPU test; skips without one.
#include "runtime/cuda/cuda_moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/gemm/cuda/gemm_cuda.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_cuda.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/model_config.h"

namespace tandem::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;
namespace ct = ::tandem::kernels::cuda_test;

ModelConfig WideMoe() {
  ModelConfig c = *PresetConfig("tiny-moe");
  c.num_hidden_layers = 1;
  c.hidden_size = 256;
  c.num_experts = 32;
  c.num_experts_per_tok = 4;
  c.moe_intermediate_size = 136;
  return c;
}

std::vector<float> Draw(int64_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  ct::RoundTo<bf16>(v);
  return v;
}

DeviceBuffer Upload(const std::vector<float>& v) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(static_cast<int64_t>(v.size()) * 2, "w");
  EXPECT_TRUE(b.ok()) << b.status();
  const std::vector<bf16> h = ct::Convert<bf16>(v);
  EXPECT_EQ(cudaMemcpy(b->data(), h.data(), h.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  return *std::move(b);
}

// The layer on the CPU; `checked[t]` whether token t's routing is unambiguous (see above).
std::vector<float> CpuLayer(const ModelConfig& c, const std::vector<float>& router,
                            const std::vector<float>& gate_up, const std::vector<float>& down,
                            const std::vector<float>& x, int64_t T, std::vector<bool>* checked) {
  const int64_t E = c.num_experts, k = c.num_experts_per_tok, H = c.hidden_size;
  std::vector<float> logits(T * E);
  checked->assign(T, false);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += double{x[t * H + h]} * router[e * H + h];
      logits[t * E + e] = static_cast<float>(s);
    }
    std::vector<float> sorted(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    (*checked)[t] = sorted[k - 1] - sorted[k] >= 1e-3f;
  }
  kernels::MoeRouting routing;
  EXPECT_TRUE(kernels::cpu::SoftmaxTopK(logits.data(), T, {E, k, true}, &routing).ok());
  const kernels::MoeExpertWeights w{gate_up.data(), down.data(), E, H, c.moe_intermediate_size};
  std::vector<float> out(T * H);
  kernels::MoeScratch scratch;
  EXPECT_TRUE(kernels::cpu::FusedMoe(x.data(), routing, w, out.data(), nullptr, &scratch).ok());
  return out;
}

TEST(CudaMoeMlpTest, FusedGateUpSiluEqualsTheUnfusedPairAndMatchesTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(ct::TestSeed());
  const ModelConfig c = WideMoe();
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  const std::vector<float> router = Draw(E * H, 0.1f, rng);
  const std::vector<float> gate_up = Draw(E * 2 * I * H, 0.1f, rng);
  const std::vector<float> down = Draw(E * H * I, 0.1f, rng);
  CudaMoeWeights w;
  w.router = Upload(router);
  w.experts_gate_up = Upload(gate_up);
  w.experts_down = Upload(down);
  const int64_t max_tokens = 1100;
  absl::StatusOr<std::unique_ptr<CudaMoeMlp>> mlp = CudaMoeMlp::Create(c, max_tokens);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  absl::StatusOr<std::unique_ptr<kernels::cuda::CublasLtGemm>> gemm =
      kernels::cuda::CublasLtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const bool sm90 = kernels::cuda::MoeGroupedWgmmaSupported(nullptr, nullptr, 8, 8);
  CudaMoeKernels fused, unfused;
  unfused.fused_glu = false;
  for (int64_t T : {int64_t{300}, max_tokens}) {
    SCOPED_TRACE(::testing::Message() << T << " tokens");
    const std::vector<float> x = Draw(T * H, 1.0f, rng);
    ct::DeviceBuffer<bf16> dx(ct::Convert<bf16>(x)), dout(T * H);
    std::vector<std::vector<float>> got;
    for (const CudaMoeKernels& kernels : {fused, unfused}) {
      const int64_t before = (*mlp)->fused_glu_steps();
      (*mlp)->set_kernels(kernels);
      ASSERT_TRUE((*mlp)->Forward<bf16>(w, dx.get(), T, 0, dout.get(), **gemm, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ((*mlp)->fused_glu_steps() - before, sm90 && kernels.fused_glu ? 1 : 0);
      got.push_back(ct::ToFloat(dout.ToHost()));
    }
    EXPECT_EQ(got[0], got[1]) << "fused and unfused gate_up + SiLU * up differ";
    std::vector<bool> checked;
    const std::vector<float> want = CpuLayer(c, router, gate_up, down, x, T, &checked);
    double max_want = 0.0;
    for (float v : want) max_want = std::max(max_want, double{std::abs(v)});
    const int64_t n_checked = std::count(checked.begin(), checked.end(), true);
    EXPECT_GE(n_checked, T * 9 / 10);
    double worst = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; checked[t] && h < H; ++h) {
        worst = std::max(worst, std::abs(double{got[0][t * H + h]} - want[t * H + h]));
      }
    }
    std::printf("%lld tokens (%s): %lld checked, max |GPU - CPU| %.2e of max %.3f\n",
                static_cast<long long>(T), sm90 ? "fused vs unfused on sm_90" : "not sm_90",
                static_cast<long long>(n_checked), worst, max_want);
    EXPECT_LE(worst, 3e-2 * max_want);
  }
}

}  // namespace
}  // namespace tandem::runtime::cuda
