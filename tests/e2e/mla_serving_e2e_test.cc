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

}  // namespace
}  // namespace tandem::e2e
