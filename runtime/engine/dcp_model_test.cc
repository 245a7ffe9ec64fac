// Decode context parallelism's communication pattern, counted: two ranks (threads, Gloo on
// loopback) of a --tp=2 --dcp=2 group run one decode step at 1k and at 8k tokens of context
// through the real KV-cache manager and ModelRunner. Per step: exactly one all-to-all per layer
// (attention), the TP all-reduces (embedding, o_proj and down_proj of each layer), one all-gather
// (the vocab-parallel logits, after the last layer), nothing else; and the all-to-all moves the
// same bytes at 8k as at 1k. (Outputs against transformers and DCP=1: dcp_golden_test.)
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "comm/counting_process_group.h"
#include "comm/gloo_process_group.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"
#include "runtime/engine/model_runner.h"
#include "runtime/kv_cache/kv_cache_manager.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime {
namespace {

constexpr int kRanks = 2;
constexpr int64_t kBlockSize = 16;
constexpr int64_t kBlocksPerRank = 300;  // 2 x 4800 tokens: 8k fits only over both shards

ModelConfig TestConfig() {
  ModelConfig c = PresetConfig("tiny").value();
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = c.hidden_size / 8;
  c.max_position_embeddings = 16384;
  return c;
}

struct StepCounts {
  comm::CollectiveCounts at_1k, at_8k;
  int32_t token_1k = -1, token_8k = -1;
};

// One rank: builds its executor, fills its pool with random KV, runs a decode step of one request
// at each context length and records the collectives of each step.
void RunRank(int rank, int port, StepCounts* out) {
  comm::GlooGroupOptions options;
  options.rank = rank;
  options.world_size = kRanks;
  options.store_port = port;
  options.serve_store = false;
  options.timeout = absl::Seconds(60);
  auto gloo = comm::GlooProcessGroup::Create(options);
  ASSERT_TRUE(gloo.ok()) << gloo.status();
  comm::CountingProcessGroup counting(gloo->get());
  const ModelConfig config = TestConfig();
  const TpShard shard{rank, kRanks, kRanks};
  auto local = LocalModelConfig(config, shard);
  ASSERT_TRUE(local.ok()) << local.status();
  auto weights = RandomModelWeights(config, 7, shard);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const ExecutorFactory factory = CpuExecutorFactory(1, &counting, kRanks, 0);
  ExecutorSpec spec;
  spec.model_config = *local;
  spec.num_blocks = kBlocksPerRank;
  spec.block_size = kBlockSize;
  auto executor = factory.create(spec, *std::move(weights));
  ASSERT_TRUE(executor.ok()) << executor.status();
  float* pool = static_cast<float*>((*executor)->kv_pool_data());
  std::mt19937 rng(100 + rank);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < (*executor)->kv_pool_bytes() / 4; ++i) pool[i] = normal(rng);

  KvCacheConfig kv_config;
  kv_config.num_blocks = kRanks * kBlocksPerRank;
  kv_config.block_size = kBlockSize;
  kv_config.dcp_size = kRanks;
  auto kv = KvCacheManager::Create(kv_config);
  ASSERT_TRUE(kv.ok()) << kv.status();
  for (const int64_t context : {int64_t{1024}, int64_t{8192}}) {
    ASSERT_TRUE((*kv)->Allocate(context, context, nullptr)) << context;
    const std::vector<int32_t> token = {5};
    SchedulerOutput batch;
    ScheduledSeq seq;
    seq.request_id = context;
    seq.new_tokens = token;
    seq.num_computed_tokens = context - 1;
    seq.block_table = (*kv)->BlockTable(context);
    seq.samples = true;
    batch.seqs.push_back(seq);
    const comm::CollectiveCounts before = counting.counts();
    auto result = (*executor)->Run(batch);
    ASSERT_TRUE(result.ok()) << result.status();
    (context == 1024 ? out->at_1k : out->at_8k) = comm::CountsBetween(before, counting.counts());
    (context == 1024 ? out->token_1k : out->token_8k) = result->sampled_tokens[0];
  }
}

TEST(DcpModelTest, OneAllToAllPerLayerWhoseSizeDoesNotGrowWithContext) {
  auto server = comm::TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  StepCounts counts[kRanks];
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] { RunRank(r, (*server)->port(), &counts[r]); });
  }
  for (std::thread& t : threads) t.join();
  const int64_t layers = TestConfig().num_hidden_layers;
  for (int r = 0; r < kRanks; ++r) {
    for (const comm::CollectiveCounts* c : {&counts[r].at_1k, &counts[r].at_8k}) {
      EXPECT_EQ(c->all_to_all, layers) << "rank " << r;
      EXPECT_EQ(c->all_reduce, 2 * layers + 1) << "rank " << r;  // embedding, o_proj, down_proj
      EXPECT_EQ(c->all_gather, 1) << "rank " << r;               // logits, after the last layer
      EXPECT_EQ(c->reduce_scatter + c->broadcast + c->barrier + c->send + c->recv, 0);
      EXPECT_GT(c->all_to_all_elems, 0);
    }
    EXPECT_EQ(counts[r].at_1k.all_to_all_elems, counts[r].at_8k.all_to_all_elems) << "rank " << r;
    EXPECT_EQ(counts[r].at_1k.all_reduce_elems, counts[r].at_8k.all_reduce_elems) << "rank " << r;
    // Both ranks sampled the same token from the gathered logits.
    EXPECT_EQ(counts[r].token_1k, counts[0].token_1k);
    EXPECT_EQ(counts[r].token_8k, counts[0].token_8k);
  }
  // One decode token, 8 heads of 8 dims + lse, 2 regions padded to 16 bytes: independent of
  // context by construction; printed for the note.
  std::printf("all-to-all floats per step per rank: %lld at 1k and %lld at 8k\n",
              static_cast<long long>(counts[0].at_1k.all_to_all_elems),
              static_cast<long long>(counts[0].at_8k.all_to_all_elems));
}

}  // namespace
}  // namespace tandem::runtime
