// CudaFp8MoeExperts (cuda_moe_fp8.h) on both of its paths for the same 300-token step: the
// prefill path (the offsets read back, one CudaFp8Linear per expert: cuBLASLt's block-scaled or
// outer-vector FP8 GEMM on each expert's rows, the last m % 4 rows on the GEMV) against the FP8
// expert GEMVs (kernels/moe/moe_fp8_cuda.h, themselves checked against cpu::Fp8Linear by
// moe_fp8_cuda_test), for DeepSeek-V3's form (128 x 128 blocks as per-row 128-column groups,
// 1 x 128 activations, widths with 4 groups: the block GEMM's) and compressed-tensors'
// (per-channel, per-token); each path's act and output equal within a bf16 rounding of the act (and
// the FP8 step it can move a code by); the e4m3 shared experts against the same computation on the
// CPU reference (cpu::Fp8Linear, SiLU * up in bf16). Uploads from the loader's stacked form
// (UploadFp8MoeWeights), including expert parallelism's zero expert.
#include "runtime/cuda/cuda_moe_fp8.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_gemm_cuda.h"
#include "runtime/model/expert_placement.h"

namespace tandem::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Scheme = kernels::Fp8ActivationScheme;
template <typename T>
using TestBuffer = kernels::cuda_test::DeviceBuffer<T>;

// A stacked host FP8 weight [rows, cols] as the loader holds it: quantized in 128 x 128 blocks
// (DeepSeek; each block's scale written on its rows' 128-column groups) or per row.
Fp8LinearWeight RandomFp8(int64_t rows, int64_t cols, bool blocks, Scheme scheme,
                          std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(rows * cols);
  for (float& x : w) x = d(rng);
  Fp8LinearWeight f;
  f.grid = {rows, cols, 1, blocks ? 128 : cols};
  f.codes.resize(rows * cols);
  f.scales.resize(f.grid.NumScales());
  const kernels::Fp8ScaleGrid q = blocks ? kernels::Fp8ScaleGrid{rows, cols, 128, 128} : f.grid;
  std::vector<float> block_scales(q.NumScales());
  kernels::QuantizeWeight(w.data(), q, f.codes.data(), block_scales.data());
  const int64_t gc = f.grid.GridCols();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < gc; ++g) f.scales[r * gc + g] = block_scales[r / q.block_rows * gc + g];
  }
  f.activation = scheme;
  return f;
}

std::vector<float> Bf16Rows(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = kernels::cuda_test::ToF(kernels::cuda_test::FromF<bf16>(d(rng)));
  return v;
}

float MaxAbs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float rel_to_max,
                 const char* what) {
  const float max_abs = MaxAbs(want);
  ASSERT_GT(max_abs, 0.0f) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1.6e-2f * std::abs(want[i]) + rel_to_max * max_abs)
        << what << " element " << i;
  }
}

void PrefillMatchesGemvs(bool blocks, std::mt19937& rng) {
  SCOPED_TRACE(blocks ? "128 x 128 blocks, 1 x 128 activations" : "per-channel, per-token");
  const Scheme scheme = blocks ? Scheme::kDynamicGroup128 : Scheme::kDynamicToken;
  ModelConfig c;
  c.hidden_size = 512;
  c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 256;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  const int64_t T = 300, E = 8, k = 2, H = 512, I = 512, Is = 256, rows = T * k;
  LayerWeights layer;
  layer.experts_gate_up_fp8 = RandomFp8(E * 2 * I, H, blocks, scheme, rng);
  layer.experts_down_fp8 = RandomFp8(E * H, I, blocks, scheme, rng);
  layer.shared_gate_up_fp8 = RandomFp8(2 * Is, H, blocks, scheme, rng);
  layer.shared_down_fp8 = RandomFp8(H, Is, blocks, scheme, rng);
  const Fp8LinearWeight shared_gu = layer.shared_gate_up_fp8, shared_dn = layer.shared_down_fp8;
  absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> w = UploadFp8MoeWeights(c, &layer, T);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(layer.experts_gate_up_fp8.empty());  // host copies freed
  absl::StatusOr<std::unique_ptr<CudaFp8MoeExperts>> experts = CudaFp8MoeExperts::Create(c, T);
  ASSERT_TRUE(experts.ok()) << experts.status();
  absl::StatusOr<std::unique_ptr<kernels::cuda::MoeGroupedGemm>> grouped =
      kernels::cuda::MoeGroupedGemm::Create(E);
  ASSERT_TRUE(grouped.ok()) << grouped.status();

  const std::vector<float> x = Bf16Rows(T * H, rng);
  std::vector<int32_t> ids(rows);
  for (int64_t t = 0; t < T; ++t) {  // two distinct experts, skewed towards expert 0
    ids[t * k] = t % 3 == 0 ? 0 : static_cast<int32_t>(rng() % E);
    ids[t * k + 1] = static_cast<int32_t>((ids[t * k] + 1 + rng() % (E - 1)) % E);
  }
  TestBuffer<bf16> dx(kernels::cuda_test::Convert<bf16>(x)), rows_in(rows * H),
      gate_up(rows * 2 * I), act(rows * I), out(rows * H), shared_gu_buf(T * 2 * Is),
      shared_act(T * Is), shared_out(T * H);
  TestBuffer<int32_t> d_ids(ids), offsets(E + 1), active(E), token_of_row(rows), row_of_pair(rows);
  const kernels::cuda::DeviceMoePermutation perm{offsets.get(), active.get(), token_of_row.get(),
                                                 row_of_pair.get()};
  ASSERT_TRUE(kernels::cuda::MoePermute(d_ids.get(), T, k, E, perm, nullptr, nullptr).ok());
  auto run = [&](kernels::cuda::MoeGroupedGemm* g) {
    EXPECT_TRUE((*experts)
                    ->Routed(**w, dx.get(), T, perm, E, rows_in.get(), gate_up.get(), act.get(),
                             out.get(), g, nullptr, false)
                    .ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return std::make_pair(kernels::cuda_test::ToFloat(act.ToHost()),
                          kernels::cuda_test::ToFloat(out.ToHost()));
  };
  const auto [act_gemv, out_gemv] = run(nullptr);
  EXPECT_STREQ((*experts)->last_path(), "fp8-expert-gemv");
  const auto [act_gemm, out_gemm] = run(grouped->get());
  EXPECT_STREQ((*experts)->last_path(), "fp8-per-expert-gemm");
  ExpectClose(act_gemm, act_gemv, 1e-2f, "act");
  ExpectClose(out_gemm, out_gemv, 2e-2f, "expert out");

  // The shared experts on the T tokens against the CPU reference.
  ASSERT_TRUE((*experts)
                  ->Shared(**w, dx.get(), T, shared_gu_buf.get(), shared_act.get(),
                           shared_out.get(), nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> gu(T * 2 * Is), a(T * Is), want(T * H);
  ASSERT_TRUE(
      kernels::cpu::Fp8Linear(x.data(), shared_gu.View(), nullptr, T, gu.data(), nullptr).ok());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < Is; ++j) {
      auto r = [](float v) { return kernels::cuda_test::ToF(kernels::cuda_test::FromF<bf16>(v)); };
      const float g = r(gu[t * 2 * Is + j]), u = r(gu[t * 2 * Is + Is + j]);
      a[t * Is + j] = r(g / (1.0f + std::exp(-g)) * u);
    }
  }
  ASSERT_TRUE(
      kernels::cpu::Fp8Linear(a.data(), shared_dn.View(), nullptr, T, want.data(), nullptr).ok());
  ExpectClose(kernels::cuda_test::ToFloat(shared_out.ToHost()), want, 2e-2f, "shared experts");
}

TEST(CudaMoeFp8Test, PerExpertGemmPrefillMatchesTheGemvs) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kernels::cuda_test::TestSeed());
  PrefillMatchesGemvs(/*blocks=*/true, rng);
  PrefillMatchesGemvs(/*blocks=*/false, rng);
}

// Expert parallelism: the rank's experts whole plus one all-zero expert (zero outputs).
TEST(CudaMoeFp8Test, ExpertParallelUploadAddsAZeroExpert) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kernels::cuda_test::TestSeed());
  ModelConfig c;
  c.hidden_size = 128;
  c.moe_intermediate_size = 64;
  c.num_experts = 4;
  c.num_experts_per_tok = 1;
  absl::StatusOr<ExpertPlacement> placement = ExpertPlacement::Contiguous(4, 2);
  ASSERT_TRUE(placement.ok()) << placement.status();
  c.expert_placement = std::make_shared<const ExpertPlacement>(*placement);
  c.expert_rank = 1;
  LayerWeights layer;
  layer.experts_gate_up_fp8 = RandomFp8(2 * 2 * 64, 128, false, Scheme::kDynamicToken, rng);
  layer.experts_down_fp8 = RandomFp8(2 * 128, 64, false, Scheme::kDynamicToken, rng);
  absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> w = UploadFp8MoeWeights(c, &layer, 4);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ((*w)->gate_up.size(), 3u);
  ASSERT_EQ((*w)->down.size(), 3u);
  std::vector<uint8_t> host(2 * 64 * 128, 0xff);
  ASSERT_EQ(
      cudaMemcpy(host.data(), (*w)->gate_up[2].codes.data(), host.size(), cudaMemcpyDeviceToHost),
      cudaSuccess);
  EXPECT_EQ(std::count(host.begin(), host.end(), 0), static_cast<int64_t>(host.size()));
  // A stacked weight of the wrong size is refused, naming it.
  LayerWeights bad;
  bad.experts_gate_up_fp8 = RandomFp8(3 * 2 * 64, 128, false, Scheme::kDynamicToken, rng);
  bad.experts_down_fp8 = RandomFp8(2 * 128, 64, false, Scheme::kDynamicToken, rng);
  const absl::Status st = UploadFp8MoeWeights(c, &bad, 4).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("experts gate_up"), std::string::npos) << st;
}

}  // namespace
}  // namespace tandem::runtime::cuda
