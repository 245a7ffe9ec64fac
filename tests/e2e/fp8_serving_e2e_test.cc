// FP8 weights served end to end on the CPU backend (issue 38): tandem_router + a prefill and a
// decode tandem_worker on loopback, the KV moving over UCX, and tandem_router + one mixed
// worker, with every FP8 fixture (tests/golden/fixtures_fp8: DeepSeek's 128x128 blocks,
// compressed-tensors per-channel dynamic and per-tensor static, modelopt) and the bf16 fixture
// quantized at load (--quantization=fp8 on every worker). The served greedy tokens must equal
// the same engine's in this process (one request at a time, one thread: the same shapes as P
// then D), and the first token transformers' activation-quantizing reference where its top-2 gap
// is >= 1% of max|logit| (make_golden_fp8.py). A prefill worker on the bf16 weights and a decode
// worker quantizing them at load do not pair. The CUDA twin: tests/gpu/fp8_cuda_golden.sh (pd).
#include <cmath>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "runtime/model/model_source.h"
#include "tests/e2e/cluster.h"
#include "tests/e2e/serving_util.h"

namespace tandem::e2e {
namespace {

std::vector<std::vector<uint32_t>> LocalTokens(const std::string& dir, const std::string& quant,
                                               const std::vector<Prompt>& prompts) {
  runtime::ModelSource source;
  source.model_dir = Runfile(dir);
  source.quantization = quant;
  auto model = runtime::LoadModel(source);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  runtime::EngineConfig config;
  config.num_threads = 1;
  config.kv_cache_bytes = 16 << 20;
  auto engine = runtime::Engine::Create(config, model->config, std::move(model->weights));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::vector<std::vector<uint32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    runtime::RequestSpec spec;
    spec.prompt.assign(prompts[i].ids.begin(), prompts[i].ids.end());
    spec.max_tokens = prompts[i].max_tokens;
    spec.ignore_eos = true;
    EXPECT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), spec).ok());
    while ((*engine)->HasUnfinished()) {
      auto updates = (*engine)->Step();
      EXPECT_TRUE(updates.ok());
      if (!updates.ok()) return out;
      for (auto& u : *updates) {
        out[u.request_id].insert(out[u.request_id].end(), u.new_token_ids.begin(),
                                 u.new_token_ids.end());
      }
    }
  }
  return out;
}

// (checkpoint directory under fixtures_fp8, --quantization) of every FP8 format.
const std::pair<std::string, std::string> kFormats[] = {{"fp8_block", ""},
                                                        {"ct_channel_dynamic", ""},
                                                        {"ct_tensor_static", ""},
                                                        {"modelopt", ""},
                                                        {"base_bf16", "fp8"}};

// Serves each format on the workers `roles` sets (prefill / decode / mixed counts) and checks
// the tokens against this process's engine and transformers' first tokens.
void ServeEveryFormat(const ClusterOptions& roles) {
  for (const auto& [format, quant] : kFormats) {
    SCOPED_TRACE(format);
    const std::string dir = "tests/golden/fixtures_fp8/" + format;
    std::ifstream in(Runfile(dir) + "/expected.json");
    ASSERT_TRUE(in.good());
    const nlohmann::json expected = nlohmann::json::parse(in);
    const auto ids = expected["prompts"].get<std::vector<std::vector<uint32_t>>>();
    const auto ref =
        expected["last_prompt_logits_act_quant"].get<std::vector<std::vector<float>>>();
    const auto gaps = expected["top2_gap_act_quant"].get<std::vector<float>>();
    const auto first =
        expected["greedy_tokens_act_quant"].get<std::vector<std::vector<uint32_t>>>();
    std::vector<Prompt> prompts;
    for (const auto& p : ids) prompts.push_back(Prompt{p, 6});
    const std::vector<std::vector<uint32_t>> local = LocalTokens(dir, quant, prompts);
    ASSERT_EQ(local.size(), prompts.size());

    ClusterOptions options = roles;
    options.model_dir = dir;
    options.worker_flags = {"--num_threads=1"};
    if (!quant.empty()) options.worker_flags.push_back("--quantization=" + quant);
    auto cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    int checked = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Result r = Generate((*cluster)->router(), ToRequest(prompts[i]));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message() << (*cluster)->Logs();
      EXPECT_EQ(r.tokens, local[i]) << "prompt " << i;
      float max_abs = 0;
      for (float x : ref[i]) max_abs = std::max(max_abs, std::fabs(x));
      if (gaps[i] >= 0.01f * max_abs) {
        ASSERT_FALSE(r.tokens.empty());
        EXPECT_EQ(r.tokens[0], first[i][0]) << "prompt " << i;
        ++checked;
      }
    }
    EXPECT_GE(checked, 3);
  }
}

TEST(Fp8ServingE2eTest, PrefillDecodeEqualsTheEngineAndTransformers) {
  ServeEveryFormat(ClusterOptions{});  // one prefill and one decode worker
}

// The weights' quantization enters the KV compatibility hash (the model id: ":fp8" for
// --quantization=fp8, the checkpoint's files otherwise), so a bf16 P and an FP8 D of the same
// checkpoint are not paired: the router refuses the request and no KV byte moves.
TEST(Fp8ServingE2eTest, Bf16PrefillAndFp8DecodeDoNotPair) {
  ClusterOptions options;
  options.model_dir = "tests/golden/fixtures_fp8/base_bf16";
  options.worker_flags = {"--num_threads=1"};
  options.decode_flags = {"--quantization=fp8"};
  auto cluster = Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Result r = Generate((*cluster)->router(), ToRequest(Prompt{{5, 6, 7}, 4}));
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.error_message().find("none compatible"), std::string::npos)
      << r.status.error_message();
  auto stats = (*cluster)->Stats("decode-0");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->kv_bytes_received(), 0u);
}

TEST(Fp8ServingE2eTest, MixedWorkerEqualsTheEngineAndTransformers) {
  ClusterOptions mixed;
  mixed.prefill = 0;
  mixed.decode = 0;
  mixed.mixed = 1;
  ServeEveryFormat(mixed);
}

// FP8 K / V (--kv_cache_dtype=fp8) of a GQA model served disaggregated on the CPU backend: the
// blocks are e4m3 codes in the f32 pool's layout (one byte a value, the K / V scales per tensor in
// the handshake), so they move P -> D over UCX like any block and re-shard by heads between
// tensor-parallel splits: 1P1D, P a TP = 2 group (each rank half the heads) -> D TP = 1, and
// D a TP = 2 group. llama_f32_gqa8x4: 2 layers x 16 tokens x 2 x 4 kv heads x 16 = 4096 bytes
// a block.
TEST(Fp8ServingE2eTest, Fp8KvPrefillDecodeEqualsTheMixedFp8Worker) {
  ExpectFp8KvRunsEqualTheMixedWorker("tests/golden/fixtures/llama_f32_gqa8x4",
                                     {{"mixed", 0, 0, 1, {}, {}},
                                      {"1P1D", 1, 1, 0, {}, {}},
                                      {"1P1D prefill tp=2", 1, 1, 0, {"--tp=2"}, {}},
                                      {"1P1D decode tp=2", 1, 1, 0, {}, {"--tp=2"}, "", 2}});
}

}  // namespace
}  // namespace tandem::e2e
