// FP8 KV on the CPU engine (--kv_cache_dtype=fp8): DeepSeek MLA latents (runtime/engine/
// kv_layout.h, Fp8LatentPool; kernels/mla/mla_fp8_latent.h: one scale per row) on every MLA fixture
// of make_golden_mla.py and make_golden_deepseek_moe.py, and the K / V of the other families
// (kernels/attention Fp8KvCacheView: one scale per layer's K or V, 1 without calibration) on
// make_golden.py's GQA / MQA / MoE fixtures; against transformers' f32 logits and against the same
// engine with an f32 pool.
//
// Tolerance (stated, measured on these fixtures in the comments; MoE fixtures on the prompts whose
// routing FP8 cannot flip, RoutingClearUnderFp8): e4m3 keeps 3 mantissa bits, so a value moves by
// up to 2^-4 of itself. Latents (a scale per row): the last-prompt logits stay within cosine 0.995
// of transformers (measured >= 0.9971) and max |logit diff| <= 0.15 * max|logit| (measured <=
// 0.091). K / V (a scale per layer's K or V): every K and V value of every head carries that
// error into the scores (these tiny random models attend sharply), so cosine >= 0.98 and <= 0.25
// (measured >= 0.9860 and <= 0.175, llama_f32_gqa / mistral_f32 prompt 3; the same 0.173 with
// calibrated scales of 0.02, so it is the mantissa, not the range). The first greedy token equals
// transformers' wherever its top-2 gap is >= 0.3 / 0.5 * max|logit| (twice the bound: nothing below
// it can flip). The tiny random fixtures' greedy gaps are ~1e-3 of max|logit|, so later tokens may
// part; the count of prompts whose 16 tokens all equal is printed.
//
// Within FP8, the engine's modes must agree: the batch, chunked prefill (7 tokens), a pool of 8
// blocks (preemption by recompute) and the prefix pair (the second prompt's 32-token prefix read
// from the first one's cached FP8 blocks) against each prompt run alone: logits within 1e-3 *
// max|logit| (the values are quantized from the same f32 rows, which batch shapes move by ~1e-6),
// first tokens equal.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/engine/model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "tests/golden/mla_golden_fixture.h"

namespace tandem::runtime {
namespace {

// Runs `order`'s prompts on a CPU engine whose latent pool is `kv_dtype`, each alone or all
// together; *hits: the prefix-cache hit tokens.
// The fixture directory of a test parameter: tests/golden/<fixtures dir>/<variant>.
std::string Dir(const std::string& param) { return "tests/golden/" + param; }

// `edit` (may be null) changes the weights before the engine takes them.
std::vector<Output> RunEngine(const std::string& variant, const Golden& g, EngineConfig config,
                              KvDtype kv_dtype, const std::vector<int>& order, bool together,
                              int64_t* hits = nullptr, void (*edit)(ModelWeights&) = nullptr) {
  const std::string dir = Dir(variant);
  auto model_config = LoadModelConfig(dir);
  EXPECT_TRUE(model_config.ok()) << model_config.status();
  auto weights = LoadModelWeights(dir, *model_config);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (weights.ok() && edit != nullptr) edit(*weights);
  const ExecutorFactory factory = CpuExecutorFactory(2, nullptr, 1, 0, kv_dtype);
  auto engine = Engine::Create(config, *model_config, std::move(*weights), {}, &factory);
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::vector<Output> out(g.prompts.size());
  if (!engine.ok()) return out;
  EXPECT_EQ((*engine)->kv_dtype(), kv_dtype);
  auto drain = [&] {
    while ((*engine)->HasUnfinished()) {
      auto updates = (*engine)->Step();
      ASSERT_TRUE(updates.ok()) << updates.status();
      for (RequestUpdate& u : *updates) {
        Output& o = out[u.request_id];
        o.tokens.insert(o.tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
        if (!u.last_prompt_logits.empty()) o.logits = std::move(u.last_prompt_logits);
      }
    }
  };
  for (int i : order) {
    RequestSpec spec;
    spec.prompt = g.prompts[i];
    spec.max_tokens = g.max_new_tokens;
    spec.ignore_eos = true;
    spec.capture_last_prompt_logits = true;
    EXPECT_TRUE((*engine)->AddRequest(i, spec).ok());
    if (!together) drain();
  }
  drain();
  if (hits != nullptr) *hits = (*engine)->kv_cache_stats().prefix_hit_tokens;
  return out;
}

struct Diff {
  double cosine = 1, max_rel = 0;  // max |a - b| / max|b|
};

Diff Compare(const std::vector<float>& a, const std::vector<float>& b) {
  Diff d;
  double ab = 0, aa = 0, bb = 0, max_b = 0, worst = 0;
  for (size_t v = 0; v < a.size() && v < b.size(); ++v) {
    ab += double{a[v]} * b[v];
    aa += double{a[v]} * a[v];
    bb += double{b[v]} * b[v];
    max_b = std::max(max_b, std::fabs(double{b[v]}));
    worst = std::max(worst, std::fabs(double{a[v]} - b[v]));
  }
  d.cosine = ab / std::sqrt(aa * bb);
  d.max_rel = worst / max_b;
  return d;
}

// Greedy top-2 gap of `logits` relative to max|logit|.
double RelativeGap(const std::vector<float>& logits) {
  std::vector<float> top(logits);
  std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
  double m = 0;
  for (float x : logits) m = std::max(m, std::fabs(double{x}));
  return (top[0] - top[1]) / m;
}

// `out`'s prompts `which` against `ref` (same prompts): logits within max_rel of max|logit| and
// cosine >= min_cos; first tokens equal where ref's gap is >= first_token_gap.
void Check(const std::vector<Output>& out, const std::vector<std::vector<float>>& ref_logits,
           const std::vector<std::vector<int32_t>>& ref_tokens, const std::vector<int>& which,
           double min_cos, double max_rel, double first_token_gap, const std::string& what) {
  double worst_cos = 1, worst_rel = 0;
  int all_equal = 0;
  for (int i : which) {
    SCOPED_TRACE(what + ", prompt " + std::to_string(i));
    ASSERT_EQ(out[i].logits.size(), ref_logits[i].size());
    ASSERT_EQ(out[i].tokens.size(), ref_tokens[i].size());
    const Diff d = Compare(out[i].logits, ref_logits[i]);
    worst_cos = std::min(worst_cos, d.cosine);
    worst_rel = std::max(worst_rel, d.max_rel);
    EXPECT_GE(d.cosine, min_cos);
    EXPECT_LE(d.max_rel, max_rel);
    if (RelativeGap(ref_logits[i]) >= first_token_gap) {
      EXPECT_EQ(out[i].tokens[0], ref_tokens[i][0]);
    }
    all_equal += out[i].tokens == ref_tokens[i];
  }
  std::printf("%s: cosine >= %.5f, max |logit diff| %.2e of max, %d/%zu prompts' tokens equal\n",
              what.c_str(), worst_cos, worst_rel, all_equal, which.size());
}

// The prompts of a MoE fixture whose last-token routing margin (routing_near_ties.json, from
// transformers: k-th vs (k+1)-th expert, last kept vs first dropped group) is >= 0.02: FP8
// moves the MoE layer's input by a few percent (the dense fixtures' logits by 4-9% of max), so
// a closer choice may flip, and one does: deepseek_v3_moe_f32 prompt 1 (group gap 1.5e-2) takes
// the other group, cosine 0.809 to transformers (that side's logits have 0.811). Those prompts
// are printed and left to the FP8 modes' check below. Dense fixtures: every prompt.
std::vector<int> RoutingClearUnderFp8(const std::string& variant, const std::vector<int>& all) {
  std::ifstream in(Dir(variant) + "/routing_near_ties.json");
  if (!in.good()) return all;
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<int> clear;
  for (int i : all) {
    const double gap = std::min(j["prompts"][i]["expert_gap"].get<double>(),
                                j["prompts"][i]["group_gap"].get<double>());
    if (gap >= 0.02) {
      clear.push_back(i);
    } else {
      std::printf("%s prompt %d: routing margin %.2e < 0.02, not compared under FP8\n",
                  variant.c_str(), i, gap);
    }
  }
  EXPECT_GE(clear.size(), 3u) << variant;
  return clear;
}

class Fp8KvGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8KvGoldenTest, NearTransformersAndEqualAcrossEngineModes) {
  const std::string variant = GetParam();
  const Golden g = LoadGoldenAt(Dir(variant));
  std::vector<int> all(g.prompts.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  const EngineConfig base;
  const std::vector<Output> alone = RunEngine(variant, g, base, KvDtype::kFp8E4m3, all, false);
  const bool latent = variant.rfind("fixtures_mla/", 0) == 0;  // else K / V heads
  Check(alone, g.logits, g.greedy, RoutingClearUnderFp8(variant, all), latent ? 0.995 : 0.98,
        latent ? 0.15 : 0.25, latent ? 0.3 : 0.5, variant + " fp8 vs transformers");
  // The f32 pool of the same engine: the fixture's 1e-4 (mla_golden_test, golden_test), so the
  // FP8 difference above is the KV's quantization alone.
  const std::vector<Output> f32 = RunEngine(variant, g, base, KvDtype::kF32, all, false);
  Check(f32, g.logits, g.greedy, all, 1 - 1e-8, 1e-4, 0, variant + " f32 vs transformers");

  std::vector<std::vector<float>> ref_logits;
  std::vector<std::vector<int32_t>> ref_tokens;
  for (const Output& o : alone) {
    ref_logits.push_back(o.logits);
    ref_tokens.push_back(o.tokens);
  }
  auto within_fp8 = [&](const std::vector<Output>& out, const std::vector<int>& which,
                        const std::string& mode) {
    Check(out, ref_logits, ref_tokens, which, 1 - 1e-6, 1e-3, 0, variant + " fp8 " + mode);
  };
  within_fp8(RunEngine(variant, g, base, KvDtype::kFp8E4m3, all, true), all, "batch");
  EngineConfig chunked = base;
  chunked.max_num_batched_tokens = 7;
  within_fp8(RunEngine(variant, g, chunked, KvDtype::kFp8E4m3, all, true), all, "chunked (7)");
  EngineConfig tight = base;
  auto config = LoadModelConfig(Dir(variant));
  ASSERT_TRUE(config.ok()) << config.status();
  tight.kv_cache_bytes = 8 * KvBlockBytes(*config, tight.block_size, KvDtype::kFp8E4m3);
  within_fp8(RunEngine(variant, g, tight, KvDtype::kFp8E4m3, all, true), all, "8-block pool");
  int64_t hits = 0;
  const std::vector<Output> pair =
      RunEngine(variant, g, base, KvDtype::kFp8E4m3, g.prefix_pair, false, &hits);
  EXPECT_GE(hits, 32) << "the second prompt must hit the first one's cached FP8 blocks";
  within_fp8(pair, g.prefix_pair, "prefix hit");
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, Fp8KvGoldenTest,
    ::testing::Values("fixtures_mla/deepseek_v2_f32", "fixtures_mla/deepseek_v2_lite_f32",
                      "fixtures_mla/deepseek_v3_f32", "fixtures_mla/deepseek_v3_rotate_half_f32",
                      "fixtures_mla/deepseek_v3_moe_f32", "fixtures_mla/deepseek_v2_moe_f32",
                      "fixtures/llama_f32_gqa", "fixtures/llama_f32_gqa8x4",
                      "fixtures/llama_f32_mqa_headdim_bias", "fixtures/mistral_f32",
                      "fixtures/qwen2_f32", "fixtures/qwen3_f32", "fixtures/mixtral_f32",
                      "fixtures/qwen3_moe_f32"),
    [](const ::testing::TestParamInfo<std::string>& info) {
      return info.param.substr(info.param.find('/') + 1);
    });

// A checkpoint's calibrated K / V scales (LayerWeights::kv_k_scale / kv_v_scale, as modelopt and
// compressed-tensors ship them) are what the FP8 K / V pool stores with: the same fixture with
// small scales (codes of x / 0.02: every value of these fixtures a normal e4m3 number) gives
// logits different from the uncalibrated run (scale 1), within the K / V bound of the f32 pool's.
TEST(Fp8KvTest, CalibratedKvScalesAreUsed) {
  const std::string variant = "fixtures/llama_f32_gqa";
  const Golden g = LoadGoldenAt(Dir(variant));
  std::vector<int> all(g.prompts.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  const std::vector<Output> f32 = RunEngine(variant, g, {}, KvDtype::kF32, all, false);
  const std::vector<Output> plain = RunEngine(variant, g, {}, KvDtype::kFp8E4m3, all, false);
  const std::vector<Output> calibrated =
      RunEngine(variant, g, {}, KvDtype::kFp8E4m3, all, false, nullptr, [](ModelWeights& w) {
        for (LayerWeights& l : w.layers) l.kv_k_scale = l.kv_v_scale = 0.02f;
      });
  double plain_rel = 0, calibrated_rel = 0;
  bool differ = false;
  for (int i : all) {
    ASSERT_EQ(calibrated[i].logits.size(), f32[i].logits.size());
    plain_rel = std::max(plain_rel, Compare(plain[i].logits, f32[i].logits).max_rel);
    calibrated_rel = std::max(calibrated_rel, Compare(calibrated[i].logits, f32[i].logits).max_rel);
    differ |= calibrated[i].logits != plain[i].logits;
  }
  std::printf("max |logit diff| to the f32 pool: scale 1 %.2e, scale 0.02 %.2e of max\n", plain_rel,
              calibrated_rel);
  EXPECT_TRUE(differ) << "the calibrated scales changed nothing: they are not used";
  EXPECT_LE(calibrated_rel, 0.25);  // the K / V bound of Fp8KvGoldenTest
}

}  // namespace
}  // namespace tandem::runtime
