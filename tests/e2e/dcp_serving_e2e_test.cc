// Decode context parallelism served for real (tandem_worker --tp=N --dcp=K: rank 0 serves and
// schedules, its ranks are child processes over Gloo on loopback) behind a real tandem_router:
//   * P groups (TP 1 and 2) hand off to decode groups with DCP 2 (TP_A 1 and 2), and a DCP
//     mixed group serves alone: greedy tokens equal the TP=1 engine's on the golden fixture; each
//     D rank received exactly its shard's blocks (bytes in the ratio of the blocks each shard
//     owns), no load failed, nothing recomputed, every shard's pool back to full;
//   * SIGKILL of a DCP rank mid-stream: the client gets UNAVAILABLE within 5 s, the prefill side
//     holds no lease, the group is restarted in place and serves again.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/e2e/serving_util.h"

namespace tandem::e2e {
namespace {

constexpr uint64_t kBlockSize = 16;  // the workers' default

// Blocks of the handed-off prompts that DCP shard k owns (logical block i on shard i % dcp with
// the default interleave of one block).
std::vector<uint64_t> ShardBlocks(const std::vector<Prompt>& prompts, int dcp) {
  std::vector<uint64_t> blocks(dcp, 0);
  for (const Prompt& p : prompts) {
    const uint64_t n = (p.ids.size() + kBlockSize - 1) / kBlockSize;
    for (uint64_t i = 0; i < n; ++i) ++blocks[i % dcp];
  }
  return blocks;
}

TEST(DcpServingE2eTest, PrefillGroupsIntoDcpDecodeGroupsEqualTheEngine) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::vector<Prompt> prompts = RandomPrompts(seed, 5, 70);
  for (Prompt& p : prompts) p.max_tokens = std::max(p.max_tokens, 4);  // every one handed off
  const auto expected = Reference(prompts);
  struct Shape {
    int prefill_tp, decode_tp, dcp;
  };
  for (const Shape shape : {Shape{1, 2, 2}, Shape{2, 4, 2}}) {
    SCOPED_TRACE(testing::Message() << "P TP=" << shape.prefill_tp << " -> D TP=" << shape.decode_tp
                                    << " DCP=" << shape.dcp);
    ClusterOptions options;
    options.model_dir = kModel;
    options.worker_flags = {"--num_threads=1"};
    options.prefill_flags = {absl::StrCat("--tp=", shape.prefill_tp)};
    options.decode_flags = {absl::StrCat("--tp=", shape.decode_tp),
                            absl::StrCat("--dcp=", shape.dcp)};
    auto started = Cluster::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    Cluster& cluster = **started;
    ASSERT_NO_FATAL_FAILURE(ExpectServedTokens(cluster, prompts, expected));
    absl::StatusOr<tandem::v1::WorkerStats> stats = cluster.Stats("decode-0");
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->info().group().dcp_size(), static_cast<uint32_t>(shape.dcp));
    EXPECT_EQ(stats->kv_load_failures(), 0u) << cluster.Logs();
    EXPECT_EQ(stats->kv_recomputes(), 0u);
    EXPECT_EQ(stats->kv_loads_completed(), prompts.size());
    EXPECT_GT(stats->prefix_cache_queried_tokens(), 0u);
    // Each rank kept exactly its shard's blocks: bytes proportional to the shard's block count
    // (TP_A ranks of one shard hold equal head shares).
    const std::vector<uint64_t> blocks = ShardBlocks(prompts, shape.dcp);
    ASSERT_EQ(stats->kv_bytes_received_per_rank_size(), shape.decode_tp);
    const uint64_t per_block = stats->kv_bytes_received_per_rank(0) / blocks[0];
    ASSERT_GT(per_block, 0u);
    for (int r = 0; r < shape.decode_tp; ++r) {
      SCOPED_TRACE(testing::Message() << "D rank " << r << " (shard " << r % shape.dcp << ")");
      EXPECT_EQ(stats->kv_bytes_received_per_rank(r), blocks[r % shape.dcp] * per_block);
    }
    // The longest prompt again: D's prefix cache holds its full blocks (hashes are global), so
    // each shard reads only its blocks past the cached prefix: the last, partial one, or none
    // when the prompt fills whole blocks (D's tokens are the prompt plus P's first token, so the
    // cache's one-token-to-compute cap still admits every full prompt block).
    const auto longest = std::max_element(
        prompts.begin(), prompts.end(),
        [](const Prompt& a, const Prompt& b) { return a.ids.size() < b.ids.size(); });
    const uint64_t n = longest->ids.size(), cached = n / kBlockSize;
    std::vector<uint64_t> delta(shape.dcp, 0);
    for (uint64_t i = cached; i < (n + kBlockSize - 1) / kBlockSize; ++i) ++delta[i % shape.dcp];
    Result again = Generate(cluster.router(), ToRequest(*longest));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(again.tokens, expected[longest - prompts.begin()]);
    absl::StatusOr<tandem::v1::WorkerStats> after = cluster.Stats("decode-0");
    ASSERT_TRUE(after.ok()) << after.status();
    for (int r = 0; r < shape.decode_tp; ++r) {
      EXPECT_EQ(after->kv_bytes_received_per_rank(r) - stats->kv_bytes_received_per_rank(r),
                delta[r % shape.dcp] * per_block)
          << "D rank " << r << ": only the blocks past the cached prefix are read";
    }
    stats = std::move(after);
    // Every shard's pool is whole again (requests finished, blocks freed or cached).
    ASSERT_EQ(stats->kv_free_blocks_per_shard_size(), shape.dcp);
    const uint64_t shard_blocks = stats->load().kv_blocks_total() / shape.dcp;
    for (int k = 0; k < shape.dcp; ++k) {
      EXPECT_EQ(stats->kv_free_blocks_per_shard(k), shard_blocks) << "shard " << k;
    }
  }
}

TEST(DcpServingE2eTest, DcpMixedGroupEqualsTheEngine) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<Prompt> prompts = RandomPrompts(seed, 6, 70);
  const auto expected = Reference(prompts);
  auto cluster = StartCluster(0, 0, 1, {}, {"--tp=2", "--dcp=2", "--num_threads=1"});
  ASSERT_NE(cluster, nullptr);
  ASSERT_NO_FATAL_FAILURE(ExpectServedTokens(*cluster, prompts, expected));
}

TEST(DcpServingE2eTest, KillDcpRankMidStreamFreesThePrefillSide) {
  KillDecodeRankMidStream({"--tp=2", "--dcp=2"});
}

}  // namespace
}  // namespace tandem::e2e
