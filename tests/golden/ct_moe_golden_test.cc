// compressed-tensors FP8 checkpoints of a mixture-of-experts model on the CPU backend (issue 38):
// tests/golden/fixtures_fp8/ct_moe_channel_dynamic{,_pkg} (make_golden_ct_moe.py: a random tiny
// Qwen3-MoE in llm-compressor's FP8_DYNAMIC form, written by our writer and by the real
// compressed-tensors package: every decoder Linear, routed experts included, e4m3 with a
// per-channel weight_scale, dynamic per-token activations, the router mlp.gate and lm_head bf16
// through `ignore` (a regex, or every ignored module by name as the package saves it)) against
// transformers in f32 on each checkpoint's dequantized weights.
//   * experts and projections stay e4m3 (fp32 vectors empty), the router fp32;
//   * activations left unquantized: logits within 1e-4 * max|logit| (so cosine >= 0.999999) and
//     every first greedy token equal;
//   * dynamic per-token activations (as served): cosine >= 0.999 to transformers quantizing every
//     FP8 Linear's input per token the same way (hooks; fused experts included) and the first
//     token equal where that reference's top-2 gap is >= 3% of max|logit| (measured: cosine
//     1.000000 on 9 of 10 prompt x fixture pairs, 0.99948 on one); the cosine to the
//     weights-alone reference is printed (0.9836-0.9993: activation rounding moves this random
//     MoE's routing);
//   * an ignore entry naming an FP8 projection is refused at load, naming the module and entry.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_source.h"
#include "runtime/model/model_weights.h"
#include "tests/golden/gap_golden.h"
#include "tests/golden/logit_compare.h"
#include "tests/golden/prompt_run.h"

namespace tandem::runtime {
namespace {

constexpr float kGapFraction = 0.03f;
constexpr double kCosineActivations = 0.999;

using golden::ArgMax;
using golden::Cosine;
using golden::MaxAbs;

using Golden = golden::GapGolden;

// The weights-alone reference, or (`suffix` "_act_quant") the per-token activation one.
Golden LoadGolden(const std::string& dir, const std::string& suffix = "") {
  return golden::LoadGapGolden(dir, suffix);
}

absl::StatusOr<LoadedModel> Load(const std::string& dir) {
  ModelSource source;
  source.model_dir = dir;
  return LoadModel(source);
}

// Every FP8 slot a layer of these fixtures holds (MoE layers: experts; dense: gate/up/down).
std::vector<Fp8LinearWeight*> Fp8Slots(const ModelConfig& c, int64_t l, LayerWeights* w) {
  std::vector<Fp8LinearWeight*> slots = {&w->qkv_fp8, &w->o_fp8};
  if (c.IsMoeLayer(l)) {
    slots.push_back(&w->experts_gate_up_fp8);
    slots.push_back(&w->experts_down_fp8);
  } else {
    slots.push_back(&w->gate_up_fp8);
    slots.push_back(&w->down_fp8);
  }
  return slots;
}

PromptRun RunPrompts(const std::string& dir, const Golden& g, bool weight_only) {
  absl::StatusOr<LoadedModel> model = Load(dir);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return EmptyPromptRun(g.prompts.size());
  for (int64_t l = 0; l < model->config.num_hidden_layers; ++l) {
    for (Fp8LinearWeight* fp8 : Fp8Slots(model->config, l, &model->weights.layers[l])) {
      EXPECT_FALSE(fp8->empty()) << "layer " << l;
      if (weight_only) fp8->activation = kernels::Fp8ActivationScheme::kNone;
    }
  }
  auto engine = Engine::Create(EngineConfig(), model->config, std::move(model->weights));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return EmptyPromptRun(g.prompts.size());
  return RunPromptsOnce(**engine, g.prompts);
}

class CtMoeGoldenTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::string Dir() const { return std::string("tests/golden/fixtures_fp8/") + GetParam(); }
};

TEST_P(CtMoeGoldenTest, ExpertsStayE4m3PerChannelAndTheRouterFp32) {
  absl::StatusOr<LoadedModel> model = Load(Dir());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = model->config;
  ASSERT_TRUE(c.IsMoe());
  EXPECT_EQ(c.quantization.Describe(),
            "fp8 compressed-tensors: per-channel weight scales, dynamic per-token activations");
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    LayerWeights& w = model->weights.layers[l];
    for (Fp8LinearWeight* fp8 : Fp8Slots(c, l, &w)) {
      EXPECT_FALSE(fp8->empty());
      EXPECT_EQ(fp8->grid.block_rows, 1);
      EXPECT_EQ(fp8->grid.block_cols, fp8->grid.cols);  // one scale per output channel
    }
    EXPECT_TRUE(w.qkv_proj.empty() && w.o_proj.empty() && w.gate_up_proj.empty() &&
                w.down_proj.empty() && w.experts_gate_up.empty() && w.experts_down.empty());
    if (!c.IsMoeLayer(l)) continue;
    ++moe_layers;
    EXPECT_EQ(static_cast<int64_t>(w.router.size()), E * H);  // mlp.gate: bf16, ignored
    EXPECT_EQ(w.experts_gate_up_fp8.grid.rows, E * 2 * I);
    EXPECT_EQ(w.experts_down_fp8.grid.rows, E * H);
  }
  EXPECT_EQ(moe_layers, 2);
}

TEST_P(CtMoeGoldenTest, WeightsAloneMatchTransformersToF32Rounding) {
  const Golden g = LoadGolden(Dir());
  const PromptRun run = RunPrompts(Dir(), g, /*weight_only=*/true);
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    ASSERT_EQ(run.logits[i].size(), g.logits[i].size());
    float worst = 0;
    for (size_t v = 0; v < g.logits[i].size(); ++v) {
      worst = std::max(worst, std::fabs(run.logits[i][v] - g.logits[i][v]));
    }
    EXPECT_LE(worst, 1e-4f * MaxAbs(g.logits[i]));
    EXPECT_GE(Cosine(run.logits[i], g.logits[i]), 0.999999);
    EXPECT_EQ(run.first[i], g.first_tokens[i]);
    std::printf("%s weights alone, prompt %zu: max |diff| / max|logit| %.2e\n", GetParam(), i,
                worst / MaxAbs(g.logits[i]));
  }
}

TEST_P(CtMoeGoldenTest, DynamicTokenActivationsMatchTransformersQuantizingThemAlike) {
  const Golden g = LoadGolden(Dir(), "_act_quant");
  const Golden weights_alone = LoadGolden(Dir());
  const PromptRun run = RunPrompts(Dir(), g, /*weight_only=*/false);
  int checked_tokens = 0;
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    ASSERT_EQ(run.logits[i].size(), g.logits[i].size());
    const double cosine = Cosine(run.logits[i], g.logits[i]);
    EXPECT_GE(cosine, kCosineActivations);
    EXPECT_EQ(run.first[i], ArgMax(run.logits[i]));
    const float gap = g.gaps[i] / MaxAbs(g.logits[i]);
    if (gap >= kGapFraction) {
      EXPECT_EQ(run.first[i], g.first_tokens[i]) << "reference gap/max " << gap;
      ++checked_tokens;
    }
    std::printf(
        "%s per-token activations, prompt %zu: cosine %.6f (%.6f to the weights alone), gap/max "
        "%.4f, token %d vs %d\n",
        GetParam(), i, cosine, Cosine(run.logits[i], weights_alone.logits[i]), gap, run.first[i],
        g.first_tokens[i]);
  }
  EXPECT_GE(checked_tokens, 2) << "too few prompts with a clear greedy token";
}

TEST_P(CtMoeGoldenTest, AnIgnoreEntryNamingAnFp8ProjectionIsRefused) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(Dir());
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(LoadModelWeights(Dir(), *config).ok());
  for (const std::string entry : {"model.layers.2.mlp.experts.5.down_proj", "re:.*self_attn"}) {
    ModelConfig bad = *config;
    bad.quantization.ignore.push_back(entry);
    const absl::StatusOr<ModelWeights> refused = LoadModelWeights(Dir(), bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("(entry '" + entry + "')"), std::string::npos)
        << refused.status();
  }
}

INSTANTIATE_TEST_SUITE_P(OurWriterAndThePackage, CtMoeGoldenTest,
                         ::testing::Values("ct_moe_channel_dynamic", "ct_moe_channel_dynamic_pkg"));

}  // namespace
}  // namespace tandem::runtime
