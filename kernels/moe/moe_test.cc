// kernels/moe against an fp64 reference written here on random inputs: routing (softmax top-k,
// with and without renormalisation), the permutation, the fused layer (random routing, every
// token on one expert, k = E, experts left without tokens, a pool of threads), the gated shared
// expert, and the argument errors.
#include "kernels/moe/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::cpu {
namespace {

std::vector<float> Random(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// fp64 softmax top-k of one token: (ids, weights) in decreasing probability.
void ReferenceTopK(const float* logits, int64_t e_count, int64_t k, bool renormalize,
                   std::vector<int32_t>* ids, std::vector<double>* weights) {
  std::vector<double> p(e_count);
  double max = *std::max_element(logits, logits + e_count), sum = 0;
  for (int64_t e = 0; e < e_count; ++e) sum += p[e] = std::exp(double{logits[e]} - max);
  std::vector<int32_t> order(e_count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  ids->assign(order.begin(), order.begin() + k);
  double chosen = 0;
  for (int64_t j = 0; j < k; ++j) chosen += p[order[j]] / sum;
  weights->clear();
  for (int64_t j = 0; j < k; ++j) {
    weights->push_back(p[order[j]] / sum / (renormalize ? chosen : 1.0));
  }
}

// fp64 SwiGLU expert e on one token.
std::vector<double> ReferenceExpert(const MoeExpertWeights& w, int64_t e, const float* x) {
  const int64_t H = w.hidden, I = w.intermediate;
  std::vector<double> act(I), y(H, 0.0);
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += double{w.gate_up[(e * 2 * I + i) * H + h]} * x[h];
      u += double{w.gate_up[(e * 2 * I + I + i) * H + h]} * x[h];
    }
    act[i] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < I; ++i) y[h] += double{w.down[(e * H + h) * I + i]} * act[i];
  }
  return y;
}

TEST(MoeRoutingTest, SoftmaxTopKMatchesFp64) {
  std::mt19937 rng(11);
  for (auto [e_count, k] : {std::pair<int64_t, int64_t>{8, 2}, {16, 4}, {6, 6}, {5, 1}}) {
    for (bool renormalize : {false, true}) {
      const int64_t T = 9;
      const std::vector<float> logits = Random(rng, T * e_count, 2.0f);
      MoeRouting routing;
      ASSERT_TRUE(SoftmaxTopK(logits.data(), T, {e_count, k, renormalize}, &routing).ok());
      ASSERT_EQ(routing.expert_ids.size(), static_cast<size_t>(T * k));
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> ids;
        std::vector<double> weights;
        ReferenceTopK(logits.data() + t * e_count, e_count, k, renormalize, &ids, &weights);
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(routing.expert_ids[t * k + j], ids[j]) << "token " << t << " j " << j;
          EXPECT_NEAR(routing.weights[t * k + j], weights[j], 1e-6);
          sum += routing.weights[t * k + j];
        }
        if (renormalize) {
          EXPECT_NEAR(sum, 1.0, 1e-6);
        } else if (k < e_count) {
          EXPECT_LT(sum, 1.0);
        }
      }
    }
  }
}

TEST(MoeRoutingTest, RefusesTopKOutsideTheExperts) {
  const std::vector<float> logits(8, 0.5f);
  MoeRouting routing;
  absl::Status s = SoftmaxTopK(logits.data(), 1, {8, 9, false}, &routing);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("top_k 9 must be in [1, 8]"), std::string::npos) << s;
  EXPECT_FALSE(SoftmaxTopK(logits.data(), 1, {8, 0, false}, &routing).ok());
  // Ties resolve to the lower id: all-equal logits pick 0, 1, 2.
  ASSERT_TRUE(SoftmaxTopK(logits.data(), 1, {8, 3, true}, &routing).ok());
  EXPECT_EQ(routing.expert_ids, (std::vector<int32_t>{0, 1, 2}));
}

// DeepSeek's grouped routing on a hand-checked token (transformers' numbers in
// //tests/golden:deepseek_moe_layer_test): groups of 2 experts, the best 2 of 3 groups kept.
TEST(MoeRoutingTest, GroupedTopKKeepsTheBestGroupsAndRefusesBadShapes) {
  // Softmax scores are monotone in the logits: group maxima 3 (g0), 2.5 (g1), 2.9 (g2) -> keep
  // g0 and g2; top-2 among experts {0, 1, 4, 5}: 0 (3.0) and 4 (2.9), not 2 (2.5).
  const std::vector<float> logits = {3.0f, 0.0f, 2.5f, 2.4f, 2.9f, -1.0f};
  GroupedRoutingParams p;
  p.num_experts = 6;
  p.top_k = 2;
  p.num_groups = 3;
  p.topk_groups = 2;
  p.routed_scaling_factor = 2.0f;
  MoeRouting routing;
  ASSERT_TRUE(GroupedTopK(logits.data(), 1, p, &routing).ok());
  EXPECT_EQ(routing.expert_ids, (std::vector<int32_t>{0, 4}));
  double sum = 0;
  for (float l : logits) sum += std::exp(double{l});
  EXPECT_NEAR(routing.weights[0], 2.0 * std::exp(3.0) / sum, 1e-6);
  EXPECT_NEAR(routing.weights[1], 2.0 * std::exp(2.9) / sum, 1e-6);
  // Sigmoid scores with a correction bias that only steers the choice (V3): expert 1's bias
  // makes it chosen, its weight stays its own sigmoid; renormalised then scaled.
  const std::vector<float> bias = {0.0f, 0.9f, 0.0f, 0.0f, 0.0f, 0.0f};
  p.scoring = MoeScoring::kSigmoid;
  p.group_score = MoeGroupScore::kTopTwoSum;
  p.num_groups = 1;
  p.topk_groups = 1;
  p.correction_bias = bias.data();
  p.renormalize = true;
  ASSERT_TRUE(GroupedTopK(logits.data(), 1, p, &routing).ok());
  EXPECT_EQ(routing.expert_ids, (std::vector<int32_t>{1, 0}));  // 0.5 + 0.9 first
  const double s0 = 1 / (1 + std::exp(-3.0)), s1 = 0.5;
  EXPECT_NEAR(routing.weights[0], 2.0 * s1 / (s0 + s1), 1e-6);
  EXPECT_NEAR(routing.weights[1], 2.0 * s0 / (s0 + s1), 1e-6);
  p.num_groups = 4;  // does not divide 6 experts
  absl::Status s = GroupedTopK(logits.data(), 1, p, &routing);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("6 experts, top_k 2, 4 groups"), std::string::npos) << s;
}

TEST(MoePermutationTest, GroupsRowsByExpertStably) {
  MoeRouting routing{3, 2, {2, 0, 0, 2, 1, 2}, {0.6f, 0.4f, 0.7f, 0.3f, 0.9f, 0.1f}};
  MoePermutation p;
  ASSERT_TRUE(PermuteByExpert(routing, 4, &p).ok());
  EXPECT_EQ(p.expert_offsets, (std::vector<int64_t>{0, 2, 3, 6, 6}));
  EXPECT_EQ(p.token_of_row, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(p.weight_of_row, (std::vector<float>{0.4f, 0.7f, 0.9f, 0.6f, 0.3f, 0.1f}));
  routing.expert_ids[3] = 4;
  EXPECT_EQ(PermuteByExpert(routing, 4, &p).code(), absl::StatusCode::kInvalidArgument);
}

// One fused layer against the fp64 per-token loop (a router's decision taken as given).
void CheckFused(const std::vector<float>& x, const MoeRouting& routing, const MoeExpertWeights& w,
                ThreadPool* pool) {
  const int64_t T = routing.num_tokens, H = w.hidden;
  std::vector<float> out(T * H, 123.0f);  // overwritten, not accumulated into
  MoeScratch scratch;
  ASSERT_TRUE(FusedMoe(x.data(), routing, w, out.data(), pool, &scratch).ok());
  double max_ref = 0, max_err = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> ref(H, 0.0);
    for (int64_t j = 0; j < routing.top_k; ++j) {
      const auto y = ReferenceExpert(w, routing.expert_ids[t * routing.top_k + j], &x[t * H]);
      for (int64_t h = 0; h < H; ++h) ref[h] += routing.weights[t * routing.top_k + j] * y[h];
    }
    for (int64_t h = 0; h < H; ++h) {
      max_ref = std::max(max_ref, std::fabs(ref[h]));
      max_err = std::max(max_err, std::fabs(ref[h] - out[t * H + h]));
    }
  }
  EXPECT_GT(max_ref, 1e-3);  // not a vacuous comparison
  EXPECT_LE(max_err, 2e-5 * max_ref) << "max |ref| " << max_ref;
}

TEST(FusedMoeTest, MatchesFp64PerTokenLoop) {
  std::mt19937 rng(7);
  ThreadPool pool(3);
  for (auto [T, e_count, k, H, I] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 8, 2, 32, 24},
        {5, 8, 2, 32, 24},
        {37, 16, 4, 48, 40},
        {20, 4, 4, 16, 8}}) {
    SCOPED_TRACE(testing::Message() << "T " << T << " E " << e_count << " k " << k);
    const std::vector<float> x = Random(rng, T * H, 1.0f);
    const std::vector<float> gate_up = Random(rng, e_count * 2 * I * H, 0.2f);
    const std::vector<float> down = Random(rng, e_count * H * I, 0.2f);
    const std::vector<float> logits = Random(rng, T * e_count, 2.0f);
    const MoeExpertWeights w{gate_up.data(), down.data(), e_count, H, I};
    MoeRouting routing;
    ASSERT_TRUE(SoftmaxTopK(logits.data(), T, {e_count, k, true}, &routing).ok());
    CheckFused(x, routing, w, nullptr);
    CheckFused(x, routing, w, &pool);
  }
}

TEST(FusedMoeTest, OneExpertTakingEveryTokenAndIdleExperts) {
  std::mt19937 rng(3);
  const int64_t T = 12, E = 6, H = 16, I = 8;
  const std::vector<float> x = Random(rng, T * H, 1.0f);
  const std::vector<float> gate_up = Random(rng, E * 2 * I * H, 0.3f);
  std::vector<float> down = Random(rng, E * H * I, 0.3f);
  // Experts 0, 2, 4 get no token: NaN weights there would poison the output if they were read.
  for (int64_t e : {0, 2, 4}) std::fill_n(down.begin() + e * H * I, H * I, std::nanf(""));
  MoeRouting routing{T, 2, {}, {}};
  for (int64_t t = 0; t < T; ++t) {
    routing.expert_ids.insert(routing.expert_ids.end(), {3, t % 2 == 0 ? 1 : 5});
    routing.weights.insert(routing.weights.end(), {0.75f, 0.25f});
  }
  CheckFused(x, routing, {gate_up.data(), down.data(), E, H, I}, nullptr);
}

// FP8 experts (DeepSeek-V3's 128x128 block-scaled e4m3, stacked with per-row scales): with
// activations left unquantized they equal the fp32 experts holding the dequantized weights; with
// dynamic 1x128 activation groups a token's output does not depend on the batch it came in.
TEST(FusedMoeTest, Fp8ExpertsMatchFp32OnTheirDequantizedWeights) {
  std::mt19937 rng(38);
  ThreadPool pool(3);
  const int64_t T = 9, E = 4, k = 2, H = 200, I = 136;  // partial 128-column blocks
  const std::vector<float> x = Random(rng, T * H, 1.0f);
  const std::vector<float> logits = Random(rng, T * E, 2.0f);
  const Fp8ScaleGrid gu_grid{E * 2 * I, H, 1, 128}, dn_grid{E * H, I, 1, 128};
  std::vector<uint8_t> gu_codes(E * 2 * I * H), dn_codes(E * H * I);
  std::vector<float> gu_scales(gu_grid.NumScales()), dn_scales(dn_grid.NumScales());
  QuantizeWeight(Random(rng, E * 2 * I * H, 0.2f).data(), gu_grid, gu_codes.data(),
                 gu_scales.data());
  QuantizeWeight(Random(rng, E * H * I, 0.2f).data(), dn_grid, dn_codes.data(), dn_scales.data());
  MoeExpertWeights fp8{nullptr, nullptr, E, H, I};
  fp8.gate_up_fp8 = {gu_codes.data(), gu_scales.data(), gu_grid, Fp8ActivationScheme::kNone};
  fp8.down_fp8 = {dn_codes.data(), dn_scales.data(), dn_grid, Fp8ActivationScheme::kNone};
  std::vector<float> gate_up(E * 2 * I * H), down(E * H * I);
  DequantizeFp8Weight(fp8.gate_up_fp8, 0, E * 2 * I, gate_up.data());
  DequantizeFp8Weight(fp8.down_fp8, 0, E * H, down.data());
  MoeRouting routing;
  ASSERT_TRUE(SoftmaxTopK(logits.data(), T, {E, k, true}, &routing).ok());
  MoeScratch scratch;
  std::vector<float> want(T * H), got(T * H);
  ASSERT_TRUE(FusedMoe(x.data(), routing, {gate_up.data(), down.data(), E, H, I}, want.data(),
                       &pool, &scratch)
                  .ok());
  ASSERT_TRUE(FusedMoe(x.data(), routing, fp8, got.data(), &pool, &scratch).ok());
  double max_ref = 0, max_err = 0;
  for (int64_t i = 0; i < T * H; ++i) {
    max_ref = std::max(max_ref, std::fabs(double{want[i]}));
    max_err = std::max(max_err, std::fabs(double{got[i]} - want[i]));
  }
  EXPECT_GT(max_ref, 1e-2);
  EXPECT_LE(max_err, 1e-5 * max_ref);
  // Dynamic 1x128 groups: token by token equals the whole batch.
  fp8.gate_up_fp8.activation = fp8.down_fp8.activation = Fp8ActivationScheme::kDynamicGroup128;
  ASSERT_TRUE(FusedMoe(x.data(), routing, fp8, got.data(), &pool, &scratch).ok());
  double max_diff_deq = 0;
  for (int64_t t = 0; t < T; ++t) {
    MoeRouting one{1,
                   k,
                   {routing.expert_ids.begin() + t * k, routing.expert_ids.begin() + t * k + k},
                   {routing.weights.begin() + t * k, routing.weights.begin() + t * k + k}};
    std::vector<float> row(H);
    ASSERT_TRUE(FusedMoe(x.data() + t * H, one, fp8, row.data(), nullptr, &scratch).ok());
    for (int64_t h = 0; h < H; ++h) {
      EXPECT_NEAR(row[h], got[t * H + h], 1e-5f * static_cast<float>(max_ref));
      max_diff_deq = std::max(max_diff_deq, std::fabs(double{row[h]} - want[t * H + h]));
    }
  }
  EXPECT_GT(max_diff_deq, 0.0);  // the activations were quantized
  EXPECT_LE(max_diff_deq, 0.1 * max_ref);
  // A view that is not the stacked shape is refused.
  fp8.down_fp8.grid.rows = E * H - 1;
  EXPECT_EQ(FusedMoe(x.data(), routing, fp8, got.data(), nullptr, &scratch).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FusedMoeTest, SigmoidGatedSharedExpert) {
  std::mt19937 rng(5);
  const int64_t T = 4, H = 24;
  const std::vector<float> x = Random(rng, T * H, 1.0f), gate = Random(rng, H, 0.5f);
  const std::vector<float> shared = Random(rng, T * H, 1.0f);
  std::vector<float> out = Random(rng, T * H, 1.0f);
  const std::vector<float> before = out;
  AddSigmoidGated(x.data(), gate.data(), shared.data(), T, H, out.data());
  for (int64_t t = 0; t < T; ++t) {
    double dot = 0;
    for (int64_t h = 0; h < H; ++h) dot += double{gate[h]} * x[t * H + h];
    const double g = 1.0 / (1.0 + std::exp(-dot));
    for (int64_t h = 0; h < H; ++h) {
      EXPECT_NEAR(out[t * H + h], before[t * H + h] + g * shared[t * H + h], 1e-5);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu
