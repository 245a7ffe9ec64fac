// Data-parallel attention's request placement (dp_rank.h) and the scheduler under it: requests
// spread over the DP ranks as they arrive and keep their rank, each sequence of a step names it,
// its blocks come from that rank's pool, and a request that cannot grow preempts the newest
// request of ITS rank (another rank's blocks would not help it).
#include "runtime/engine/dp_rank.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/scheduler.h"

namespace tandem::runtime {
namespace {

TEST(DpRankTest, FewestRequestsThenMostFreeBlocksThenRoundRobin) {
  EXPECT_EQ(PickDpRank({}), 0);
  EXPECT_EQ(PickDpRank({{2, 10}, {1, 0}, {1, 5}}), 2);
  EXPECT_EQ(PickDpRank({{2, 10}, {1, 0}, {1, 5}}, 2), 2);
  EXPECT_EQ(PickDpRank({{3, 5}, {0, 0}}, 1), 1);
  // Ties go round robin from the rank after the previous pick.
  EXPECT_EQ(PickDpRank({{1, 5}, {1, 5}}), 0);
  EXPECT_EQ(PickDpRank({{1, 5}, {1, 5}}, 0), 1);
  EXPECT_EQ(PickDpRank({{1, 5}, {1, 5}}, 1), 0);
  EXPECT_EQ(PickDpRank({{0, 5}, {1, 5}, {0, 5}}, 0), 2);
}

// Requests that arrive one at a time on an idle group (each finished before the next) alternate.
TEST(DpRankTest, SequentialRequestsAlternate) {
  auto cache = KvCacheManager::Create({.num_blocks = 8, .block_size = 4, .dp_size = 2});
  ASSERT_TRUE(cache.ok()) << cache.status();
  Scheduler s(SchedulerConfig{}, std::move(*cache), {});
  std::vector<int64_t> ranks;
  for (int64_t id = 0; id < 4; ++id) {
    RequestSpec spec;
    spec.prompt = {5, 6, 7};
    spec.max_tokens = 1;
    ASSERT_TRUE(s.Add(id, spec).ok());
    SchedulerOutput o = s.Schedule();
    ASSERT_EQ(o.seqs.size(), 1u);
    ranks.push_back(o.seqs[0].dp_rank);
    std::vector<int32_t> sampled = {9};
    s.Update(o, sampled, nullptr);
    EXPECT_FALSE(s.HasUnfinished());
  }
  EXPECT_EQ(ranks, (std::vector<int64_t>{0, 1, 0, 1}));
}

RequestSpec Spec(int64_t prompt_len, int64_t max_tokens) {
  RequestSpec spec;
  for (int64_t i = 0; i < prompt_len; ++i) spec.prompt.push_back(10 + static_cast<int32_t>(i));
  spec.max_tokens = max_tokens;
  return spec;
}

TEST(DpRankTest, SchedulerKeepsRanksAndPreemptsWithinOne) {
  // Two DP ranks of 4 blocks of 4 tokens each.
  auto cache = KvCacheManager::Create({.num_blocks = 8, .block_size = 4, .dp_size = 2});
  ASSERT_TRUE(cache.ok()) << cache.status();
  SchedulerConfig config;
  config.max_num_batched_tokens = 64;
  Scheduler s(config, std::move(*cache), {});
  // Arrival order A, B, C, D: ranks 0, 1, 0, 1. A and C fill rank 0 (2 blocks each).
  ASSERT_TRUE(s.Add(1, Spec(8, 4)).ok());  // A
  ASSERT_TRUE(s.Add(2, Spec(4, 4)).ok());  // B
  ASSERT_TRUE(s.Add(3, Spec(8, 4)).ok());  // C
  ASSERT_TRUE(s.Add(4, Spec(4, 4)).ok());  // D
  SchedulerOutput o1 = s.Schedule();
  ASSERT_EQ(o1.seqs.size(), 4u);
  const std::vector<int64_t> want_rank = {0, 1, 0, 1};
  for (size_t i = 0; i < o1.seqs.size(); ++i) {
    EXPECT_EQ(o1.seqs[i].dp_rank, want_rank[i]) << "request " << o1.seqs[i].request_id;
    for (BlockId id : o1.seqs[i].block_table) EXPECT_EQ(id % 2, want_rank[i]) << id;
  }
  EXPECT_EQ(s.kv_cache().NumFreeBlocksOnDpRank(0), 0);
  EXPECT_EQ(s.kv_cache().NumFreeBlocksOnDpRank(1), 2);
  std::vector<int32_t> sampled(o1.seqs.size(), 77);
  s.Update(o1, sampled, nullptr);
  // A's ninth token needs a third block: C (rank 0's newest) goes, not D (the newest overall).
  SchedulerOutput o2 = s.Schedule();
  EXPECT_EQ(o2.num_preempted, 1);
  std::vector<int64_t> ids;
  for (const ScheduledSeq& seq : o2.seqs) ids.push_back(seq.request_id);
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_TRUE(s.kv_cache().CheckInvariants().ok()) << s.kv_cache().CheckInvariants();
  // C keeps rank 0 when it is admitted again.
  sampled.assign(o2.seqs.size(), 78);
  s.Update(o2, sampled, nullptr);
  bool c_again = false;
  for (int step = 0; step < 8 && !c_again; ++step) {
    SchedulerOutput o = s.Schedule();
    for (const ScheduledSeq& seq : o.seqs) {
      if (seq.request_id == 3) {
        c_again = true;
        EXPECT_EQ(seq.dp_rank, 0);
      }
    }
    sampled.assign(o.seqs.size(), 79);
    s.Update(o, sampled, nullptr);
  }
  EXPECT_TRUE(c_again);
}

std::vector<int64_t> Ids(const SchedulerOutput& o) {
  std::vector<int64_t> ids;
  for (const ScheduledSeq& seq : o.seqs) ids.push_back(seq.request_id);
  return ids;
}

// The token budget and max_num_seqs hold per DP rank (SGLang's DP attention): with a budget of
// 8 tokens and 1 sequence, both ranks prefill an 8-token prompt in the same step.
TEST(DpRankTest, TokenBudgetAndMaxNumSeqsPerRank) {
  auto cache = KvCacheManager::Create({.num_blocks = 16, .block_size = 4, .dp_size = 2});
  ASSERT_TRUE(cache.ok()) << cache.status();
  SchedulerConfig config;
  config.max_num_batched_tokens = 8;
  config.max_num_seqs = 1;
  Scheduler s(config, std::move(*cache), {});
  for (int64_t id = 1; id <= 4; ++id) ASSERT_TRUE(s.Add(id, Spec(8, 2)).ok());  // ranks 0 1 0 1
  SchedulerOutput o = s.Schedule();
  EXPECT_EQ(Ids(o), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(o.num_batched_tokens, 16);
  for (const ScheduledSeq& seq : o.seqs) EXPECT_EQ(seq.new_tokens.size(), 8u);
  EXPECT_EQ(s.num_waiting(), 2);
}

// A waiting request whose rank's pool is full waits without blocking admission on the other
// rank: D (rank 1) is admitted behind C (rank 0, no room).
TEST(DpRankTest, FullRankDoesNotBlockOtherRanks) {
  auto cache = KvCacheManager::Create({.num_blocks = 8, .block_size = 4, .dp_size = 2});
  ASSERT_TRUE(cache.ok()) << cache.status();
  SchedulerConfig config;
  config.max_num_batched_tokens = 64;
  Scheduler s(config, std::move(*cache), {});
  ASSERT_TRUE(s.Add(1, Spec(15, 1)).ok());  // A: rank 0, its whole pool (4 blocks)
  ASSERT_TRUE(s.Add(2, Spec(4, 1)).ok());   // B: rank 1
  ASSERT_TRUE(s.Add(3, Spec(8, 1)).ok());   // C: rank 0, no room while A runs
  ASSERT_TRUE(s.Add(4, Spec(4, 1)).ok());   // D: rank 1
  SchedulerOutput o = s.Schedule();
  EXPECT_EQ(Ids(o), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(s.kv_cache().NumFreeBlocksOnDpRank(0), 0);
  EXPECT_EQ(s.num_waiting(), 1);
  // Once A finishes, C runs on rank 0.
  std::vector<int32_t> sampled(o.seqs.size(), 9);
  s.Update(o, sampled, nullptr);
  SchedulerOutput next = s.Schedule();
  EXPECT_EQ(Ids(next), (std::vector<int64_t>{3}));
  EXPECT_EQ(next.seqs[0].dp_rank, 0);
  EXPECT_TRUE(s.kv_cache().CheckInvariants().ok()) << s.kv_cache().CheckInvariants();
}

}  // namespace
}  // namespace tandem::runtime
