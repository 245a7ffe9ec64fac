// Worker groups with ranks as threads of one process over real Gloo groups (loopback): the
// sharded model through GroupExecutor / RunFollower against the same model at TP=1 (greedy
// tokens identical, last-prompt logits within 1e-4 * max), plans round-trip, a dead or
// disagreeing rank fails the others instead of hanging them, and an idle group outlives its
// collective deadline on keepalives.
#include "runtime/parallel/group_executor.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/gloo_process_group.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/tensor_parallel.h"
#include "runtime/parallel/plan_codec.h"

namespace tandem::runtime {
namespace {

using comm::GlooProcessGroup;

// Runs body(rank, group) on `size` threads, each rank with its own Gloo group.
void RunRanks(int size, absl::Duration timeout,
              const std::function<void(int, std::unique_ptr<GlooProcessGroup>)>& body) {
  auto server = comm::TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      comm::GlooGroupOptions o;
      o.rank = r;
      o.world_size = size;
      o.store_port = (*server)->port();
      o.serve_store = false;
      o.timeout = timeout;
      auto group = GlooProcessGroup::Create(o);
      ASSERT_TRUE(group.ok()) << group.status();
      body(r, *std::move(group));
    });
  }
  for (auto& t : threads) t.join();
}

ModelConfig TestConfig() {
  ModelConfig c = *PresetConfig("tiny");
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 250;  // a padded last vocab partition at TP=4
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.tie_word_embeddings = false;
  c.eos_token_ids.clear();
  return c;
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;
};

std::vector<std::vector<int32_t>> Prompts() {
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {1, 5, 17, 40}) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(3 + (i * 37 + len * 11) % 240);
    prompts.push_back(p);
  }
  return prompts;
}

// Runs the prompts as one continuous batch (chunked prefill: 24-token budget) to completion.
Outputs RunEngine(Engine* engine) {
  const auto prompts = Prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec spec;
    spec.prompt = prompts[i];
    spec.max_tokens = 12;
    spec.capture_last_prompt_logits = true;
    EXPECT_TRUE(engine->AddRequest(static_cast<int64_t>(i), std::move(spec)).ok());
  }
  Outputs out;
  out.tokens.resize(prompts.size());
  out.logits.resize(prompts.size());
  while (engine->HasUnfinished()) {
    auto updates = engine->Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    for (RequestUpdate& u : *updates) {
      auto& t = out.tokens[u.request_id];
      t.insert(t.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      if (!u.last_prompt_logits.empty()) out.logits[u.request_id] = u.last_prompt_logits;
    }
  }
  return out;
}

EngineConfig SmallEngine() {
  EngineConfig ec;
  ec.kv_cache_bytes = 4 << 20;
  ec.max_num_batched_tokens = 24;
  ec.num_threads = 1;
  return ec;
}

Outputs RunTp1(const ModelConfig& config) {
  auto engine = Engine::Create(SmallEngine(), config, RandomModelWeights(config, 5));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return RunEngine(engine->get());
}

// Rank 0 builds the engine over the group; the others follow. Returns rank 0's outputs.
Outputs RunTp(const ModelConfig& config, int tp) {
  Outputs result;
  RunRanks(tp, absl::Seconds(20), [&](int rank, std::unique_ptr<GlooProcessGroup> group) {
    auto local = LocalModelConfig(config, TpShard{rank, tp});
    ASSERT_TRUE(local.ok()) << local.status();
    auto weights = RandomModelWeights(config, 5, TpShard{rank, tp});
    ASSERT_TRUE(weights.ok()) << weights.status();
    const ExecutorFactory cpu = CpuExecutorFactory(1, group.get());
    if (rank > 0) {
      EXPECT_TRUE(RunFollower(group.get(), cpu, *local, *std::move(weights)).ok());
      return;
    }
    const ExecutorFactory fanned = GroupExecutorFactory(cpu, group.get());
    auto engine = Engine::Create(SmallEngine(), *local, *std::move(weights), {}, &fanned);
    ASSERT_TRUE(engine.ok()) << engine.status();
    result = RunEngine(engine->get());
    EXPECT_TRUE((*engine)->executor_health().ok());
  });
  return result;
}

TEST(GroupExecutorTest, ShardedEngineMatchesTp1) {
  const ModelConfig config = TestConfig();
  const Outputs want = RunTp1(config);
  for (int tp : {2, 4}) {  // 4: the 2 KV heads replicated on 2 ranks each
    const Outputs got = RunTp(config, tp);
    ASSERT_EQ(got.tokens.size(), want.tokens.size());
    for (size_t i = 0; i < want.tokens.size(); ++i) {
      EXPECT_EQ(got.tokens[i], want.tokens[i]) << "tp " << tp << " prompt " << i;
      ASSERT_EQ(got.logits[i].size(), want.logits[i].size());
      float max_abs = 0.0f, max_diff = 0.0f;
      for (size_t j = 0; j < want.logits[i].size(); ++j) {
        max_abs = std::max(max_abs, std::fabs(want.logits[i][j]));
        max_diff = std::max(max_diff, std::fabs(got.logits[i][j] - want.logits[i][j]));
      }
      EXPECT_LE(max_diff, 1e-4f * max_abs) << "tp " << tp << " prompt " << i;
    }
  }
}

TEST(GroupExecutorTest, StepPlanRoundTrips) {
  std::vector<int32_t> tokens = {5, 6, 7}, blocks = {9, 4};
  SchedulerOutput batch;
  ScheduledSeq seq;
  seq.request_id = 42;
  seq.new_tokens = tokens;
  seq.num_computed_tokens = 13;
  seq.block_table = blocks;
  seq.samples = true;
  seq.sampling.temperature = 0.7f;
  seq.sampling.top_k = 5;
  seq.sampling.top_p = 0.9f;
  seq.sampling.seed = 77;
  seq.sampling.vocab_limit = 151665;
  seq.sample_step = 3;
  seq.num_draft_tokens = 2;  // tokens 6, 7 are drafts: every rank computes 3 logit rows
  batch.seqs.push_back(seq);
  batch.num_batched_tokens = 3;
  ReceivedStep got;
  ASSERT_TRUE(FromStepPlan(ToStepPlan(batch), &got).ok());
  ASSERT_EQ(got.batch.seqs.size(), 1u);
  const ScheduledSeq& s = got.batch.seqs[0];
  EXPECT_EQ(s.request_id, 42);
  EXPECT_EQ(std::vector<int32_t>(s.new_tokens.begin(), s.new_tokens.end()), tokens);
  EXPECT_EQ(std::vector<int32_t>(s.block_table.begin(), s.block_table.end()), blocks);
  EXPECT_EQ(s.num_computed_tokens, 13);
  EXPECT_TRUE(s.samples);
  EXPECT_FLOAT_EQ(s.sampling.temperature, 0.7f);
  EXPECT_EQ(s.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(s.sampling.top_p, 0.9f);
  EXPECT_EQ(s.sampling.seed, 77u);
  EXPECT_EQ(s.sampling.vocab_limit, 151665);  // every rank masks the same padding ids
  EXPECT_EQ(s.sample_step, 3);
  EXPECT_EQ(s.num_draft_tokens, 2);
  EXPECT_EQ(got.batch.num_batched_tokens, 3);
}

TEST(GroupExecutorTest, DisagreeingRankFailsEveryRankNamingIt) {
  RunRanks(3, absl::Seconds(10), [](int rank, std::unique_ptr<GlooProcessGroup> group) {
    const std::string identity = rank == 2 ? "model B" : "model A";
    absl::Status s = CheckGroupAgreement(group.get(), identity);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << rank;
    EXPECT_NE(s.message().find("rank(s) 2 "), std::string::npos) << s;
    EXPECT_NE(s.message().find("model A"), std::string::npos) << s;
  });
  RunRanks(2, absl::Seconds(10), [](int, std::unique_ptr<GlooProcessGroup> group) {
    EXPECT_TRUE(CheckGroupAgreement(group.get(), "same").ok());
  });
}

TEST(GroupExecutorTest, DeadFollowerFailsTheStepAndHealth) {
  const ModelConfig config = TestConfig();
  RunRanks(2, absl::Seconds(5), [&](int rank, std::unique_ptr<GlooProcessGroup> group) {
    auto local = LocalModelConfig(config, TpShard{rank, 2});
    auto weights = RandomModelWeights(config, 5, TpShard{rank, 2});
    ASSERT_TRUE(weights.ok());
    const ExecutorFactory cpu = CpuExecutorFactory(1, group.get());
    if (rank == 1) {
      // Builds its executor, then "dies": its group (every connection) goes away.
      auto command = ReceiveCommand(group.get());
      ASSERT_TRUE(command.ok() && command->has_create());
      auto made = cpu.create({}, RandomModelWeights(config, 5, TpShard{1, 2}).value());
      const float ok = 1.0f;
      std::vector<float> all(2);
      ASSERT_TRUE(group->AllGather(absl::MakeConstSpan(&ok, 1), absl::MakeSpan(all)).ok());
      group.reset();
      return;
    }
    const ExecutorFactory fanned = GroupExecutorFactory(cpu, group.get());
    auto engine = Engine::Create(SmallEngine(), *local, *std::move(weights), {}, &fanned);
    ASSERT_TRUE(engine.ok()) << engine.status();
    absl::SleepFor(absl::Milliseconds(300));  // rank 1 is gone
    RequestSpec spec;
    spec.prompt = {5, 6, 7};
    spec.max_tokens = 4;
    ASSERT_TRUE((*engine)->AddRequest(1, spec).ok());
    const absl::Time start = absl::Now();
    auto step = (*engine)->Step();
    EXPECT_LT(absl::Now() - start, absl::Seconds(4)) << "must not wait for the deadline";
    EXPECT_FALSE(step.ok());
    EXPECT_EQ((*engine)->executor_health().code(), absl::StatusCode::kUnavailable)
        << (*engine)->executor_health();
    EXPECT_FALSE((*engine)->Step().ok());  // broken for good
  });
}

TEST(GroupExecutorTest, IdleGroupOutlivesItsDeadlineOnKeepalives) {
  const ModelConfig config = TestConfig();
  RunRanks(2, absl::Milliseconds(1500), [&](int rank, std::unique_ptr<GlooProcessGroup> group) {
    auto local = LocalModelConfig(config, TpShard{rank, 2});
    auto weights = RandomModelWeights(config, 5, TpShard{rank, 2});
    ASSERT_TRUE(weights.ok());
    const ExecutorFactory cpu = CpuExecutorFactory(1, group.get());
    if (rank == 1) {
      EXPECT_TRUE(RunFollower(group.get(), cpu, *local, *std::move(weights)).ok());
      return;
    }
    GroupExecutorOptions options;
    options.keepalive = absl::Milliseconds(200);
    const ExecutorFactory fanned = GroupExecutorFactory(cpu, group.get(), options);
    auto engine = Engine::Create(SmallEngine(), *local, *std::move(weights), {}, &fanned);
    ASSERT_TRUE(engine.ok()) << engine.status();
    absl::SleepFor(absl::Seconds(3));  // twice the collective deadline, idle
    RequestSpec spec;
    spec.prompt = {5, 6, 7};
    spec.max_tokens = 2;
    ASSERT_TRUE((*engine)->AddRequest(1, spec).ok());
    while ((*engine)->HasUnfinished()) ASSERT_TRUE((*engine)->Step().ok());
    EXPECT_TRUE((*engine)->executor_health().ok());
  });
}

}  // namespace
}  // namespace tandem::runtime
