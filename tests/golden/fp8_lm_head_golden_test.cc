// --quantize_lm_head (ModelSource::quantize_lm_head): lm_head in e4m3 with a scale a vocabulary
// row, its input quantized per token (LmHeadFp8Scheme), with --quantization=fp8 on
// fixtures_fp8/base_bf16 and on each FP8 checkpoint format (DeepSeek blocks, compressed-tensors
// per-channel dynamic / per-tensor static, modelopt), against transformers
// (make_golden_fp8.py's expected_lm_head.json: the format's weights and lm_head per-channel,
// dequantized; and the same with every Linear's input quantized as the format says, lm_head's
// per token):
//   * activations left unquantized: logits within 1e-4 * max|logit| of the dequantized reference
//     and the first greedy token equal; that reference differs from expected.json's (lm_head
//     16-bit) by far more, so a head left 16-bit cannot pass;
//   * as the scheme says: cosine >= 0.995 to the activation-quantizing reference, first tokens
//     equal where its top-2 gap is >= 1% of max|logit|.
// Also: the codes are kernels::QuantizeWeight's of the 16-bit head per row (a tied head's from
// the embedding, which stays); a TP rank's rows are the whole head's; the flag without FP8
// weights and on an MLA model is refused by name.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/fp8/fp8.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_source.h"
#include "runtime/model/model_weights.h"
#include "tests/golden/logit_compare.h"
#include "tests/golden/prompt_run.h"

namespace tandem::runtime {
namespace {

constexpr float kGapFraction = 0.01f;
constexpr double kCosineActQuant = 0.995;

using golden::ArgMax;
using golden::Cosine;
using golden::MaxAbs;

struct Reference {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> logits, aq_logits;
  std::vector<float> aq_gaps;
  std::vector<int32_t> first, aq_first;
};

constexpr char kFixtures[] = "tests/golden/fixtures_fp8/";

Reference LoadReference(const std::string& format, const std::string& file) {
  std::ifstream in(kFixtures + format + "/" + file);
  EXPECT_TRUE(in.good()) << file;
  const nlohmann::json j = nlohmann::json::parse(in);
  Reference r;
  r.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  r.logits = j["last_prompt_logits"].get<std::vector<std::vector<float>>>();
  r.aq_logits = j["last_prompt_logits_act_quant"].get<std::vector<std::vector<float>>>();
  r.aq_gaps = j["top2_gap_act_quant"].get<std::vector<float>>();
  for (const auto& t : j["greedy_tokens"]) r.first.push_back(t[0]);
  for (const auto& t : j["greedy_tokens_act_quant"]) r.aq_first.push_back(t[0]);
  return r;
}

// The format's model with --quantize_lm_head (base_bf16: with --quantization=fp8).
ModelSource HeadSource(const std::string& format = "base_bf16") {
  ModelSource source;
  source.model_dir = kFixtures + format;
  if (format == "base_bf16") source.quantization = "fp8";
  source.quantize_lm_head = true;
  return source;
}

// All prompts through a CPU engine; `weight_only`: every FP8 weight (lm_head's too) multiplies
// the activations unquantized.
PromptRun RunHeadModel(const std::string& format, const Reference& ref, bool weight_only) {
  absl::StatusOr<LoadedModel> model = LoadModel(HeadSource(format));
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return EmptyPromptRun(ref.prompts.size());
  ModelWeights& w = model->weights;
  EXPECT_TRUE(w.lm_head.empty());
  EXPECT_FALSE(w.lm_head_fp8.empty());
  if (weight_only) {
    w.lm_head_fp8.activation = kernels::Fp8ActivationScheme::kNone;
    for (LayerWeights& layer : w.layers) {
      for (Fp8LinearWeight* fp8 :
           {&layer.qkv_fp8, &layer.o_fp8, &layer.gate_up_fp8, &layer.down_fp8}) {
        fp8->activation = kernels::Fp8ActivationScheme::kNone;
      }
    }
  }
  auto engine = Engine::Create(EngineConfig(), model->config, std::move(model->weights));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return EmptyPromptRun(ref.prompts.size());
  return RunPromptsOnce(**engine, ref.prompts);
}

class Fp8LmHeadGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8LmHeadGoldenTest, WeightsAloneMatchTransformersToF32Rounding) {
  const std::string format = GetParam();
  const Reference ref = LoadReference(format, "expected_lm_head.json");
  const Reference head16 = LoadReference(format, "expected.json");  // lm_head left 16-bit
  const PromptRun run = RunHeadModel(format, ref, /*weight_only=*/true);
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    ASSERT_EQ(run.logits[i].size(), ref.logits[i].size());
    float worst = 0, apart = 0;
    for (size_t v = 0; v < ref.logits[i].size(); ++v) {
      worst = std::max(worst, std::fabs(run.logits[i][v] - ref.logits[i][v]));
      apart = std::max(apart, std::fabs(head16.logits[i][v] - ref.logits[i][v]));
    }
    const float tolerance = 1e-4f * MaxAbs(ref.logits[i]);
    EXPECT_LE(worst, tolerance);
    EXPECT_GE(apart, 20 * tolerance) << "the FP8 head must be visible in the reference";
    EXPECT_EQ(run.first[i], ref.first[i]);
  }
}

TEST_P(Fp8LmHeadGoldenTest, SchemeMatchesTransformers) {
  const std::string format = GetParam();
  const Reference ref = LoadReference(format, "expected_lm_head.json");
  const PromptRun run = RunHeadModel(format, ref, /*weight_only=*/false);
  int checked = 0;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    ASSERT_EQ(run.logits[i].size(), ref.aq_logits[i].size());
    const double cosine = Cosine(run.logits[i], ref.aq_logits[i]);
    EXPECT_GE(cosine, kCosineActQuant);
    EXPECT_EQ(run.first[i], ArgMax(run.logits[i]));
    const float gap = ref.aq_gaps[i] / MaxAbs(ref.aq_logits[i]);
    if (gap >= kGapFraction) {
      EXPECT_EQ(run.first[i], ref.aq_first[i]) << "reference gap/max " << gap;
      ++checked;
    }
    std::printf("%s prompt %zu: cosine %.6f, gap/max %.4f, token %d vs %d\n", format.c_str(), i,
                cosine, gap, run.first[i], ref.aq_first[i]);
  }
  EXPECT_GE(checked, 3) << "too few prompts with a clear greedy token";
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8LmHeadGoldenTest,
                         ::testing::Values("base_bf16", "fp8_block", "ct_channel_dynamic",
                                           "ct_tensor_static", "modelopt"));

// An FP8 checkpoint's head: per row and per token whatever the projections' scheme (here 128 x
// 128 blocks with 1 x 128 groups, and static per-tensor), the model another one for pairing.
TEST(Fp8LmHeadTest, CheckpointHeadsArePerRowPerToken) {
  for (const char* format : {"fp8_block", "ct_tensor_static"}) {
    SCOPED_TRACE(format);
    ModelSource plain;
    plain.model_dir = std::string(kFixtures) + format;
    absl::StatusOr<LoadedModel> head16 = LoadModel(plain);
    absl::StatusOr<LoadedModel> head8 = LoadModel(HeadSource(format));
    ASSERT_TRUE(head16.ok() && head8.ok()) << head16.status() << head8.status();
    EXPECT_EQ(head8->model_id, head16->model_id + ":lm_head_fp8");
    EXPECT_EQ(head8->config.quantization.Describe(),
              head16->config.quantization.Describe() + "; lm_head FP8 (per-channel)");
    const Fp8LinearWeight& head = head8->weights.lm_head_fp8;
    const int64_t V = head16->config.vocab_size, H = head16->config.hidden_size;
    EXPECT_EQ(head.grid.rows, V);
    EXPECT_EQ(head.grid.block_rows, 1);
    EXPECT_EQ(head.grid.block_cols, H);
    EXPECT_EQ(head.activation, kernels::Fp8ActivationScheme::kDynamicToken);
    std::vector<uint8_t> codes(V * H);
    std::vector<float> scales(V);
    kernels::QuantizeWeight(head16->weights.lm_head.data(), {V, H, 1, H}, codes.data(),
                            scales.data());
    EXPECT_EQ(head.codes, codes);
    EXPECT_EQ(head.scales, scales);
    EXPECT_TRUE(head8->weights.lm_head.empty());
    // The projections keep the checkpoint's codes.
    EXPECT_EQ(head8->weights.layers[1].qkv_fp8.codes, head16->weights.layers[1].qkv_fp8.codes);
  }
}

// The head's codes and scales are QuantizeWeight's per row of the 16-bit head; the config says
// so; the model is another model for pairing; a TP rank holds the whole head's rows.
TEST(Fp8LmHeadTest, CodesAreThePerRowQuantizationOfTheHead) {
  ModelSource plain;
  plain.model_dir = std::string(kFixtures) + "base_bf16";
  absl::StatusOr<LoadedModel> bf16 = LoadModel(plain);
  absl::StatusOr<LoadedModel> fp8 = LoadModel(HeadSource());
  ASSERT_TRUE(bf16.ok() && fp8.ok()) << bf16.status() << fp8.status();
  const int64_t V = bf16->config.vocab_size, H = bf16->config.hidden_size;
  const kernels::Fp8ScaleGrid grid{V, H, 1, H};
  std::vector<uint8_t> codes(V * H);
  std::vector<float> scales(V);
  kernels::QuantizeWeight(bf16->weights.lm_head.data(), grid, codes.data(), scales.data());
  const Fp8LinearWeight& head = fp8->weights.lm_head_fp8;
  EXPECT_EQ(head.grid.rows, V);
  EXPECT_EQ(head.grid.cols, H);
  EXPECT_EQ(head.grid.block_cols, H);
  EXPECT_EQ(head.codes, codes);
  EXPECT_EQ(head.scales, scales);
  EXPECT_EQ(head.activation, kernels::Fp8ActivationScheme::kDynamicToken);
  EXPECT_EQ(fp8->config.quantization.Describe(),
            "fp8 online: per-channel weight scales, dynamic per-token activations; lm_head FP8 "
            "(per-channel)");
  EXPECT_EQ(fp8->model_id, bf16->model_id + ":fp8+lm_head");
  // Less device memory than the 16-bit head: V x H bytes + a scale a row instead of 2 V x H.
  ModelConfig head16 = fp8->config;
  head16.quantization.lm_head = false;
  EXPECT_EQ(head16.DeviceWeightBytes() - fp8->config.DeviceWeightBytes(), V * H - 4 * V);

  for (int rank = 0; rank < 2; ++rank) {
    ModelSource source = HeadSource();
    source.shard = TpShard{rank, 2, 1};
    absl::StatusOr<LoadedModel> part = LoadModel(source);
    ASSERT_TRUE(part.ok()) << part.status();
    const Fp8LinearWeight& p = part->weights.lm_head_fp8;
    const int64_t rows = V / 2;
    ASSERT_EQ(p.grid.rows, rows);
    EXPECT_EQ(0, std::memcmp(p.codes.data(), codes.data() + rank * rows * H, rows * H));
    EXPECT_TRUE(std::equal(p.scales.begin(), p.scales.end(), scales.begin() + rank * rows));
  }
}

// Tied embeddings: the head is an e4m3 copy of the embedding, which stays 16-bit (fp32 here).
TEST(Fp8LmHeadTest, TiedHeadQuantizesACopyOfTheEmbedding) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  ASSERT_TRUE(config.ok());
  config->tie_word_embeddings = true;
  absl::StatusOr<ModelWeights> weights = RandomModelWeights(*config, 7);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const std::vector<float> embed = weights->embed_tokens;
  config->quantization.method = WeightQuantization::Method::kOnlineFp8;
  config->quantization.block_rows = 1;
  config->quantization.activation = kernels::Fp8ActivationScheme::kDynamicToken;
  config->quantization.lm_head = true;
  ASSERT_TRUE(QuantizeWeightsFp8(*config, &*weights).ok());
  EXPECT_EQ(weights->embed_tokens, embed);
  const int64_t V = config->vocab_size, H = config->hidden_size;
  std::vector<uint8_t> codes(V * H);
  std::vector<float> scales(V);
  kernels::QuantizeWeight(embed.data(), {V, H, 1, H}, codes.data(), scales.data());
  EXPECT_EQ(weights->lm_head_fp8.codes, codes);
  EXPECT_EQ(weights->lm_head_fp8.scales, scales);
  // ... and the engine runs it: logits close to the 16-bit head's.
  ModelConfig plain = *config;
  plain.quantization.lm_head = false;
  absl::StatusOr<ModelWeights> plain_weights = RandomModelWeights(plain, 7);  // quantized
  ASSERT_TRUE(plain_weights.ok());
  ASSERT_TRUE(plain_weights->lm_head_fp8.empty());
  auto head8 = Engine::Create(EngineConfig(), *config, std::move(*weights));
  auto head16 = Engine::Create(EngineConfig(), plain, std::move(*plain_weights));
  ASSERT_TRUE(head8.ok() && head16.ok()) << head8.status() << head16.status();
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 200, 31}, {77}};
  const PromptRun a = RunPromptsOnce(**head8, prompts), b = RunPromptsOnce(**head16, prompts);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(a.logits[i].size(), static_cast<size_t>(V));
    EXPECT_GE(Cosine(a.logits[i], b.logits[i]), 0.99);
    EXPECT_NE(a.logits[i], b.logits[i]);
  }
}

TEST(Fp8LmHeadTest, RefusedWithoutFp8AndOnMla) {
  ModelSource alone;
  alone.model_dir = std::string(kFixtures) + "base_bf16";
  alone.quantize_lm_head = true;
  EXPECT_EQ(LoadModel(alone).status().message(),
            "--quantize_lm_head quantizes lm_head with FP8 weights: it needs --quantization=fp8 "
            "or an FP8 checkpoint");
  ModelSource mla;
  mla.load_format = "dummy";
  mla.dummy_config = "tiny-mla";
  mla.quantization = "fp8";
  mla.quantize_lm_head = true;
  const absl::Status status = LoadModel(mla).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("keeps lm_head 16-bit"), std::string::npos) << status;
}

}  // namespace
}  // namespace tandem::runtime
