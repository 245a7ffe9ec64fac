// Routing choices observed end to end: which fake worker got the call, after the router learned
// load, free blocks and cached prefixes from real heartbeats.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "router/testing/fake_worker.h"
#include "router/testing/router_test_util.h"

namespace tandem::router {
namespace {

using v1::WORKER_ROLE_DECODE;
using v1::WORKER_ROLE_MIXED;
using v1::WORKER_ROLE_PREFILL;

class RouterRoutingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = FreshSeed();
    rng_.seed(seed_);
  }
  void Run(const v1::GenerateRequest& req) {
    StreamResult r = h_.Generate(req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    last_ = r;
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  RouterHarness h_;
  StreamResult last_;
};

TEST_F(RouterRoutingTest, PrefillPrefersTheLongestCachedPrefixOverLoad) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  FakeWorker* p0 = h_.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* p1 = h_.AddWorker("p1", WORKER_ROLE_PREFILL);
  FakeWorker* p2 = h_.AddWorker("p2", WORKER_ROLE_PREFILL);
  h_.AddWorker("d0", WORKER_ROLE_DECODE);
  const std::vector<uint32_t> prompt = RandomPrompt(rng_, 16 * 5 + 3, 1000);
  const std::vector<uint64_t> chain = PromptChain(prompt, 16);
  ASSERT_EQ(chain.size(), 5u);
  // p1 holds 2 blocks of the prefix, p2 holds 4; p2 is the busiest.
  p1->AddCachedBlocks(absl::MakeConstSpan(chain).subspan(0, 2));
  p2->AddCachedBlocks(absl::MakeConstSpan(chain).subspan(0, 4));
  p0->SetLoad(Load(0, 0, 4096));
  p1->SetLoad(Load(3, 0, 4096));
  p2->SetLoad(Load(5, 9, 4096));
  h_.SyncHeartbeats();
  Run(MakeRequest(prompt, 3));
  EXPECT_EQ(p2->counters().prefill, 1);
  EXPECT_EQ(last_.usage.cached_prompt_tokens(), 64u);
  // A different prompt with no cached prefix goes by load.
  Run(MakeRequest(RandomPrompt(rng_, 40, 1000), 3));
  EXPECT_EQ(p0->counters().prefill, 1);
  EXPECT_EQ(p1->counters().prefill, 0);
}

TEST_F(RouterRoutingTest, CacheSaltIsolatesPrefixes) {
  FakeWorker* p0 = h_.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* p1 = h_.AddWorker("p1", WORKER_ROLE_PREFILL);
  h_.AddWorker("d0", WORKER_ROLE_DECODE);
  const std::vector<uint32_t> prompt = RandomPrompt(rng_, 64, 1000);
  p1->AddCachedBlocks(PromptChain(prompt, 16, "tenant-a"));
  p1->SetLoad(Load(4, 0, 4096));
  h_.SyncHeartbeats();
  v1::GenerateRequest other = MakeRequest(prompt, 2);
  other.set_cache_salt("tenant-b");
  Run(other);
  EXPECT_EQ(p0->counters().prefill, 1);
  v1::GenerateRequest same = other;
  same.set_cache_salt("tenant-a");
  Run(same);
  EXPECT_EQ(p1->counters().prefill, 1);
}

TEST_F(RouterRoutingTest, TheRouterRemembersWhereItSentAPrefix) {
  // Right after a prefill on p1 its index holds the prompt, before any heartbeat confirms it;
  // the workers' own heartbeats (the fake reports what it prefilled) keep it there.
  FakeWorker* p0 = h_.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* p1 = h_.AddWorker("p1", WORKER_ROLE_PREFILL);
  h_.AddWorker("d0", WORKER_ROLE_DECODE);
  p0->SetLoad(Load(1, 0, 4096));
  h_.SyncHeartbeats();
  const std::vector<uint32_t> prompt = RandomPrompt(rng_, 50, 1000);
  Run(MakeRequest(prompt, 2));
  EXPECT_EQ(p1->counters().prefill, 1);
  p0->SetLoad(Load(0, 0, 4096));
  p1->SetLoad(Load(7, 0, 4096));
  h_.SyncHeartbeats();
  std::vector<uint32_t> longer = prompt;
  longer.push_back(1);
  Run(MakeRequest(longer, 2));
  EXPECT_EQ(p1->counters().prefill, 2);
  EXPECT_EQ(last_.usage.cached_prompt_tokens(), 48u);
}

TEST_F(RouterRoutingTest, DecodeByFreeBlocksThenLoad) {
  h_.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* d0 = h_.AddWorker("d0", WORKER_ROLE_DECODE);
  FakeWorker* d1 = h_.AddWorker("d1", WORKER_ROLE_DECODE);
  FakeWorker* d2 = h_.AddWorker("d2", WORKER_ROLE_DECODE);
  d0->SetLoad(Load(0, 0, 100));
  d1->SetLoad(Load(9, 9, 900));
  d2->SetLoad(Load(0, 0, 500));
  h_.SyncHeartbeats();
  Run(MakeRequest({1, 2, 3}, 4));
  EXPECT_EQ(d1->counters().decode, 1);
  // Equal free blocks: the less loaded one.
  d1->SetLoad(Load(9, 9, 500));
  h_.SyncHeartbeats();
  Run(MakeRequest({1, 2, 3}, 4));
  EXPECT_EQ(d2->counters().decode, 1);
  EXPECT_EQ(d0->counters().decode, 0);
}

TEST_F(RouterRoutingTest, OnlyCompatibleWorkersArePaired) {
  // p0 serves model A; the decode workers of model B or another KV layout cannot take its KV.
  FakeWorker* p0 =
      h_.AddWorker("p0", WORKER_ROLE_PREFILL, [](FakeWorkerOptions& o) { o.model_id = "A"; });
  FakeWorker* db =
      h_.AddWorker("d-model-b", WORKER_ROLE_DECODE, [](FakeWorkerOptions& o) { o.model_id = "B"; });
  FakeWorker* dl = h_.AddWorker("d-layout", WORKER_ROLE_DECODE, [](FakeWorkerOptions& o) {
    o.model_id = "A";
    o.kv_layout_hash = 99;
  });
  FakeWorker* m = h_.AddWorker("m0", WORKER_ROLE_MIXED);
  db->SetLoad(Load(0, 0, 4000));
  dl->SetLoad(Load(0, 0, 4000));
  h_.SyncHeartbeats();
  // No compatible pair: the mixed worker serves.
  Run(MakeRequest({4, 5}, 3));
  EXPECT_EQ(m->counters().generate, 1);
  EXPECT_EQ(p0->total_calls() + db->total_calls() + dl->total_calls(), 0);
  // A compatible decode worker with the fewest free blocks still wins: it is the only match.
  FakeWorker* da = h_.AddWorker("d-a", WORKER_ROLE_DECODE, [](FakeWorkerOptions& o) {
    o.model_id = "A";
    o.kv_blocks_total = 10;
  });
  Run(MakeRequest({4, 5}, 3));
  EXPECT_EQ(p0->counters().prefill, 1);
  EXPECT_EQ(da->counters().decode, 1);
  EXPECT_EQ(db->total_calls() + dl->total_calls(), 0);
}

TEST_F(RouterRoutingTest, DrainingWorkersAreSkipped) {
  FakeWorker* p0 = h_.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* p1 = h_.AddWorker("p1", WORKER_ROLE_PREFILL);
  h_.AddWorker("d0", WORKER_ROLE_DECODE);
  p0->SetStatus(v1::SERVING_STATUS_DRAINING);
  h_.SyncHeartbeats();
  Run(MakeRequest({1}, 2));
  EXPECT_EQ(p1->counters().prefill, 1);
  EXPECT_EQ(p0->counters().prefill, 0);
  p0->SetStatus(v1::SERVING_STATUS_SERVING);
  p1->SetStatus(v1::SERVING_STATUS_NOT_SERVING);
  h_.SyncHeartbeats();
  Run(MakeRequest({1}, 2));
  EXPECT_EQ(p0->counters().prefill, 1);
}

TEST_F(RouterRoutingTest, MixedWorkersByPrefixThenLoad) {
  FakeWorker* m0 = h_.AddWorker("m0", WORKER_ROLE_MIXED);
  FakeWorker* m1 = h_.AddWorker("m1", WORKER_ROLE_MIXED);
  const std::vector<uint32_t> prompt = RandomPrompt(rng_, 33, 1000);
  m1->AddCachedBlocks(PromptChain(prompt, 16));
  m1->SetLoad(Load(2, 0, 4096));
  h_.SyncHeartbeats();
  Run(MakeRequest(prompt, 2));
  EXPECT_EQ(m1->counters().generate, 1);
  m0->SetLoad(Load(5, 0, 4096));
  h_.SyncHeartbeats();
  Run(MakeRequest(RandomPrompt(rng_, 33, 1000), 2));
  EXPECT_EQ(m1->counters().generate, 2);
  EXPECT_EQ(m0->counters().generate, 0);
}

}  // namespace
}  // namespace tandem::router
