// A mixture-of-experts model served end to end on the CPU backend: tandem_router +
// tandem_worker processes on loopback with the Qwen2-MoE golden fixture (shared expert, a dense
// and a sparse layer). A mixed worker, prefill -> decode with KV over UCX, prefill -> a decode
// group of 2 TP ranks (each a slice of every expert), and a prefill group of 2 TP ranks -> a
// decode group of 2 expert-parallel ranks (--enable_expert_parallel: 3 whole experts each), and
// prefill -> a decode group of 2 data-parallel attention ranks (--dp_attention: each decodes its
// own requests with their whole KV, read from the prefill worker by that rank alone; the
// requests, one at a time, alternate between the ranks) must all produce transformers' greedy
// tokens (the fixture's expected.json), and so must a prefill group of 2 data-parallel attention
// ranks (the KV source: each request's blocks on its DP rank, read from that rank; KvHandle ids
// name it, RankGeometry.dp_size) -> decode TP=1 and -> a data-parallel attention decode group; the
// workers' stats count the tokens routed to each of the 6 experts.
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

constexpr char kMoeModel[] = "tests/golden/fixtures/qwen2_moe_f32";

TEST(MoeServingE2eTest, MixedAndPrefillDecodeEqualTransformers) {
  std::ifstream in(std::string(kMoeModel) + "/expected.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json expected = nlohmann::json::parse(in);
  const auto prompts = expected["prompts"].get<std::vector<std::vector<uint32_t>>>();
  const auto greedy = expected["greedy_tokens"].get<std::vector<std::vector<uint32_t>>>();
  // dp: which side runs --enable_expert_parallel --dp_attention (1 decode, 2 prefill, 3 both).
  for (auto [name, p, d, m, decode_tp, ep, dp] :
       {std::tuple<const char*, int, int, int, int, bool, int>{"mixed", 0, 0, 1, 1, false, 0},
        {"1P1D", 1, 1, 0, 1, false, 0},
        {"1P1D decode tp=2", 1, 1, 0, 2, false, 0},
        {"1P1D prefill tp=2, decode tp=2 expert-parallel", 1, 1, 0, 2, true, 0},
        {"1P1D decode tp=2 expert-parallel, data-parallel attention", 1, 1, 0, 2, false, 1},
        {"1P1D prefill tp=2 data-parallel attention -> decode tp=1", 1, 1, 0, 1, false, 2},
        {"1P1D prefill and decode tp=2 data-parallel attention", 1, 1, 0, 2, false, 3}}) {
    SCOPED_TRACE(name);
    ClusterOptions options;
    options.prefill = p;
    options.decode = d;
    options.mixed = m;
    options.model_dir = kMoeModel;
    if (decode_tp > 1) options.decode_flags = {"--tp=" + std::to_string(decode_tp)};
    if (ep) {
      options.prefill_flags = {"--tp=2"};
      options.decode_flags.push_back("--enable_expert_parallel");
    }
    if (dp & 1) {
      options.decode_flags.push_back("--enable_expert_parallel");
      options.decode_flags.push_back("--dp_attention");
    }
    if (dp & 2) {  // the prefill group's requests alternate between its 2 DP ranks' pools
      options.prefill_flags = {"--tp=2", "--enable_expert_parallel", "--dp_attention"};
    }
    auto cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    // Prompts of 1, 3, 7, 16 and 33 tokens, 16 greedy tokens each.
    for (size_t i : {0, 1, 2, 3, 5}) {
      Prompt prompt{prompts[i], static_cast<int>(greedy[i].size())};
      Result r = Generate((*cluster)->router(), ToRequest(prompt));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message() << (*cluster)->Logs();
      EXPECT_EQ(r.tokens, greedy[i]) << "prompt " << i;
    }
    if (dp) {
      EXPECT_NE((*cluster)->Logs().find("data-parallel attention over 2 ranks"), std::string::npos);
    }
    if (ep) {  // the decode group's rank 0 logs its placement
      EXPECT_NE(
          (*cluster)->Logs().find("expert parallelism, 6 experts over 2 ranks: rank 0 [0..2], "
                                  "rank 1 [3..5]"),
          std::string::npos);
    }
    // Every worker that ran tokens counted them per expert: 6 experts, top-2 of one sparse layer.
    for (const std::string id : {"mixed-0", "prefill-0", "decode-0"}) {
      if ((id[0] == 'm') != (m > 0)) continue;
      absl::StatusOr<tandem::v1::WorkerStats> stats = (*cluster)->Stats(id);
      ASSERT_TRUE(stats.ok()) << id << ": " << stats.status();
      ASSERT_EQ(stats->moe_expert_tokens_size(), 6) << id;
      uint64_t routed = 0;
      for (uint64_t n : stats->moe_expert_tokens()) routed += n;
      EXPECT_GT(routed, 0u) << id;
      EXPECT_EQ(routed % 2, 0u) << id;
    }
  }
}

}  // namespace
}  // namespace tandem::e2e
