#include "runtime/engine/scheduler.h"

#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

constexpr int32_t kEos = 2;

std::unique_ptr<Scheduler> MakeScheduler(int64_t num_blocks, int64_t block_size, int64_t budget,
                                         int64_t max_seqs = 64, int64_t max_len = 1024) {
  KvCacheConfig kv;
  kv.num_blocks = num_blocks;
  kv.block_size = block_size;
  auto cache = KvCacheManager::Create(kv);
  EXPECT_TRUE(cache.ok()) << cache.status();
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = budget;
  cfg.max_num_seqs = max_seqs;
  cfg.max_model_len = max_len;
  return std::make_unique<Scheduler>(cfg, std::move(*cache), std::vector<int32_t>{kEos});
}

RequestSpec Spec(int64_t prompt_len, int64_t max_tokens, int32_t first = 10) {
  RequestSpec spec;
  for (int64_t i = 0; i < prompt_len; ++i) spec.prompt.push_back(first + static_cast<int32_t>(i));
  spec.max_tokens = max_tokens;
  return spec;
}

// Feeds `token` to every sampling seq of the step.
std::vector<RequestUpdate> Feed(Scheduler& s, const SchedulerOutput& out, int32_t token) {
  std::vector<int32_t> sampled(out.seqs.size(), token);
  return s.Update(out, sampled, nullptr);
}

TEST(SchedulerTest, ChunkedPrefillUnderTokenBudgetDecodeFirst) {
  auto s = MakeScheduler(64, 4, /*budget=*/16);
  ASSERT_TRUE(s->Add(1, Spec(10, 5)).ok());
  ASSERT_TRUE(s->Add(2, Spec(20, 5)).ok());
  ASSERT_TRUE(s->Add(3, Spec(5, 5)).ok());

  SchedulerOutput o1 = s->Schedule();
  ASSERT_EQ(o1.seqs.size(), 2u);
  EXPECT_EQ(o1.seqs[0].request_id, 1);
  EXPECT_EQ(o1.seqs[0].new_tokens.size(), 10u);
  EXPECT_TRUE(o1.seqs[0].samples);
  EXPECT_EQ(o1.seqs[1].request_id, 2);
  EXPECT_EQ(o1.seqs[1].new_tokens.size(), 6u);  // chunk: the budget ran out
  EXPECT_FALSE(o1.seqs[1].samples);
  EXPECT_EQ(o1.num_batched_tokens, 16);
  auto u1 = Feed(*s, o1, 77);
  ASSERT_EQ(u1.size(), 1u);  // only request 1 produced a token
  EXPECT_EQ(u1[0].new_token_ids, std::vector<int32_t>{77});

  SchedulerOutput o2 = s->Schedule();
  ASSERT_EQ(o2.seqs.size(), 3u);
  EXPECT_EQ(o2.seqs[0].request_id, 1);  // decode first
  EXPECT_EQ(o2.seqs[0].new_tokens.size(), 1u);
  EXPECT_EQ(o2.seqs[0].num_computed_tokens, 10);
  EXPECT_EQ(o2.seqs[1].request_id, 2);
  EXPECT_EQ(o2.seqs[1].new_tokens.size(), 14u);
  EXPECT_EQ(o2.seqs[1].num_computed_tokens, 6);
  EXPECT_TRUE(o2.seqs[1].samples);
  EXPECT_EQ(o2.seqs[2].request_id, 3);
  EXPECT_EQ(o2.seqs[2].new_tokens.size(), 1u);  // 16 - 1 - 14
  Feed(*s, o2, 78);
  // Block tables cover every scheduled token.
  for (const ScheduledSeq& seq : o2.seqs) {
    EXPECT_GE(static_cast<int64_t>(seq.block_table.size()) * 4,
              seq.num_computed_tokens + static_cast<int64_t>(seq.new_tokens.size()));
  }
}

TEST(SchedulerTest, StopsOnMaxTokensEosAndStopTokens) {
  auto s = MakeScheduler(64, 4, 64);
  RequestSpec a = Spec(3, 3);
  RequestSpec b = Spec(3, 10);
  RequestSpec c = Spec(3, 10);
  c.stop_token_ids = {55};
  RequestSpec d = Spec(3, 4);
  d.ignore_eos = true;
  ASSERT_TRUE(s->Add(1, a).ok());
  ASSERT_TRUE(s->Add(2, b).ok());
  ASSERT_TRUE(s->Add(3, c).ok());
  ASSERT_TRUE(s->Add(4, d).ok());
  std::vector<FinishReason> reason(5, FinishReason::kNone);
  std::vector<int> produced(5, 0);
  // Tokens fed per step: 9, kEos, 55, 9, 9, ...
  const std::vector<int32_t> script = {9, kEos, 55, 9, 9, 9, 9, 9};
  for (int step = 0; s->HasUnfinished() && step < 8; ++step) {
    SchedulerOutput o = s->Schedule();
    std::vector<int32_t> sampled(o.seqs.size(), script[step]);
    for (const RequestUpdate& u : s->Update(o, sampled, nullptr)) {
      produced[u.request_id] += static_cast<int>(u.new_token_ids.size());
      if (u.finish_reason != FinishReason::kNone) reason[u.request_id] = u.finish_reason;
    }
  }
  EXPECT_FALSE(s->HasUnfinished());
  EXPECT_EQ(reason[2], FinishReason::kEos);
  EXPECT_EQ(produced[2], 2);
  EXPECT_EQ(reason[1], FinishReason::kEos);  // also saw eos at step 2
  EXPECT_EQ(reason[3], FinishReason::kEos);
  EXPECT_EQ(reason[4], FinishReason::kLength);  // ignore_eos: ran to max_tokens
  EXPECT_EQ(produced[4], 4);
  EXPECT_EQ(s->kv_cache().NumFreeBlocks(), 64);
}

TEST(SchedulerTest, StopTokenAndLength) {
  auto s = MakeScheduler(64, 4, 64);
  RequestSpec c = Spec(3, 10);
  c.stop_token_ids = {55};
  ASSERT_TRUE(s->Add(1, c).ok());
  ASSERT_TRUE(s->Add(2, Spec(3, 2)).ok());
  SchedulerOutput o = s->Schedule();
  auto u = Feed(*s, o, 9);
  EXPECT_EQ(u.size(), 2u);
  o = s->Schedule();
  u = Feed(*s, o, 55);
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(u[1].finish_reason, FinishReason::kLength);
  EXPECT_EQ(u[1].num_output_tokens, 2);
  EXPECT_FALSE(s->HasUnfinished());
}

TEST(SchedulerTest, PreemptsNewestWhenBlocksRunOutAndRecomputes) {
  // 6 blocks of 4 tokens; two requests of 8-token prompts each need 2 blocks, then grow.
  auto s = MakeScheduler(6, 4, 64);
  RequestSpec a = Spec(8, 12, 100);
  RequestSpec b = Spec(8, 12, 200);
  a.ignore_eos = b.ignore_eos = true;
  ASSERT_TRUE(s->Add(1, a).ok());
  ASSERT_TRUE(s->Add(2, b).ok());
  int64_t preemptions = 0;
  std::vector<int> produced(3, 0);
  for (int step = 0; s->HasUnfinished() && step < 200; ++step) {
    SchedulerOutput o = s->Schedule();
    preemptions += o.num_preempted;
    for (const ScheduledSeq& seq : o.seqs) {
      // Recomputed requests restart from position 0 with their generated tokens included.
      EXPECT_GE(static_cast<int64_t>(seq.block_table.size()) * 4,
                seq.num_computed_tokens + static_cast<int64_t>(seq.new_tokens.size()));
    }
    for (const RequestUpdate& u : Feed(*s, o, 7)) {
      produced[u.request_id] += static_cast<int>(u.new_token_ids.size());
    }
  }
  EXPECT_FALSE(s->HasUnfinished());
  EXPECT_GT(preemptions, 0) << "the pool (24 tokens) cannot hold both 20-token requests";
  EXPECT_EQ(produced[1], 12);
  EXPECT_EQ(produced[2], 12);
  EXPECT_EQ(s->kv_cache().NumFreeBlocks(), 6);
}

TEST(SchedulerTest, AbortFreesBlocksAndMaxNumSeqsLimitsAdmission) {
  auto s = MakeScheduler(32, 4, 256, /*max_seqs=*/2);
  for (int64_t id = 1; id <= 3; ++id) ASSERT_TRUE(s->Add(id, Spec(9, 50)).ok());
  SchedulerOutput o = s->Schedule();
  EXPECT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(s->num_running(), 2);
  EXPECT_EQ(s->num_waiting(), 1);
  Feed(*s, o, 5);
  EXPECT_LT(s->kv_cache().NumFreeBlocks(), 32);
  EXPECT_TRUE(s->Abort(1));
  EXPECT_FALSE(s->Abort(1));
  EXPECT_TRUE(s->Abort(2));
  EXPECT_TRUE(s->Abort(3));
  EXPECT_EQ(s->kv_cache().NumFreeBlocks(), 32);
  EXPECT_FALSE(s->HasUnfinished());
  EXPECT_EQ(s->Add(4, Spec(3, 3)).code(), absl::StatusCode::kOk);
  EXPECT_EQ(s->Add(4, Spec(3, 3)).code(), absl::StatusCode::kAlreadyExists);
}

TEST(SchedulerTest, PrefixCacheHitSkipsComputedBlocks) {
  auto s = MakeScheduler(64, 4, 256);
  ASSERT_TRUE(s->Add(1, Spec(13, 1)).ok());
  SchedulerOutput o = s->Schedule();
  Feed(*s, o, 5);  // finishes (max_tokens 1); its 3 full blocks stay cached
  EXPECT_FALSE(s->HasUnfinished());
  RequestSpec again = Spec(13, 1);
  ASSERT_TRUE(s->Add(2, again).ok());
  o = s->Schedule();
  ASSERT_EQ(o.seqs.size(), 1u);
  EXPECT_EQ(o.seqs[0].num_computed_tokens, 12);
  EXPECT_EQ(o.seqs[0].new_tokens.size(), 1u);
  auto u = Feed(*s, o, 5);
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].num_cached_prompt_tokens, 12);
  EXPECT_GT(s->kv_cache().Stats().prefix_hit_tokens, 0);
  // A different salt shares nothing.
  RequestSpec salted = Spec(13, 1);
  salted.cache_salt = "tenant-b";
  ASSERT_TRUE(s->Add(3, salted).ok());
  o = s->Schedule();
  EXPECT_EQ(o.seqs[0].num_computed_tokens, 0);
  Feed(*s, o, 5);
}

TEST(SchedulerTest, RandomWorkloadDrainsAndReturnsEveryBlock) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  auto s = MakeScheduler(40, 4, 32, /*max_seqs=*/8, /*max_len=*/128);
  int64_t next_id = 1;
  int64_t finished = 0, added = 0;
  for (int step = 0; step < 3000 && (added < 60 || s->HasUnfinished()); ++step) {
    if (added < 60 && rng() % 3 == 0) {
      RequestSpec spec = Spec(1 + rng() % 40, 1 + rng() % 30, static_cast<int32_t>(rng() % 50));
      spec.ignore_eos = rng() % 2;
      ASSERT_TRUE(s->Add(next_id++, spec).ok());
      ++added;
    }
    if (rng() % 50 == 0 && next_id > 1) s->Abort(1 + rng() % (next_id - 1));
    SchedulerOutput o = s->Schedule();
    std::vector<int32_t> sampled(o.seqs.size());
    for (auto& t : sampled) t = static_cast<int32_t>(rng() % 64);
    for (const RequestUpdate& u : s->Update(o, sampled, nullptr)) {
      if (u.finish_reason != FinishReason::kNone) ++finished;
    }
    ASSERT_TRUE(s->kv_cache().CheckInvariants().ok()) << "seed=" << seed;
  }
  EXPECT_FALSE(s->HasUnfinished()) << "seed=" << seed;
  EXPECT_GT(finished, 0);
  EXPECT_EQ(s->kv_cache().NumFreeBlocks(), 40) << "seed=" << seed;
}

}  // namespace
}  // namespace tandem::runtime
