// DeepSeek-V3 MTP golden test: the CPU backend's MTP layer against make_golden_mtp.py's reference
// (tests/golden/fixtures_mtp/deepseek_v3_mtp_f32/: the deepseek_v3_moe_f32 fixture plus an MTP
// layer 2 whose decoder block is transformers' own DeepseekV3DecoderLayer, a MoE layer; the glue as
// vLLM's DeepSeekMultiTokenPredictorLayer), and the same record for DeepSeek-V3's FP8 format
// (tests/golden/fixtures_fp8/fp8_deepseek_v3, make_golden_fp8_deepseek.py: the MTP layer's block
// e4m3 with 128x128 weight_scale_inv as the released checkpoints ship it, the reference
// transformers on the dequantized weights). On one sequence of T tokens:
//  * the checkpoint loads with MTP off (LoadModelWeights ignores model.layers.2.*);
//  * the target's final hidden states (ModelRunner with return_hidden_states) match transformers';
//  * the MTP layer fed (t_{i+1}, h_i) at positions 0 .. T - 2 in one prefill step (unabsorbed MLA)
//    matches the reference's y and, at its last row, its logits; fed one position per step
//    (absorbed decode), every row's logits; then one chained draft (the argmax token with the
//    layer's own y) matches too;
//  * a config without MTP layers is refused naming num_nextn_predict_layers.
// f32 tolerance as the other golden tests: 1e-4 * max|reference|; the FP8 fixture's weights stay
// e4m3 (target and MTP block) and are compared with activations left unquantized (the reference
// is the dequantized model). With DeepSeek's 1x128 activation quantization on, greedy with MTP
// drafts must equal greedy without them (the CUDA twin: runtime/cuda:cuda_mtp_test).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/model_runner.h"
#include "runtime/engine/mtp_proposer.h"
#include "runtime/kv_cache/kv_cache_manager.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime {
namespace {

constexpr char kDir[] = "tests/golden/fixtures_mtp/deepseek_v3_mtp_f32";
constexpr char kFp8Dir[] = "tests/golden/fixtures_fp8/fp8_deepseek_v3";
constexpr int64_t kBlockSize = 16;

// Activations of every FP8 linear left unquantized: the weights alone, as the reference has them.
void Fp8WeightsOnly(ModelWeights* w) {
  for (LayerWeights& l : w->layers) {
    for (Fp8LinearWeight* fp8 :
         {&l.qkv_fp8, &l.o_fp8, &l.gate_up_fp8, &l.down_fp8, &l.experts_gate_up_fp8,
          &l.experts_down_fp8, &l.shared_gate_up_fp8, &l.shared_down_fp8, &l.q_a_fp8, &l.q_fp8,
          &l.kv_a_fp8, &l.kv_b_fp8}) {
      fp8->activation = kernels::Fp8ActivationScheme::kNone;
    }
  }
}

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> target_hidden, mtp_hidden, mtp_logits;
  int32_t chain_token = 0;
  std::vector<float> chain_logits;
};

Reference LoadReference(const std::string& dir) {
  std::ifstream in(dir + "/expected_mtp.json");
  EXPECT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  Reference r;
  r.tokens = j["tokens"].get<std::vector<int32_t>>();
  r.target_hidden = j["target_hidden"].get<std::vector<std::vector<float>>>();
  r.mtp_hidden = j["mtp_hidden"].get<std::vector<std::vector<float>>>();
  r.mtp_logits = j["mtp_logits"].get<std::vector<std::vector<float>>>();
  r.chain_token = j["chain_token"];
  r.chain_logits = j["chain_logits"].get<std::vector<float>>();
  return r;
}

// max |got - want| <= 1e-4 * max |want|; returns max |got - want| / max |want|.
float ExpectClose(const float* got, const std::vector<float>& want, const std::string& what) {
  float max_ref = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(worst, 1e-4f * max_ref) << what << ": max |diff| " << worst << " of " << max_ref;
  return worst / max_ref;
}

// One sequence's step on `executor` over the blocks of request 0 in `kv`.
absl::StatusOr<RunnerOutput> RunStep(ModelExecutor& executor, KvCacheManager& kv,
                                     absl::Span<const int32_t> tokens, int64_t start,
                                     absl::Span<const float> input_hidden) {
  if (!kv.Allocate(0, start + static_cast<int64_t>(tokens.size()), nullptr)) {
    return absl::ResourceExhaustedError("no blocks");
  }
  SchedulerOutput step;
  ScheduledSeq seq;
  seq.request_id = 0;
  seq.new_tokens = tokens;
  seq.num_computed_tokens = start;
  seq.block_table = kv.BlockTable(0);
  seq.capture_prompt_logits = true;
  step.seqs.push_back(seq);
  step.num_batched_tokens = static_cast<int64_t>(tokens.size());
  step.return_hidden_states = true;
  step.input_hidden = input_hidden;
  return executor.Run(step);
}

std::unique_ptr<KvCacheManager> Cache() {
  KvCacheConfig c;
  c.num_blocks = 8;
  c.block_size = kBlockSize;
  c.enable_prefix_caching = false;
  return *KvCacheManager::Create(c);
}

ExecutorSpec Spec(const ModelConfig& config) {
  ExecutorSpec spec;
  spec.model_config = config;
  spec.num_blocks = 8;
  spec.block_size = kBlockSize;
  spec.max_num_batched_tokens = 256;
  spec.max_num_seqs = 4;
  spec.max_model_len = 128;
  return spec;
}

class MtpLayerGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MtpLayerGoldenTest, TargetHiddenStatesAndMtpLogitsMatchTransformers) {
  const std::string dir = GetParam();
  const Reference ref = LoadReference(dir);
  const int64_t T = static_cast<int64_t>(ref.tokens.size());
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->num_nextn_predict_layers, 1);
  const int64_t H = config->hidden_size;
  const bool fp8 = config->quantization.FromCheckpoint();

  // The target, with MTP off: the MTP layer's tensors are ignored.
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(dir, *config);
  ASSERT_TRUE(weights.ok()) << weights.status();
  if (fp8) Fp8WeightsOnly(&*weights);
  absl::StatusOr<std::unique_ptr<ModelExecutor>> target =
      CpuExecutorFactory(1).create(Spec(*config), std::move(*weights));
  ASSERT_TRUE(target.ok()) << target.status();
  std::unique_ptr<KvCacheManager> target_kv = Cache();
  absl::StatusOr<RunnerOutput> out = RunStep(**target, *target_kv, ref.tokens, 0, {});
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> hidden = out->hidden_states;
  ASSERT_EQ(static_cast<int64_t>(hidden.size()), T * H);
  for (int64_t t = 0; t < T; ++t) {
    ExpectClose(hidden.data() + t * H, ref.target_hidden[t], "target hidden " + std::to_string(t));
  }

  absl::StatusOr<MtpWeights> mtp_weights = LoadMtpWeights(dir, *config);
  ASSERT_TRUE(mtp_weights.ok()) << mtp_weights.status();
  EXPECT_TRUE(mtp_weights->own_embed_tokens && mtp_weights->own_head);
  if (fp8) {  // the block's projections and experts stay e4m3 (kv_b_proj widened, as the model's)
    const LayerWeights& block = mtp_weights->block.layers[0];
    for (const Fp8LinearWeight* w :
         {&block.q_a_fp8, &block.q_fp8, &block.kv_a_fp8, &block.o_fp8, &block.experts_gate_up_fp8,
          &block.experts_down_fp8, &block.shared_gate_up_fp8, &block.shared_down_fp8}) {
      EXPECT_FALSE(w->empty());
      EXPECT_EQ(w->grid.block_cols, 128);
    }
    EXPECT_TRUE(block.q_a_proj.empty() && block.o_proj.empty() && block.experts_gate_up.empty() &&
                block.shared_down.empty());
    EXPECT_FALSE(block.kv_b_proj.empty());
    Fp8WeightsOnly(&mtp_weights->block);
  }
  const MtpExecutorFactory factory = CpuMtpExecutorFactory(1);
  const absl::Span<const int32_t> shifted = absl::MakeConstSpan(ref.tokens).subspan(1);

  // Prefill: positions 0 .. T - 2 in one step.
  {
    absl::StatusOr<std::unique_ptr<ModelExecutor>> mtp = factory(Spec(*config), *mtp_weights);
    ASSERT_TRUE(mtp.ok()) << mtp.status();
    std::unique_ptr<KvCacheManager> kv = Cache();
    absl::StatusOr<RunnerOutput> step =
        RunStep(**mtp, *kv, shifted, 0, absl::MakeConstSpan(hidden).subspan(0, (T - 1) * H));
    ASSERT_TRUE(step.ok()) << step.status();
    for (int64_t i = 0; i < T - 1; ++i) {
      ExpectClose(step->hidden_states.data() + i * H, ref.mtp_hidden[i],
                  "prefill y " + std::to_string(i));
    }
    ExpectClose(step->last_prompt_logits[0].data(), ref.mtp_logits[T - 2], "prefill logits");
  }
  // Decode: one position per step, then the chained draft.
  absl::StatusOr<std::unique_ptr<ModelExecutor>> mtp = factory(Spec(*config), *mtp_weights);
  ASSERT_TRUE(mtp.ok()) << mtp.status();
  std::unique_ptr<KvCacheManager> kv = Cache();
  std::vector<float> y;
  for (int64_t i = 0; i < T - 1; ++i) {
    absl::StatusOr<RunnerOutput> step = RunStep(**mtp, *kv, shifted.subspan(i, 1), i,
                                                absl::MakeConstSpan(hidden).subspan(i * H, H));
    ASSERT_TRUE(step.ok()) << step.status();
    ExpectClose(step->last_prompt_logits[0].data(), ref.mtp_logits[i],
                "decode logits " + std::to_string(i));
    y = step->hidden_states;
  }
  const int32_t chain[] = {ref.chain_token};
  absl::StatusOr<RunnerOutput> chained = RunStep(**mtp, *kv, chain, T - 1, y);
  ASSERT_TRUE(chained.ok()) << chained.status();
  const float chained_diff =
      ExpectClose(chained->last_prompt_logits[0].data(), ref.chain_logits, "chained draft logits");
  std::printf("%s: chained draft logits max |diff| / max|logit| %.2e\n", dir.c_str(), chained_diff);
}

INSTANTIATE_TEST_SUITE_P(F32AndFp8, MtpLayerGoldenTest, ::testing::Values(kDir, kFp8Dir));

// Greedy tokens of `prompts` through the CPU engine, with `mtp` drafting K = 3 when given.
std::vector<std::vector<int32_t>> RunGreedy(const ModelConfig& config, ModelWeights weights,
                                            std::optional<MtpWeights> mtp,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            int max_tokens, uint64_t* drafted) {
  EngineConfig engine_config;
  engine_config.num_threads = 1;
  engine_config.kv_cache_bytes = int64_t{8} << 20;
  if (mtp.has_value()) {
    engine_config.speculative.method = SpeculativeMethod::kMtp;
    engine_config.speculative.num_speculative_tokens = 3;
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  auto engine = Engine::Create(engine_config, config, std::move(weights));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return out;
  if (mtp.has_value()) {
    EXPECT_TRUE((*engine)->AttachMtp(config, std::move(*mtp)).ok());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec spec;
    spec.prompt = prompts[i];
    spec.max_tokens = max_tokens;
    spec.ignore_eos = true;
    EXPECT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), spec).ok());
  }
  while ((*engine)->HasUnfinished()) {
    absl::StatusOr<std::vector<RequestUpdate>> updates = (*engine)->Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    for (const RequestUpdate& u : *updates) {
      out[u.request_id].insert(out[u.request_id].end(), u.new_token_ids.begin(),
                               u.new_token_ids.end());
    }
  }
  if (drafted != nullptr) *drafted = (*engine)->spec_stats().drafted_tokens;
  return out;
}

// Greedy through the engine with the MTP layer drafting (K = 3) is transformers' greedy output
// (the MLA fixture's prompts and expected tokens; the target weights are that fixture's).
TEST(MtpGoldenTest, GreedyWithMtpDraftsIsTransformersGreedy) {
  std::ifstream in("tests/golden/fixtures_mla/deepseek_v3_moe_f32/expected.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  const auto greedy = j["greedy_tokens"].get<std::vector<std::vector<int32_t>>>();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(kDir);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(kDir, *config);
  ASSERT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<MtpWeights> mtp = LoadMtpWeights(kDir, *config);
  ASSERT_TRUE(mtp.ok()) << mtp.status();
  uint64_t drafted = 0;
  const std::vector<std::vector<int32_t>> out = RunGreedy(
      *config, std::move(*weights), std::move(*mtp), prompts, j["max_new_tokens"], &drafted);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(out[i], greedy[i]) << "prompt " << i;
  EXPECT_GT(drafted, 0u);
}

// DeepSeek-V3's FP8 format with its FP8 MTP layer, DeepSeek's 1x128 activation quantization on
// (as served): greedy with MTP drafts (K = 3) is greedy without them, token for token.
TEST(MtpGoldenTest, Fp8MtpDraftsKeepGreedy) {
  std::ifstream in(std::string(kFp8Dir) + "/expected.json");
  ASSERT_TRUE(in.good());
  const auto prompts =
      nlohmann::json::parse(in)["prompts"].get<std::vector<std::vector<int32_t>>>();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(kFp8Dir);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->quantization.activation, kernels::Fp8ActivationScheme::kDynamicGroup128);
  constexpr int kTokens = 12;
  absl::StatusOr<ModelWeights> plain = LoadModelWeights(kFp8Dir, *config);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<std::vector<int32_t>> off =
      RunGreedy(*config, std::move(*plain), std::nullopt, prompts, kTokens, nullptr);
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(kFp8Dir, *config);
  ASSERT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<MtpWeights> mtp = LoadMtpWeights(kFp8Dir, *config);
  ASSERT_TRUE(mtp.ok()) << mtp.status();
  uint64_t drafted = 0;
  const std::vector<std::vector<int32_t>> on =
      RunGreedy(*config, std::move(*weights), std::move(*mtp), prompts, kTokens, &drafted);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(off[i].size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(on[i], off[i]) << "prompt " << i;
  }
  EXPECT_GT(drafted, 0u);
}

TEST(MtpGoldenTest, AModelWithoutAnMtpLayerIsRefusedByName) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(kDir);
  ASSERT_TRUE(config.ok()) << config.status();
  config->num_nextn_predict_layers = 0;
  const absl::StatusOr<MtpWeights> refused = LoadMtpWeights(kDir, *config);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("num_nextn_predict_layers"), std::string::npos)
      << refused.status();
  // The MLA fixture without MTP tensors but num_nextn_predict_layers 1 (transformers' default):
  // the missing tensor is named.
  const std::string plain = "tests/golden/fixtures_mla/deepseek_v3_moe_f32";
  absl::StatusOr<ModelConfig> plain_config = LoadModelConfig(plain);
  ASSERT_TRUE(plain_config.ok());
  const absl::StatusOr<MtpWeights> missing = LoadMtpWeights(plain, *plain_config);
  EXPECT_NE(missing.status().message().find("model.layers.2.enorm.weight"), std::string::npos)
      << missing.status();
}

}  // namespace
}  // namespace tandem::runtime
