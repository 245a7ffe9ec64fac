// DeepSeek multi-head latent attention served end to end on the CPU backend: tandem_router +
// tandem_worker processes on loopback with the deepseek_v3_f32 MLA golden fixture (q_lora, YaRN,
// interleaved RoPE, dense layers). A mixed worker and prefill -> decode (the latent KV blocks, one
// kv_lora_rank + qk_rope_head_dim row per token and layer, moved over UCX unchanged) must both
// produce transformers' greedy tokens (the fixture's expected.json), also with P or D a group of
// 2 tensor-parallel ranks (each half of the heads over the whole latent).
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/e2e/serving_util.h"

namespace tandem::e2e {
namespace {

constexpr char kMlaModel[] = "tests/golden/fixtures_mla/deepseek_v3_f32";

TEST(MlaServingE2eTest, MixedAndPrefillDecodeEqualTransformers) {
  std::ifstream in(std::string(kMlaModel) + "/expected.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json expected = nlohmann::json::parse(in);
  const auto prompts = expected["prompts"].get<std::vector<std::vector<uint32_t>>>();
  const auto greedy = expected["greedy_tokens"].get<std::vector<std::vector<uint32_t>>>();
  for (auto [name, p, d, m, prefill_tp, decode_tp] :
       {std::tuple<const char*, int, int, int, int, int>{"mixed", 0, 0, 1, 1, 1},
        {"1P1D", 1, 1, 0, 1, 1},
        {"1P1D prefill tp=2 decode tp=1", 1, 1, 0, 2, 1},
        {"1P1D prefill tp=1 decode tp=2", 1, 1, 0, 1, 2}}) {
    SCOPED_TRACE(name);
    ClusterOptions options;
    options.prefill = p;
    options.decode = d;
    options.mixed = m;
    options.model_dir = kMlaModel;
    // Every rank of a group holds the whole latent: P and D of different TP pair without
    // re-sharding.
    if (prefill_tp > 1) options.prefill_flags = {"--tp=" + std::to_string(prefill_tp)};
    if (decode_tp > 1) options.decode_flags = {"--tp=" + std::to_string(decode_tp)};
    auto cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    // Prompts of 1, 3, 7, 16 and 33 tokens (33: three latent blocks move), 16 greedy tokens each.
    for (size_t i : {0, 1, 2, 3, 5}) {
      Prompt prompt{prompts[i], static_cast<int>(greedy[i].size())};
      Result r = Generate((*cluster)->router(), ToRequest(prompt));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message() << (*cluster)->Logs();
      EXPECT_EQ(r.tokens, greedy[i]) << "prompt " << i;
    }
  }
}

// FP8 latent KV served disaggregated: a CPU FP8 block is one range of the pool, its codes then
// its row scales (runtime/engine/kv_layout.h, Fp8LatentBlocks), so it moves P -> D like any
// block: 1P1D, P a TP=2 group, D a TP=2 x DCP=2 group (each D rank reads its shard's whole
// blocks). Here 2 layers x 16 tokens x (40 codes + 4) = 1408 bytes a block.
TEST(MlaServingE2eTest, Fp8LatentPrefillDecodeEqualsTheMixedFp8Worker) {
  ExpectFp8KvRunsEqualTheMixedWorker(
      kMlaModel, {{"mixed", 0, 0, 1, {}, {}},
                  {"1P1D", 1, 1, 0, {}, {}},
                  {"1P1D prefill tp=2", 1, 1, 0, {"--tp=2"}, {}},
                  {"1P1D decode tp=2 dcp=2", 1, 1, 0, {}, {"--tp=2", "--dcp=2"}}});
}

// FP8 latent KV under data-parallel attention (--tp=2 --enable_expert_parallel --dp_attention)
// on the DeepSeek-V3 MoE fixture: P and D each a group of 2 DP ranks, each request's FP8 blocks
// in its DP rank's pool on both sides (read by the D rank holding the request, from the P rank
// holding it: RankGeometry.dp_size), the experts shared by all-to-all.
TEST(MlaServingE2eTest, Fp8LatentUnderDpAttentionEqualsTheMixedFp8Worker) {
  const std::vector<std::string> dp = {"--tp=2", "--enable_expert_parallel", "--dp_attention"};
  ExpectFp8KvRunsEqualTheMixedWorker("tests/golden/fixtures_mla/deepseek_v3_moe_f32",
                                     {{"mixed", 0, 0, 1, {}, {}},
                                      {"1P1D prefill and decode data-parallel attention", 1, 1, 0,
                                       dp, dp, "data-parallel attention over 2 ranks"}});
}

// A P with an FP8 latent and a D with the f32 one do not pair: their compatibility hashes differ
// (the latent dtype enters it; a handshake between them is refused naming both dtypes:
// runtime/parallel/kv_layout_info_test), so the router sends them nothing together and no KV
// byte moves.
TEST(MlaServingE2eTest, Fp8AndF32LatentWorkersDoNotPair) {
  std::ifstream in(std::string(kMlaModel) + "/expected.json");
  ASSERT_TRUE(in.good());
  const auto prompts =
      nlohmann::json::parse(in)["prompts"].get<std::vector<std::vector<uint32_t>>>();
  ClusterOptions options;
  options.prefill = 1;
  options.decode = 1;
  options.mixed = 0;
  options.model_dir = kMlaModel;
  options.prefill_flags = {"--kv_cache_dtype=fp8"};
  auto cluster = Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Result r = Generate((*cluster)->router(), ToRequest(Prompt{prompts[5], 4}));
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.error_message().find("none compatible"), std::string::npos)
      << r.status.error_message();
  // The router names both sides' KV dtypes (WorkerInfo.kv_dtype).
  EXPECT_NE(r.status.error_message().find(
                "prefill KV dtypes {KV_DTYPE_FP8_E4M3}, decode KV dtypes {KV_DTYPE_F32}"),
            std::string::npos)
      << r.status.error_message();
  auto stats = (*cluster)->Stats("decode-0");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->kv_bytes_received(), 0u);
}

}  // namespace
}  // namespace tandem::e2e
