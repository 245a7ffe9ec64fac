#include "router/worker_registry.h"

#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/block_hash.h"
#include "gtest/gtest.h"
#include "router/fake_worker_client.h"
#include "router/manual_clock.h"

namespace tandem::router {
namespace {

// A clock the test moves by hand.
v1::WorkerInfo Info(const std::string& id, v1::WorkerRole role, uint64_t epoch = 1,
                    uint32_t block_size = 4) {
  v1::WorkerInfo info;
  info.set_worker_id(id);
  info.set_address("127.0.0.1:1");  // never dialled: channels connect lazily
  info.set_role(role);
  info.set_epoch(epoch);
  info.set_model_id("m");
  info.set_vocab_size(1000);
  info.set_max_model_len(1000);
  info.set_block_size(block_size);
  return info;
}

v1::HeartbeatRequest Beat(const std::string& id, uint64_t epoch = 1) {
  v1::HeartbeatRequest hb;
  hb.set_worker_id(id);
  hb.set_epoch(epoch);
  hb.set_status(v1::SERVING_STATUS_SERVING);
  return hb;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  WorkerRegistryTest()
      : registry_(
            Options(), [this] { return clock_.Now(); },
            [](const std::string&) { return std::make_shared<FakeWorkerClient>(); }) {}
  static RegistryOptions Options() {
    RegistryOptions o;
    o.heartbeat_interval = absl::Seconds(1);
    o.worker_timeout = absl::Seconds(5);
    o.forget_after = absl::Minutes(1);
    o.max_failure_backoff = absl::Seconds(8);
    return o;
  }
  const RouteCandidate* Find(const RoutingSnapshot& snap, const std::string& id) {
    for (const auto& c : snap.candidates) {
      if (c.worker_id == id) return &c;
    }
    return nullptr;
  }
  bool Healthy(const std::string& id) {
    const v1::ListWorkersResponse list = registry_.List();
    for (const auto& w : list.workers()) {
      if (w.info().worker_id() == id) return w.healthy();
    }
    ADD_FAILURE() << id << " not listed";
    return false;
  }

  ManualClock clock_;
  WorkerRegistry registry_;
  const std::vector<uint32_t> probe_ = {1, 2, 3, 4, 5, 6, 7, 8, 9};
};

TEST_F(WorkerRegistryTest, RegisterHeartbeatAndEpochs) {
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_PREFILL, 2)).ok());
  EXPECT_EQ(registry_.Register(Info("w", v1::WORKER_ROLE_PREFILL, 1)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Register(Info("", v1::WORKER_ROLE_PREFILL)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(*registry_.Heartbeat(Beat("w", 2)));
  EXPECT_FALSE(*registry_.Heartbeat(Beat("w", 1)));  // stale epoch: register again
  EXPECT_FALSE(*registry_.Heartbeat(Beat("unknown")));
  v1::HeartbeatRequest hb = Beat("w", 2);
  hb.mutable_load()->set_num_running(2);
  hb.mutable_load()->set_num_waiting(3);
  hb.mutable_load()->set_kv_blocks_free(77);
  ASSERT_TRUE(registry_.Heartbeat(hb).ok());
  RoutingSnapshot snap = registry_.Snapshot(probe_, "");
  ASSERT_NE(Find(snap, "w"), nullptr);
  EXPECT_EQ(Find(snap, "w")->load, 5);
  EXPECT_EQ(Find(snap, "w")->free_blocks, 77);
}

TEST_F(WorkerRegistryTest, PrefixIndexFromHeartbeatDeltasUsesTheWorkersBlockSize) {
  ASSERT_TRUE(registry_.Register(Info("w4", v1::WORKER_ROLE_PREFILL, 1, 4)).ok());
  ASSERT_TRUE(registry_.Register(Info("w2", v1::WORKER_ROLE_MIXED, 1, 2)).ok());
  std::vector<int32_t> tokens(probe_.begin(), probe_.end());
  v1::HeartbeatRequest hb4 = Beat("w4");
  for (const BlockHash& h : ComputeBlockHashes(tokens, 4, "salt")) {
    hb4.add_added_block_hashes(h.Short());
  }
  v1::HeartbeatRequest hb2 = Beat("w2");
  for (const BlockHash& h : ComputeBlockHashes(tokens, 2, "salt")) {
    hb2.add_added_block_hashes(h.Short());
  }
  ASSERT_TRUE(registry_.Heartbeat(hb4).ok());
  ASSERT_TRUE(registry_.Heartbeat(hb2).ok());
  // The next heartbeat reports block 3 evicted.
  hb2 = Beat("w2");
  hb2.add_removed_block_hashes(ComputeBlockHashes(tokens, 2, "salt")[3].Short());
  ASSERT_TRUE(registry_.Heartbeat(hb2).ok());
  RoutingSnapshot snap = registry_.Snapshot(probe_, "salt");
  EXPECT_EQ(Find(snap, "w4")->cached_tokens, 8);  // 2 full blocks of 4
  EXPECT_EQ(Find(snap, "w2")->cached_tokens, 6);  // blocks 0..2 of 2; block 3 evicted
  EXPECT_EQ(Find(registry_.Snapshot(probe_, "other"), "w4")->cached_tokens, 0);
  // A re-registration with a new epoch starts from an empty index.
  ASSERT_TRUE(registry_.Register(Info("w4", v1::WORKER_ROLE_PREFILL, 2, 4)).ok());
  EXPECT_EQ(Find(registry_.Snapshot(probe_, "salt"), "w4")->cached_tokens, 0);
}

TEST_F(WorkerRegistryTest, BeginCallCountsLoadAndRemembersThePrompt) {
  ASSERT_TRUE(registry_.Register(Info("p", v1::WORKER_ROLE_PREFILL)).ok());
  RoutingSnapshot snap = registry_.Snapshot(probe_, "");
  EXPECT_EQ(Find(snap, "p")->cached_tokens, 0);
  absl::StatusOr<WorkerRef> ref = registry_.BeginCall("p", &snap);
  ASSERT_TRUE(ref.ok());
  EXPECT_NE(ref->client, nullptr);
  RoutingSnapshot after = registry_.Snapshot(probe_, "");
  EXPECT_EQ(Find(after, "p")->load, 1);
  EXPECT_EQ(Find(after, "p")->cached_tokens, 8);
  registry_.EndCall(*ref, false);
  EXPECT_EQ(Find(registry_.Snapshot(probe_, ""), "p")->load, 0);
  EXPECT_EQ(registry_.BeginCall("gone").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(WorkerRegistryTest, MissedHeartbeatsThenReadmission) {
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_DECODE)).ok());
  clock_.Advance(absl::Seconds(4));
  EXPECT_TRUE(registry_.CheckTimeouts().empty());
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(registry_.CheckTimeouts(), std::vector<std::string>{"w"});
  EXPECT_TRUE(registry_.CheckTimeouts().empty());  // reported once
  EXPECT_FALSE(Healthy("w"));
  EXPECT_EQ(Find(registry_.Snapshot(probe_, ""), "w"), nullptr);
  ASSERT_TRUE(*registry_.Heartbeat(Beat("w")));
  EXPECT_TRUE(Healthy("w"));
  EXPECT_NE(Find(registry_.Snapshot(probe_, ""), "w"), nullptr);
  // Silent past forget_after: removed, and its heartbeat asks it to register again.
  clock_.Advance(absl::Minutes(2));
  registry_.CheckTimeouts();
  EXPECT_EQ(registry_.List().workers_size(), 0);
  EXPECT_FALSE(*registry_.Heartbeat(Beat("w")));
}

TEST_F(WorkerRegistryTest, FailedCallsBackOffExponentially) {
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_DECODE)).ok());
  for (absl::Duration backoff :
       {absl::Seconds(1), absl::Seconds(2), absl::Seconds(4), absl::Seconds(8), absl::Seconds(8)}) {
    absl::StatusOr<WorkerRef> ref = registry_.BeginCall("w");
    ASSERT_TRUE(ref.ok());
    registry_.EndCall(*ref, true, "connection refused");
    EXPECT_FALSE(Healthy("w"));
    clock_.Advance(backoff - absl::Milliseconds(1));
    ASSERT_TRUE(*registry_.Heartbeat(Beat("w")));
    EXPECT_FALSE(Healthy("w")) << "re-admitted before " << backoff;
    clock_.Advance(absl::Milliseconds(1));
    ASSERT_TRUE(*registry_.Heartbeat(Beat("w")));
    EXPECT_TRUE(Healthy("w")) << "still out after " << backoff;
  }
  // A success resets the backoff.
  absl::StatusOr<WorkerRef> ref = registry_.BeginCall("w");
  registry_.EndCall(*ref, false);
  ref = registry_.BeginCall("w");
  registry_.EndCall(*ref, true, "again");
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(*registry_.Heartbeat(Beat("w")));
  EXPECT_TRUE(Healthy("w"));
}

TEST_F(WorkerRegistryTest, FailuresOfAnOldEpochDoNotTouchTheNewOne) {
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_DECODE, 1)).ok());
  absl::StatusOr<WorkerRef> old = registry_.BeginCall("w");
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_DECODE, 2)).ok());
  registry_.EndCall(*old, true, "old process died");
  EXPECT_TRUE(Healthy("w"));
}

TEST_F(WorkerRegistryTest, NotServingWorkersAreNotCandidates) {
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_MIXED)).ok());
  EXPECT_NE(Find(registry_.Snapshot(probe_, ""), "w"), nullptr);  // not reported yet: routable
  v1::HeartbeatRequest hb = Beat("w");
  hb.set_status(v1::SERVING_STATUS_DRAINING);
  ASSERT_TRUE(registry_.Heartbeat(hb).ok());
  RoutingSnapshot snap = registry_.Snapshot(probe_, "");
  EXPECT_EQ(Find(snap, "w"), nullptr);
  EXPECT_EQ(snap.registered, 1);
  const v1::ListWorkersResponse list = registry_.List();
  EXPECT_EQ(list.workers(0).status(), v1::SERVING_STATUS_DRAINING);
}

}  // namespace
}  // namespace tandem::router
