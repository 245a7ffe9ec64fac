// Data-parallel attention with expert parallelism (`--tp=N --enable_expert_parallel
// --dp_attention`; tensor_parallel.h, "Wide expert parallelism"), in process: two ranks (threads,
// Gloo on loopback) each run a whole Engine over the DP executor (dp_attention_executor.h) on
// the tiny-moe preset (Qwen3-MoE, 8 experts, top-2, two sparse layers; each rank holding 4
// experts whole and the rest of the model replicated). Both engines are given the same requests,
// so their schedulers (deterministic, fed the same all-reduced tokens) build the same steps, as
// rank 0's one scheduler and its broadcast plan would (the plan path itself:
// tests/golden:moe_dp_golden_test). Against one engine holding everything: the same greedy
// tokens, last-prompt logits within 1e-4 * max, the same per-expert token counts; requests
// spread over the DP ranks with their KV in their rank's pool; per step exactly one AllGather
// (the splits), two AllToAlls (dispatch, combine) per MoE layer and one AllReduce (the step's
// results), nothing else; a step where rank 1 has no request; one expert taking every token;
// each rank's part of a step carries the step's largest DP batch when every DP rank decodes
// (SchedulerOutput::dp_decode_seqs: the CUDA runner pads to it) and 0 otherwise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "comm/counting_process_group.h"
#include "comm/thread_ranks.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "runtime/engine/dp_attention_executor.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/engine/model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime {
namespace {

constexpr int kRanks = 2;
constexpr int64_t kMaxTokens = 4;

std::vector<std::vector<int32_t>> Prompts(int num, int64_t vocab) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(3, static_cast<int32_t>(vocab) - 1);
  std::vector<std::vector<int32_t>> prompts;
  const int64_t lengths[] = {5, 19, 9};
  for (int i = 0; i < num; ++i) {
    prompts.emplace_back(lengths[i % 3]);
    for (int32_t& t : prompts.back()) t = token(rng);
  }
  return prompts;
}

// The part of each step a DP rank's local executor got: SchedulerOutput::dp_decode_seqs, its
// sequences, whether they all decode.
struct LocalStep {
  int64_t dp_decode_seqs = -1;
  int64_t seqs = 0;
  bool decode = true;
};

// Records each step's part, then runs the wrapped executor.
class RecordingExecutor : public ModelExecutor {
 public:
  RecordingExecutor(std::unique_ptr<ModelExecutor> inner, std::vector<LocalStep>* steps)
      : inner_(std::move(inner)), steps_(steps) {}
  absl::StatusOr<RunnerOutput> Run(const SchedulerOutput& batch) override {
    LocalStep step{batch.dp_decode_seqs, static_cast<int64_t>(batch.seqs.size()), true};
    for (const ScheduledSeq& seq : batch.seqs) step.decode &= seq.new_tokens.size() == 1;
    steps_->push_back(step);
    return inner_->Run(batch);
  }
  void* kv_pool_data() override { return inner_->kv_pool_data(); }
  int64_t kv_pool_bytes() const override { return inner_->kv_pool_bytes(); }
  ExecutorStats stats() const override { return inner_->stats(); }

 private:
  const std::unique_ptr<ModelExecutor> inner_;
  std::vector<LocalStep>* const steps_;
};

struct RunResult {
  std::vector<LocalStep> local_steps;        // DP ranks only
  std::vector<std::vector<int32_t>> tokens;  // [request] generated
  std::vector<std::vector<float>> prompt_logits;
  std::vector<comm::CollectiveCounts> step_counts;  // one per step that ran the model
  std::vector<uint64_t> expert_tokens;
  std::vector<int64_t> free_blocks_per_pool;  // [DP rank], after the first step
  int64_t tokens_run = 0;
};

// Runs `prompts` to completion on an engine; with `group` as rank group->rank() of a DP group.
void RunEngine(bool forced, int num_requests, comm::CountingProcessGroup* group, RunResult* out) {
  const ModelConfig config = engine_test::TinyMoeConfig(forced);
  TpShard shard;
  if (group != nullptr) {
    shard = TpShard{group->rank(), group->size(), 1};
    shard.expert_parallel = true;
    shard.dp_attention = true;
  }
  auto local = LocalModelConfig(config, shard);
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_EQ(local->dp_attention, group != nullptr);
  auto weights = RandomModelWeights(config, 11, shard);
  ASSERT_TRUE(weights.ok()) << weights.status();
  if (forced) {  // every expert's logit 0: ties go to the lowest id, expert 0 (on rank 0)
    for (LayerWeights& layer : weights->layers) {
      std::fill(layer.router.begin(), layer.router.end(), 0.0f);
    }
  }
  const ExecutorFactory cpu = CpuExecutorFactory(1, group);
  ExecutorFactory recorded = cpu;
  recorded.create = [cpu, out](const ExecutorSpec& spec,
                               ModelWeights w) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
    ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> inner, cpu.create(spec, std::move(w)));
    return std::unique_ptr<ModelExecutor>(
        new RecordingExecutor(std::move(inner), &out->local_steps));
  };
  const ExecutorFactory factory =
      group != nullptr ? DpAttentionExecutorFactory(recorded, group) : cpu;
  EngineConfig engine_config;
  engine_config.block_size = 8;
  engine_config.kv_cache_bytes = 0;
  engine_config.enable_prefix_caching = false;
  ExecutorFactory sized = factory;
  sized.default_kv_cache_bytes = [&](const ModelConfig& c) -> absl::StatusOr<int64_t> {
    return 16 * KvBlockBytes(c, 8, KvDtype::kF32);  // 16 blocks per rank
  };
  auto engine = Engine::Create(engine_config, *local, *std::move(weights), {}, &sized);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<std::vector<int32_t>> prompts = Prompts(num_requests, config.vocab_size);
  out->tokens.assign(prompts.size(), {});
  out->prompt_logits.assign(prompts.size(), {});
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec spec;
    spec.prompt = prompts[i];
    spec.max_tokens = kMaxTokens;
    spec.ignore_eos = true;
    spec.capture_last_prompt_logits = true;
    ASSERT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), spec).ok());
    out->tokens_run += static_cast<int64_t>(prompts[i].size()) + kMaxTokens - 1;
  }
  bool first = true;
  while ((*engine)->HasUnfinished()) {
    const comm::CollectiveCounts before =
        group != nullptr ? group->counts() : comm::CollectiveCounts{};
    auto updates = (*engine)->Step();
    ASSERT_TRUE(updates.ok()) << updates.status();
    if (first) {
      out->free_blocks_per_pool = (*engine)->kv_cache_stats().free_blocks_per_shard;
      first = false;
    }
    if (group != nullptr) out->step_counts.push_back(comm::CountsBetween(before, group->counts()));
    for (RequestUpdate& u : *updates) {
      for (int32_t t : u.new_token_ids) out->tokens[u.request_id].push_back(t);
      if (!u.last_prompt_logits.empty()) {
        out->prompt_logits[u.request_id] = std::move(u.last_prompt_logits);
      }
    }
  }
  out->expert_tokens = (*engine)->executor_stats().moe_expert_tokens;
}

std::vector<RunResult> RunGroup(bool forced, int num_requests) {
  std::vector<RunResult> results(kRanks);
  comm::RunThreadRanks(kRanks, [&](int r, comm::CountingProcessGroup& group) {
    RunEngine(forced, num_requests, &group, &results[r]);
  });
  return results;
}

// The group's results (empty after a failure), checked against one engine alone.
std::vector<RunResult> ExpectSameAsOneEngine(bool forced, int num_requests) {
  RunResult alone;
  RunEngine(forced, num_requests, nullptr, &alone);
  if (::testing::Test::HasFailure()) return {};
  std::vector<RunResult> group = RunGroup(forced, num_requests);
  if (::testing::Test::HasFailure()) return {};
  const ModelConfig config = engine_test::TinyMoeConfig(forced);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) moe_layers += config.IsMoeLayer(l);
  EXPECT_GT(moe_layers, 0);
  for (int r = 0; r < kRanks; ++r) {
    const RunResult& got = group[r];
    EXPECT_EQ(got.tokens, alone.tokens) << "rank " << r;
    for (size_t i = 0; i < alone.prompt_logits.size(); ++i) {
      const std::vector<float>& want = alone.prompt_logits[i];
      EXPECT_EQ(got.prompt_logits[i].size(), want.size()) << "rank " << r << " request " << i;
      if (got.prompt_logits[i].size() != want.size()) continue;
      float scale = 0.0f, worst = 0.0f;
      for (size_t v = 0; v < want.size(); ++v) {
        scale = std::max(scale, std::abs(want[v]));
        worst = std::max(worst, std::abs(got.prompt_logits[i][v] - want[v]));
      }
      EXPECT_LE(worst, 1e-4f * scale) << "rank " << r << " request " << i;
    }
    // The executor sums every rank's routing: the group's counts on each rank.
    EXPECT_EQ(got.expert_tokens, alone.expert_tokens) << "rank " << r;
    EXPECT_FALSE(got.step_counts.empty());
    for (const comm::CollectiveCounts& c : got.step_counts) {
      EXPECT_EQ(c.all_to_all, 2 * moe_layers) << "rank " << r;  // dispatch + combine
      EXPECT_EQ(c.all_gather, moe_layers) << "rank " << r;      // the splits
      EXPECT_EQ(c.all_reduce, 1) << "rank " << r;               // the step's results
      EXPECT_EQ(c.reduce_scatter + c.broadcast + c.barrier + c.send + c.recv, 0) << "rank " << r;
    }
    EXPECT_EQ(got.free_blocks_per_pool.size(), static_cast<size_t>(kRanks));
  }
  EXPECT_EQ(group[0].step_counts.size(), group[1].step_counts.size());
  // Every rank's part names the step's largest DP batch when all DP ranks decode, 0 otherwise.
  EXPECT_EQ(group[0].local_steps.size(), group[1].local_steps.size());
  EXPECT_FALSE(group[0].local_steps.empty());
  const size_t steps = std::min(group[0].local_steps.size(), group[1].local_steps.size());
  for (size_t i = 0; i < steps; ++i) {
    const LocalStep& a = group[0].local_steps[i];
    const LocalStep& b = group[1].local_steps[i];
    EXPECT_EQ(a.dp_decode_seqs, b.dp_decode_seqs) << "step " << i;
    EXPECT_EQ(a.dp_decode_seqs, a.decode && b.decode ? std::max(a.seqs, b.seqs) : 0)
        << "step " << i;
  }
  uint64_t routed = 0;
  for (uint64_t n : alone.expert_tokens) routed += n;
  EXPECT_EQ(routed,
            static_cast<uint64_t>(alone.tokens_run * moe_layers * config.num_experts_per_tok));
  if (forced) {
    EXPECT_EQ(alone.expert_tokens[0], static_cast<uint64_t>(alone.tokens_run * moe_layers));
  }
  return group;
}

// Three requests: DP ranks 0, 1, 0 (fewest assigned first), each request's blocks in its rank's
// pool: after the prefill step (block size 8) requests 0 (5 tokens, 1 block) and 2 (9 tokens, 2)
// hold 3 of rank 0's 16 blocks, request 1 (19 tokens) 3 of rank 1's.
TEST(MoeDpTest, TwoDpRanksEqualOneEngine) {
  const std::vector<RunResult> group = ExpectSameAsOneEngine(false, 3);
  ASSERT_EQ(group.size(), static_cast<size_t>(kRanks));
  for (const RunResult& rank : group) {
    EXPECT_EQ(rank.free_blocks_per_pool, (std::vector<int64_t>{13, 13}));
  }
}

// One request, on DP rank 0: rank 1 runs an empty batch every step (its pool stays untouched)
// and still joins every collective (the per-step counts above, on both ranks).
TEST(MoeDpTest, IdleRankRunsEmptyBatches) {
  const std::vector<RunResult> group = ExpectSameAsOneEngine(false, 1);
  ASSERT_EQ(group.size(), static_cast<size_t>(kRanks));
  for (const RunResult& rank : group) {
    EXPECT_EQ(rank.free_blocks_per_pool, (std::vector<int64_t>{15, 16}));
    EXPECT_EQ(rank.step_counts.size(), static_cast<size_t>(kMaxTokens));
  }
}

// Every token's one expert is expert 0, on rank 0: rank 1 computes no row of its own experts.
TEST(MoeDpTest, OneExpertTakesEveryToken) {
  EXPECT_EQ(ExpectSameAsOneEngine(true, 3).size(), static_cast<size_t>(kRanks));
}

TEST(MoeDpTest, RefusalsNameTheNumbers) {
  const ModelConfig moe = engine_test::TinyMoeConfig(false);
  TpShard no_ep{0, 2, 1};
  no_ep.dp_attention = true;
  auto dims = ComputeTpDims(moe, no_ep);
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("--dp_attention needs --enable_expert_parallel"),
            std::string::npos)
      << dims.status();
  TpShard dcp{0, 4, 2};
  dcp.expert_parallel = dcp.dp_attention = true;
  dims = ComputeTpDims(moe, dcp);
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("--dcp=2 would split it over 2 ranks"), std::string::npos)
      << dims.status();
  TpShard three{0, 3, 1};
  three.expert_parallel = three.dp_attention = true;
  dims = ComputeTpDims(moe, three);
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("the group's 3 ranks do not divide the model's 8 experts"),
            std::string::npos)
      << dims.status();
  // Under DP attention a rank holds the whole model but its experts.
  TpShard two{1, 2, 1};
  two.expert_parallel = two.dp_attention = true;
  auto local = LocalModelConfig(moe, two);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->num_attention_heads, moe.num_attention_heads);
  EXPECT_EQ(local->num_key_value_heads, moe.num_key_value_heads);
  EXPECT_EQ(local->intermediate_size, moe.intermediate_size);
  EXPECT_EQ(local->NumHeldExperts(), moe.num_experts / 2);
  EXPECT_TRUE(local->dp_attention);
}

}  // namespace
}  // namespace tandem::runtime
