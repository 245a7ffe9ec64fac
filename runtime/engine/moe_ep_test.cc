// Expert parallelism over the TP ranks (`--tp=N --enable_expert_parallel`, tensor_parallel.h),
// in process: N ranks (threads, Gloo on loopback) of the tiny-moe preset (Qwen3-MoE, 8 experts,
// top-2, two sparse layers), each holding its experts whole and drawing its dummy weights by
// global element index, run a prefill step of three prompts and three decode steps through the
// real ModelRunner. Against one rank holding everything (no group): the same sampled tokens,
// last-prompt logits within 1e-4 * max, the same per-expert token counts; per step exactly the
// TP all-reduces (embedding, o_proj and the MoE layer's one), one all-gather (logits) and no
// all-to-all. The forced case zeroes the routers with top-1, so expert 0 takes every token and
// the ranks holding the other experts get none. (Against transformers: moe_ep_golden_test.)
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "comm/counting_process_group.h"
#include "comm/thread_ranks.h"
#include "gtest/gtest.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/engine/model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr int64_t kBlocksPerSeq = 4;
constexpr int kDecodeSteps = 3;

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;  // [seq] sampled tokens, prefill then decode
  std::vector<std::vector<float>> prompt_logits;
  std::vector<comm::CollectiveCounts> step_counts;  // one per step (group runs only)
  std::vector<uint64_t> expert_tokens;
  int64_t tokens_run = 0;  // tokens through the model (each once per layer)
};

// Prefill of three prompts (one step) then kDecodeSteps decode steps, on `group` (null: alone).
void RunModel(bool forced, TpShard shard, comm::CountingProcessGroup* group, RunResult* out) {
  const ModelConfig config = engine_test::TinyMoeConfig(forced);
  auto local = LocalModelConfig(config, shard);
  ASSERT_TRUE(local.ok()) << local.status();
  auto weights = RandomModelWeights(config, 11, shard);
  ASSERT_TRUE(weights.ok()) << weights.status();
  if (forced) {  // every expert's logit 0: ties go to the lowest id, expert 0
    for (LayerWeights& layer : weights->layers)
      std::fill(layer.router.begin(), layer.router.end(), 0.0f);
  }
  const ExecutorFactory factory = CpuExecutorFactory(1, group, 1, 0);
  ExecutorSpec spec;
  spec.model_config = *local;
  spec.num_blocks = 3 * kBlocksPerSeq;
  spec.block_size = kBlockSize;
  auto executor = factory.create(spec, *std::move(weights));
  ASSERT_TRUE(executor.ok()) << executor.status();

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(3, static_cast<int32_t>(config.vocab_size) - 1);
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t len : {5, 9, 17}) {
    seqs.emplace_back(len);
    for (int32_t& t : seqs.back()) t = token(rng);
  }
  std::vector<std::vector<BlockId>> tables(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int64_t b = 0; b < kBlocksPerSeq; ++b) tables[i].push_back(i * kBlocksPerSeq + b);
  }
  out->tokens.assign(seqs.size(), {});
  std::vector<int64_t> computed(seqs.size(), 0);
  for (int step = 0; step <= kDecodeSteps; ++step) {
    SchedulerOutput batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      ScheduledSeq seq;
      seq.request_id = static_cast<int64_t>(i);
      seq.new_tokens = absl::MakeConstSpan(seqs[i]).subspan(computed[i]);
      seq.num_computed_tokens = computed[i];
      seq.block_table = tables[i];
      seq.samples = true;
      seq.capture_prompt_logits = step == 0;
      seq.sample_step = step;
      out->tokens_run += static_cast<int64_t>(seq.new_tokens.size());
      batch.seqs.push_back(seq);
    }
    const comm::CollectiveCounts before =
        group != nullptr ? group->counts() : comm::CollectiveCounts{};
    auto result = (*executor)->Run(batch);
    ASSERT_TRUE(result.ok()) << result.status();
    if (group != nullptr) out->step_counts.push_back(comm::CountsBetween(before, group->counts()));
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (step == 0) out->prompt_logits.push_back(result->last_prompt_logits[i]);
      computed[i] = static_cast<int64_t>(seqs[i].size());
      seqs[i].push_back(result->sampled_tokens[i]);
      out->tokens[i].push_back(result->sampled_tokens[i]);
    }
  }
  out->expert_tokens = (*executor)->stats().moe_expert_tokens;
}

// `ranks` threads, each a rank of an expert-parallel group over Gloo.
std::vector<RunResult> RunGroup(int ranks, bool forced) {
  std::vector<RunResult> results(ranks);
  comm::RunThreadRanks(ranks, [&](int r, comm::CountingProcessGroup& group) {
    TpShard shard{r, ranks, 1};
    shard.expert_parallel = true;
    RunModel(forced, shard, &group, &results[r]);
  });
  return results;
}

void ExpectSameAsOneRank(int ranks, bool forced) {
  RunResult alone;
  RunModel(forced, TpShard{}, nullptr, &alone);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::vector<RunResult> group = RunGroup(ranks, forced);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const ModelConfig config = engine_test::TinyMoeConfig(forced);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) moe_layers += config.IsMoeLayer(l);
  for (int r = 0; r < ranks; ++r) {
    const RunResult& got = group[r];
    EXPECT_EQ(got.tokens, alone.tokens) << "rank " << r;
    ASSERT_EQ(got.prompt_logits.size(), alone.prompt_logits.size());
    for (size_t i = 0; i < alone.prompt_logits.size(); ++i) {
      const std::vector<float>& want = alone.prompt_logits[i];
      ASSERT_EQ(got.prompt_logits[i].size(), want.size());
      float scale = 0.0f, worst = 0.0f;
      for (size_t v = 0; v < want.size(); ++v) {
        scale = std::max(scale, std::abs(want[v]));
        worst = std::max(worst, std::abs(got.prompt_logits[i][v] - want[v]));
      }
      EXPECT_LE(worst, 1e-4f * scale) << "rank " << r << " prompt " << i;
    }
    // Every rank routes the replicated tokens alike, so each counts the group's routing.
    EXPECT_EQ(got.expert_tokens, alone.expert_tokens) << "rank " << r;
    for (const comm::CollectiveCounts& c : got.step_counts) {
      EXPECT_EQ(c.all_reduce, 2 * config.num_hidden_layers + 1) << "rank " << r;
      EXPECT_EQ(c.all_gather, 1) << "rank " << r;
      EXPECT_EQ(c.all_to_all, 0) << "rank " << r;
      EXPECT_EQ(c.reduce_scatter + c.broadcast + c.barrier + c.send + c.recv, 0) << "rank " << r;
    }
    EXPECT_EQ(got.step_counts.size(), static_cast<size_t>(kDecodeSteps + 1));
  }
  ASSERT_EQ(alone.expert_tokens.size(), static_cast<size_t>(config.num_experts));
  uint64_t routed = 0;
  for (uint64_t n : alone.expert_tokens) routed += n;
  EXPECT_EQ(routed,
            static_cast<uint64_t>(alone.tokens_run * moe_layers * config.num_experts_per_tok));
  if (forced) {
    EXPECT_EQ(alone.expert_tokens[0], static_cast<uint64_t>(alone.tokens_run * moe_layers));
  }
}

TEST(MoeEpTest, TwoRanksEqualOneRank) { ExpectSameAsOneRank(2, false); }

TEST(MoeEpTest, FourRanksEqualOneRank) { ExpectSameAsOneRank(4, false); }

// Expert 0 takes every token; ranks 1-3 hold experts no token goes to (a zero part each).
TEST(MoeEpTest, OneExpertTakesEveryTokenAndOtherRanksGetNone) { ExpectSameAsOneRank(4, true); }

TEST(MoeEpTest, RefusalsNameTheNumbers) {
  ModelConfig moe = engine_test::TinyMoeConfig(false);
  TpShard three{0, 3, 1};
  three.expert_parallel = true;
  moe.num_attention_heads = 6;  // so that only the experts do not split
  moe.num_key_value_heads = 3;
  moe.intermediate_size = 96;
  moe.moe_intermediate_size = 30;
  auto dims = ComputeTpDims(moe, three);
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("the group's 3 ranks do not divide the model's 8 experts"),
            std::string::npos)
      << dims.status();
  ModelConfig dense = PresetConfig("tiny").value();
  TpShard two{0, 2, 1};
  two.expert_parallel = true;
  dims = ComputeTpDims(dense, two);
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("needs a mixture-of-experts model"), std::string::npos)
      << dims.status();
  // An explicit placement must fit the model and the group.
  auto placement = ExpertPlacement::FromTable({0, 1, 1, 0}, 2);
  ASSERT_TRUE(placement.ok()) << placement.status();
  two.expert_placement = std::make_shared<const ExpertPlacement>(*placement);
  dims = ComputeTpDims(engine_test::TinyMoeConfig(false), two);
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("placement of 4 experts over 2 ranks for a model of 8"),
            std::string::npos)
      << dims.status();
  EXPECT_FALSE(ExpertPlacement::FromTable({0, 2}, 2).ok());
  EXPECT_FALSE(ExpertPlacement::Contiguous(6, 4).ok());
}

// A placement that is not contiguous: rank 1 holds the even experts. The rank's weights hold
// exactly its experts, whole (the others are not loaded), and its config says which.
TEST(MoeEpTest, AnyPlacementLoadsTheRanksExpertsWhole) {
  const ModelConfig config = engine_test::TinyMoeConfig(false);
  std::vector<int32_t> table(config.num_experts);
  for (int64_t e = 0; e < config.num_experts; ++e) table[e] = e % 2 == 0 ? 1 : 0;
  auto placement = ExpertPlacement::FromTable(table, 2);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->Describe(), "8 experts over 2 ranks: rank 0 [1,3,5,7], rank 1 [0,2,4,6]");
  const ModelWeights full = RandomModelWeights(config, 3);
  TpShard shard{1, 2, 1};
  shard.expert_parallel = true;
  shard.expert_placement = std::make_shared<const ExpertPlacement>(*placement);
  auto local = LocalModelConfig(config, shard);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->NumHeldExperts(), 4);
  EXPECT_EQ(local->moe_intermediate_size, config.moe_intermediate_size);
  auto mine = RandomModelWeights(config, 3, shard);
  ASSERT_TRUE(mine.ok()) << mine.status();
  const int64_t per_expert_gate_up = 2 * config.moe_intermediate_size * config.hidden_size;
  for (size_t l = 0; l < full.layers.size(); ++l) {
    const LayerWeights& a = full.layers[l];
    const LayerWeights& b = mine->layers[l];
    ASSERT_EQ(static_cast<int64_t>(b.experts_gate_up.size()), 4 * per_expert_gate_up);
    EXPECT_EQ(b.router, a.router);
    for (int64_t s = 0; s < 4; ++s) {
      const int64_t e = 2 * s;  // rank 1's s-th expert
      EXPECT_TRUE(std::equal(b.experts_gate_up.begin() + s * per_expert_gate_up,
                             b.experts_gate_up.begin() + (s + 1) * per_expert_gate_up,
                             a.experts_gate_up.begin() + e * per_expert_gate_up))
          << "layer " << l << " expert " << e;
    }
  }
}

}  // namespace
}  // namespace tandem::runtime
