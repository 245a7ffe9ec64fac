// DeepSeek's MoE layer (kernels/moe GroupedTopK + FusedMoe + the shared experts) against
// transformers 5.17's DeepseekV3MoE / DeepseekV2Moe on random inputs (fixtures_moe_layer/, made
// by make_deepseek_moe_layer.py): V3 noaux_tc grouped (sigmoid, e_score_correction_bias for the
// choice only, top-2-sum group scores, topk_group, normalised, scaled) and ungrouped, V2 greedy
// (norm_topk_prob ignored, scaled) and group_limited_greedy (max group scores). Every routing
// decision in the fixtures is clear by >= 1e-4; the layer output must be within 1e-4 * max|y|.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/linear.h"
#include "kernels/layers/activation.h"
#include "kernels/moe/moe.h"
#include "runtime/model/safetensors.h"

namespace tandem {
namespace {

struct Fixture {
  std::map<std::string, std::vector<float>> tensors;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::string> meta;
};

Fixture Load(const std::string& variant) {
  Fixture f;
  auto file =
      runtime::SafetensorsFile::Open("tests/golden/fixtures_moe_layer/" + variant + ".safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return f;
  for (const runtime::TensorInfo& t : (*file)->tensors()) {
    EXPECT_EQ(t.dtype, runtime::SafetensorsDtype::kF32) << t.name;
    std::vector<float>& v = f.tensors[t.name];
    v.resize(t.nbytes / sizeof(float));
    std::memcpy(v.data(), t.data, t.nbytes);
    f.shapes[t.name] = t.shape;
  }
  f.meta = (*file)->metadata();
  return f;
}

// The layer as the CPU backend runs it: routing, routed experts, shared experts.
std::vector<float> RunLayer(const Fixture& f, bool use_bias) {
  const std::vector<float>& x = f.tensors.at("x");
  const int64_t T = f.shapes.at("x")[0], H = f.shapes.at("x")[1];
  const int64_t E = f.shapes.at("router")[0], I = f.shapes.at("experts_down")[2];
  const int64_t Is = f.shapes.at("shared_down")[1];
  const bool v3 = f.meta.at("version") == "3";
  kernels::GroupedRoutingParams p;
  p.num_experts = E;
  p.top_k = std::stoi(f.meta.at("top_k"));
  p.scoring = v3 ? kernels::MoeScoring::kSigmoid : kernels::MoeScoring::kSoftmax;
  p.num_groups = std::stoi(f.meta.at("n_group"));
  p.topk_groups = std::stoi(f.meta.at("topk_group"));
  p.group_score = v3 ? kernels::MoeGroupScore::kTopTwoSum : kernels::MoeGroupScore::kMax;
  if (v3 && use_bias) p.correction_bias = f.tensors.at("bias").data();
  p.renormalize = v3 && f.meta.at("norm_topk_prob") == "true";  // V2 ignores norm_topk_prob
  p.routed_scaling_factor = std::stof(f.meta.at("routed_scaling_factor"));

  std::vector<float> logits(T * E), out(T * H), gate_up(T * 2 * Is), act(T * Is), shared(T * H);
  kernels::cpu::Linear(x.data(), f.tensors.at("router").data(), nullptr, T, E, H, logits.data(),
                       nullptr);
  kernels::MoeRouting routing;
  EXPECT_TRUE(kernels::cpu::GroupedTopK(logits.data(), T, p, &routing).ok());
  kernels::MoeScratch scratch;
  const kernels::MoeExpertWeights experts{f.tensors.at("experts_gate_up").data(),
                                          f.tensors.at("experts_down").data(), E, H, I};
  EXPECT_TRUE(
      kernels::cpu::FusedMoe(x.data(), routing, experts, out.data(), nullptr, &scratch).ok());
  kernels::cpu::Linear(x.data(), f.tensors.at("shared_gate_up").data(), nullptr, T, 2 * Is, H,
                       gate_up.data(), nullptr);
  kernels::cpu::SiluAndMul(gate_up.data(), T, Is, act.data());
  kernels::cpu::Linear(act.data(), f.tensors.at("shared_down").data(), nullptr, T, H, Is,
                       shared.data(), nullptr);
  for (int64_t i = 0; i < T * H; ++i) out[i] += shared[i];
  return out;
}

// max |a - b| / max |b|.
double MaxRel(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(double{a[i]} - b[i]));
    scale = std::max(scale, std::fabs(double{b[i]}));
  }
  return worst / scale;
}

class DeepseekMoeLayerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepseekMoeLayerTest, MatchesTransformers) {
  const Fixture f = Load(GetParam());
  ASSERT_FALSE(f.tensors.empty());
  ASSERT_EQ(f.meta.at("variant"), GetParam());
  const std::vector<float> out = RunLayer(f, /*use_bias=*/true);
  const double rel = MaxRel(out, f.tensors.at("y"));
  EXPECT_LE(rel, 1e-4) << GetParam();
  char text[32];
  std::snprintf(text, sizeof(text), "%.2e", rel);
  RecordProperty("max_rel", text);
}

// The fixtures tell the routing variants apart: choosing without V3's correction bias (or, for
// V2, with a max where the sum of the top two belongs) gives another layer output.
TEST(DeepseekMoeLayerTest, FixturesDiscriminateTheRouting) {
  const Fixture v3 = Load("v3_noaux_tc_grouped_norm");
  ASSERT_FALSE(v3.tensors.empty());
  EXPECT_GT(MaxRel(RunLayer(v3, /*use_bias=*/false), v3.tensors.at("y")), 1e-2);
  Fixture v2 = Load("v2_group_limited_greedy");
  ASSERT_FALSE(v2.tensors.empty());
  v2.meta["topk_group"] = "4";  // every group kept: plain greedy over all experts
  EXPECT_GT(MaxRel(RunLayer(v2, true), v2.tensors.at("y")), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Variants, DeepseekMoeLayerTest,
                         ::testing::Values("v3_noaux_tc_grouped_norm", "v3_noaux_tc_ungrouped",
                                           "v2_greedy", "v2_group_limited_greedy"));

}  // namespace
}  // namespace tandem
