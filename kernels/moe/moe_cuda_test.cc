// The CUDA MoE routing and permutation kernels against the CPU reference (moe.h) on fresh random
// inputs (the experts and the combine: moe_cuda_layer_test.cc):
//   * MoeRoute: every routing variant (softmax top-k with and without renormalisation, DeepSeek
//     V2 greedy / group-limited, V3 noaux_tc with bias, top-2 group sums and scaling): the same
//     expert ids, weights within 2e-6; exact ties (logits from a 3-value set) broken to the
//     lower id as on the CPU.
//   * MoePermute: offsets, stable row order and pair -> row map equal to PermuteByExpert's,
//     skewed routings with empty experts and one expert taking every token; the load counters
//     add up over calls.
//   * MoeRouteAndPermute (one launch) equal bit for bit to MoeRoute + MoePermute and to the CPU,
//     plain and PDL-launched, every routing variant, up to 1024 pairs, ties, no tokens; at the
//     decode sizes T = 1, 2, 7, 16 every variant also on unspread normal logits (near ties, the
//     two launches still bit for bit) and on exact ties.
#include "kernels/moe/moe_cuda.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using moe_cuda_test::DevicePerm;
using moe_cuda_test::DeviceRouting;
using moe_cuda_test::MakePerm;
using moe_cuda_test::Poison;
using moe_cuda_test::RouteOnDevice;
using moe_cuda_test::SpreadLogits;

void ExpectRoutingMatches(const std::vector<float>& logits, int64_t T, GroupedRoutingParams p,
                          const std::vector<float>& bias, const char* what) {
  SCOPED_TRACE(what);
  if (!bias.empty()) p.correction_bias = bias.data();
  MoeRouting want;
  ASSERT_TRUE(cpu::GroupedTopK(logits.data(), T, p, &want).ok());
  const DeviceRouting got = RouteOnDevice(logits, T, p, bias);
  EXPECT_EQ(got.ids.ToHost(), want.expert_ids);
  const std::vector<float> w = got.weights.ToHost();
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_NEAR(w[i], want.weights[i], 2e-6 * std::max(1.0f, std::abs(want.weights[i])))
        << "pair " << i;
  }
}

TEST(MoeCudaTest, RouteMatchesCpuEveryVariant) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  const int64_t T = 29;
  for (int64_t E : {8, 64, 160}) {
    const std::vector<float> logits = SpreadLogits(T, E, rng);
    GroupedRoutingParams p;
    p.num_experts = E;
    p.top_k = std::min<int64_t>(E, 6);
    ExpectRoutingMatches(logits, T, p, {}, "softmax top-k");
    p.renormalize = true;
    ExpectRoutingMatches(logits, T, p, {}, "softmax top-k renormalised");
    if (E <= 64) {  // MoeRoute takes top_k <= 64
      p.top_k = E;
      ExpectRoutingMatches(logits, T, p, {}, "k = E");
    }
    // DeepSeek-V2 group_limited_greedy: max group score, zero-masked softmax, scaled.
    p.top_k = std::min<int64_t>(E / 2, 6);
    p.renormalize = false;
    p.num_groups = E >= 64 ? 8 : 4;
    p.topk_groups = 3;
    p.routed_scaling_factor = 16.0f;
    ExpectRoutingMatches(logits, T, p, {}, "V2 group-limited");
    // DeepSeek-V3 noaux_tc: sigmoid, bias for the choice only, top-2 group sums, renormalised.
    p.scoring = MoeScoring::kSigmoid;
    p.group_score = MoeGroupScore::kTopTwoSum;
    p.renormalize = true;
    p.routed_scaling_factor = 2.5f;
    std::vector<float> bias(E);
    for (int64_t e = 0; e < E; ++e) bias[e] = 0.001f * static_cast<float>((e * 37) % E);
    ExpectRoutingMatches(logits, T, p, bias, "V3 noaux_tc");
    p.num_groups = 1;
    p.topk_groups = 1;
    ExpectRoutingMatches(logits, T, p, bias, "V3 one group");
  }
}

TEST(MoeCudaTest, RouteBreaksExactTiesToTheLowerId) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  const int64_t T = 41, E = 32;
  std::vector<float> logits(T * E);
  std::uniform_int_distribution<int> pick(0, 2);
  for (float& l : logits) l = 0.5f * static_cast<float>(pick(rng));  // many equal logits
  GroupedRoutingParams p;
  p.num_experts = E;
  p.top_k = 5;
  p.renormalize = true;
  ExpectRoutingMatches(logits, T, p, {}, "softmax ties");
  p.num_groups = 4;
  p.topk_groups = 2;
  ExpectRoutingMatches(logits, T, p, {}, "group ties");
}

TEST(MoeCudaTest, RouteRefusesBadParams) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<float> logits(64), w(64);
  DeviceBuffer<int32_t> ids(64);
  GroupedRoutingParams p;
  p.num_experts = 4;
  p.top_k = 5;
  EXPECT_FALSE(MoeRoute(logits.get(), 1, p, ids.get(), w.get(), nullptr).ok());
  p.num_experts = kMoeMaxExperts + 1;
  p.top_k = 2;
  EXPECT_FALSE(MoeRoute(logits.get(), 1, p, ids.get(), w.get(), nullptr).ok());
}

void CheckPermutation(const MoeRouting& routing, int64_t E) {
  const int64_t rows = routing.num_tokens * routing.top_k;
  MoePermutation want;
  ASSERT_TRUE(cpu::PermuteByExpert(routing, E, &want).ok());
  DeviceBuffer<int32_t> ids(routing.expert_ids);
  DevicePerm perm = MakePerm(E, rows);
  DeviceBuffer<int64_t> load(std::vector<int64_t>(E, 0));
  for (int call = 0; call < 2; ++call) {
    ASSERT_TRUE(MoePermute(ids.get(), routing.num_tokens, routing.top_k, E, perm.view(), load.get(),
                           nullptr)
                    .ok());
  }
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int32_t> offsets = perm.offsets.ToHost();
  std::vector<int32_t> active;
  for (int64_t e = 0; e < E; ++e) {
    ASSERT_EQ(offsets[e], want.expert_offsets[e]) << "expert " << e;
    if (want.expert_offsets[e + 1] > want.expert_offsets[e]) active.push_back(e);
  }
  ASSERT_EQ(offsets[E], rows);
  active.resize(E, -1);
  EXPECT_EQ(perm.active.ToHost(), active);
  const std::vector<int32_t> tokens = perm.token_of_row.ToHost();
  const std::vector<int32_t> row_of_pair = perm.row_of_pair.ToHost();
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_EQ(tokens[r], want.token_of_row[r]) << "row " << r;
    ASSERT_EQ(want.weight_of_row[row_of_pair[r]], routing.weights[r]) << "pair " << r;
  }
  const std::vector<int64_t> got_load = load.ToHost();
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(got_load[e], 2 * (want.expert_offsets[e + 1] - want.expert_offsets[e]));
  }
}

TEST(MoeCudaTest, PermuteMatchesCpuOnSkewedRoutings) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (auto [T, E, k] : std::vector<std::array<int64_t, 3>>{
           {1, 8, 2}, {7, 16, 4}, {300, 128, 8}, {2000, 64, 6}, {33, 512, 3}}) {
    SCOPED_TRACE(::testing::Message() << "T " << T << " E " << E << " k " << k);
    MoeRouting routing;
    routing.num_tokens = T;
    routing.top_k = k;
    // Skewed: experts drawn from the first quarter mostly (the rest often empty).
    std::geometric_distribution<int> skew(4.0 / E);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> chosen;
      while (static_cast<int64_t>(chosen.size()) < k) {
        const int32_t e = static_cast<int32_t>(skew(rng) % E);
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      for (int32_t e : chosen) {
        routing.expert_ids.push_back(e);
        routing.weights.push_back(std::uniform_real_distribution<float>(0, 1)(rng));
      }
    }
    CheckPermutation(routing, E);
    // One expert receives every token (the first pick of each).
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) routing.expert_ids[t * k + j] = static_cast<int32_t>(j);
    }
    CheckPermutation(routing, E);
  }
}

// MoeRouteAndPermute (one launch) against MoeRoute + MoePermute, bit for bit (ids, weights,
// offsets, active list, rows, load counters), launched plainly and with PDL on a stream behind
// another kernel; and against the CPU (GroupedTopK's ids, weights within 2e-6, PermuteByExpert's
// offsets and row order).
void CheckRouteAndPermute(const std::vector<float>& logits, int64_t T, GroupedRoutingParams p,
                          const std::vector<float>& bias, const char* what,
                          bool against_cpu = true) {
  const int64_t E = p.num_experts, k = p.top_k, rows = T * k;
  SCOPED_TRACE(::testing::Message() << what << ": T " << T << " E " << E << " k " << k);
  ASSERT_TRUE(MoeRouteAndPermuteSupported(p, T));
  DeviceBuffer<float> d_logits(logits), d_bias(bias);
  GroupedRoutingParams dp = p;
  if (!bias.empty()) dp.correction_bias = d_bias.get();
  const size_t n = static_cast<size_t>(std::max<int64_t>(rows, 1));
  DeviceBuffer<int32_t> ids_a(n), ids_other(n);
  DeviceBuffer<float> w_a(n), w_other(n);
  DevicePerm perm_a = MakePerm(E, rows);
  DeviceBuffer<int64_t> load_a(std::vector<int64_t>(E, 0)), load_b(std::vector<int64_t>(E, 0));
  ASSERT_TRUE(MoeRoute(d_logits.get(), T, dp, ids_a.get(), w_a.get(), nullptr).ok());
  ASSERT_TRUE(MoePermute(ids_a.get(), T, k, E, perm_a.view(), load_a.get(), nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (bool pdl : {false, true}) {
    SCOPED_TRACE(pdl ? "PDL" : "plain");
    DeviceBuffer<int32_t> ids_b(n);
    DeviceBuffer<float> w_b(n);
    DevicePerm perm_b = MakePerm(E, rows);
    Poison(ids_b);
    Poison(w_b);
    Poison(perm_b.offsets);
    Poison(perm_b.active);
    Poison(perm_b.token_of_row);
    Poison(perm_b.row_of_pair);
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    // A preceding kernel on the stream (what a PDL launch overlaps).
    ASSERT_TRUE(MoeRoute(d_logits.get(), T, dp, ids_other.get(), w_other.get(), stream).ok());
    ASSERT_TRUE(MoeRouteAndPermute(d_logits.get(), T, dp, ids_b.get(), w_b.get(), perm_b.view(),
                                   load_b.get(), stream, pdl)
                    .ok());
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (rows > 0) {
      EXPECT_EQ(ids_b.ToHost(), ids_a.ToHost());
      EXPECT_EQ(w_b.ToHost(), w_a.ToHost());
      EXPECT_EQ(perm_b.token_of_row.ToHost(), perm_a.token_of_row.ToHost());
      EXPECT_EQ(perm_b.row_of_pair.ToHost(), perm_a.row_of_pair.ToHost());
    }
    EXPECT_EQ(perm_b.offsets.ToHost(), perm_a.offsets.ToHost());
    EXPECT_EQ(perm_b.active.ToHost(), perm_a.active.ToHost());
    if (pdl && rows > 0 && against_cpu) {  // against the CPU reference
      GroupedRoutingParams hp = p;
      if (!bias.empty()) hp.correction_bias = bias.data();
      MoeRouting want;
      ASSERT_TRUE(cpu::GroupedTopK(logits.data(), T, hp, &want).ok());
      ASSERT_EQ(ids_b.ToHost(), want.expert_ids);
      const std::vector<float> w = w_b.ToHost();
      for (int64_t i = 0; i < rows; ++i) {
        ASSERT_NEAR(w[i], want.weights[i], 2e-6 * std::max(1.0f, std::abs(want.weights[i])))
            << "pair " << i;
      }
      MoePermutation want_perm;
      ASSERT_TRUE(cpu::PermuteByExpert(want, E, &want_perm).ok());
      const std::vector<int32_t> offsets = perm_b.offsets.ToHost();
      EXPECT_EQ(std::vector<int64_t>(offsets.begin(), offsets.end()), want_perm.expert_offsets);
      EXPECT_EQ(perm_b.token_of_row.ToHost(), want_perm.token_of_row);
    }
  }
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
  const std::vector<int64_t> a = load_a.ToHost(), b = load_b.ToHost();
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ(b[e], 2 * a[e]) << "load of expert " << e;
}

TEST(MoeCudaTest, RouteAndPermuteMatchesSeparateKernelsAndCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (int64_t T : {1, 3, 16}) {
    GroupedRoutingParams p;  // Mixtral
    p.num_experts = 8;
    p.top_k = 2;
    p.renormalize = true;
    CheckRouteAndPermute(SpreadLogits(T, 8, rng), T, p, {}, "Mixtral");
    p.num_experts = 128;  // Qwen3-30B-A3B
    p.top_k = 8;
    CheckRouteAndPermute(SpreadLogits(T, 128, rng), T, p, {}, "Qwen3-MoE");
  }
  GroupedRoutingParams p;  // DeepSeek-V2 group-limited, 64 experts
  p.num_experts = 64;
  p.top_k = 6;
  p.num_groups = 8;
  p.topk_groups = 3;
  p.routed_scaling_factor = 16.0f;
  CheckRouteAndPermute(SpreadLogits(16, 64, rng), 16, p, {}, "V2 group-limited");
  p.scoring = MoeScoring::kSigmoid;  // V3 noaux_tc with a bias
  p.group_score = MoeGroupScore::kTopTwoSum;
  p.renormalize = true;
  p.routed_scaling_factor = 2.5f;
  std::vector<float> bias(64);
  for (int64_t e = 0; e < 64; ++e) bias[e] = 0.001f * static_cast<float>((e * 37) % 64);
  CheckRouteAndPermute(SpreadLogits(13, 64, rng), 13, p, bias, "V3 noaux_tc");
  // The most pairs one launch takes (several tokens per warp), and exact ties.
  GroupedRoutingParams q;
  q.num_experts = 128;
  q.top_k = 8;
  q.renormalize = true;
  CheckRouteAndPermute(SpreadLogits(128, 128, rng), 128, q, {}, "1024 pairs");
  std::vector<float> ties(9 * 32);
  std::uniform_int_distribution<int> pick(0, 2);
  for (float& l : ties) l = 0.5f * static_cast<float>(pick(rng));
  q.num_experts = 32;
  q.top_k = 5;
  CheckRouteAndPermute(ties, 9, q, {}, "ties");
  CheckRouteAndPermute({}, 0, q, {}, "no tokens");
  // Refused: too many experts or pairs for one block.
  DeviceBuffer<float> logits(8192), w(2048);
  DeviceBuffer<int32_t> ids(2048);
  DevicePerm perm = MakePerm(256, 2048);
  q.num_experts = 256;
  q.top_k = 8;
  EXPECT_FALSE(MoeRouteAndPermuteSupported(q, 1));
  EXPECT_FALSE(
      MoeRouteAndPermute(logits.get(), 1, q, ids.get(), w.get(), perm.view(), nullptr, nullptr)
          .ok());
  q.num_experts = 64;
  EXPECT_FALSE(
      MoeRouteAndPermute(logits.get(), 129, q, ids.get(), w.get(), perm.view(), nullptr, nullptr)
          .ok());
}

// The fused launch's register routing against MoeRoute's (and the CPU where the inputs are
// spread) at the decode step sizes, every routing variant the models use.
struct FusedVariant {
  const char* name;
  int64_t E, k, groups, topk_groups;
  bool sigmoid, top_two_sum, renormalize, bias;
  float scale;
};

TEST(MoeCudaTest, FusedRouteEveryVariantAtDecodeSizes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  const FusedVariant variants[] = {
      {"Mixtral", 8, 2, 1, 1, false, false, true, false, 1.0f},
      {"softmax top-k, 60 experts", 60, 4, 1, 1, false, false, false, false, 1.0f},
      {"Qwen3 norm_topk_prob", 128, 8, 1, 1, false, false, true, false, 1.0f},
      {"V2-Lite greedy", 64, 6, 1, 1, false, false, false, false, 1.0f},
      {"V2 group_limited_greedy", 128, 6, 8, 3, false, false, false, false, 16.0f},
      {"V3 noaux_tc", 128, 8, 8, 4, true, true, true, true, 2.5f},
      {"V3 noaux_tc, 32 groups", 128, 8, 32, 5, true, true, true, true, 2.5f},
      {"V3 noaux_tc, 64 groups of 2", 128, 8, 64, 10, true, true, true, true, 2.5f},
      {"sigmoid, one group", 96, 8, 1, 1, true, false, true, true, 2.5f},
      {"k = 64", 128, 64, 1, 1, false, false, true, false, 1.0f},
  };
  std::uniform_int_distribution<int> pick(0, 2);
  std::uniform_real_distribution<float> small(-0.1f, 0.1f);
  for (const FusedVariant& v : variants) {
    GroupedRoutingParams p;
    p.num_experts = v.E;
    p.top_k = v.k;
    p.num_groups = v.groups;
    p.topk_groups = v.topk_groups;
    p.scoring = v.sigmoid ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
    p.group_score = v.top_two_sum ? MoeGroupScore::kTopTwoSum : MoeGroupScore::kMax;
    p.renormalize = v.renormalize;
    p.routed_scaling_factor = v.scale;
    std::vector<float> spread_bias, random_bias;
    for (int64_t e = 0; v.bias && e < v.E; ++e) {
      spread_bias.push_back(0.001f * static_cast<float>((e * 37) % v.E));
      random_bias.push_back(small(rng));
    }
    for (int64_t T : {1, 2, 7, 16}) {
      CheckRouteAndPermute(SpreadLogits(T, v.E, rng), T, p, spread_bias, v.name);
      CheckRouteAndPermute(moe_cuda_test::Normal(T * v.E, 1.0f, rng), T, p, random_bias, v.name,
                           /*against_cpu=*/false);
      std::vector<float> ties(T * v.E);
      for (float& l : ties) l = 0.5f * static_cast<float>(pick(rng));
      CheckRouteAndPermute(ties, T, p, spread_bias, v.name, /*against_cpu=*/!v.bias);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
