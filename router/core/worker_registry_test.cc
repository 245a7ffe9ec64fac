#include "router/core/worker_registry.h"

#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/block_hash.h"
#include "common/security/auth_status.h"
#include "gtest/gtest.h"
#include "router/testing/fake_worker_client.h"
#include "router/testing/manual_clock.h"

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
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_PREFILL, 2), {}).ok());
  EXPECT_EQ(registry_.Register(Info("w", v1::WORKER_ROLE_PREFILL, 1), {}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Register(Info("", v1::WORKER_ROLE_PREFILL), {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(*registry_.Heartbeat(Beat("w", 2), {}));
  EXPECT_FALSE(*registry_.Heartbeat(Beat("w", 1), {}));  // stale epoch: register again
  EXPECT_FALSE(*registry_.Heartbeat(Beat("unknown"), {}));
  v1::HeartbeatRequest hb = Beat("w", 2);
  hb.mutable_load()->set_num_running(2);
  hb.mutable_load()->set_num_waiting(3);
  hb.mutable_load()->set_kv_blocks_free(77);
  ASSERT_TRUE(registry_.Heartbeat(hb, {}).ok());
  RoutingSnapshot snap = registry_.Snapshot(probe_, "");
  ASSERT_NE(Find(snap, "w"), nullptr);
  EXPECT_EQ(Find(snap, "w")->load, 5);
  EXPECT_EQ(Find(snap, "w")->free_blocks, 77);
}

TEST_F(WorkerRegistryTest, PrefixIndexFromHeartbeatDeltasUsesTheWorkersBlockSize) {
  ASSERT_TRUE(registry_.Register(Info("w4", v1::WORKER_ROLE_PREFILL, 1, 4), {}).ok());
  ASSERT_TRUE(registry_.Register(Info("w2", v1::WORKER_ROLE_MIXED, 1, 2), {}).ok());
  std::vector<int32_t> tokens(probe_.begin(), probe_.end());
  v1::HeartbeatRequest hb4 = Beat("w4");
  for (const BlockHash& h : ComputeBlockHashes(tokens, 4, "salt")) {
    hb4.add_added_block_hashes(h.Short());
  }
  v1::HeartbeatRequest hb2 = Beat("w2");
  for (const BlockHash& h : ComputeBlockHashes(tokens, 2, "salt")) {
    hb2.add_added_block_hashes(h.Short());
  }
  ASSERT_TRUE(registry_.Heartbeat(hb4, {}).ok());
  ASSERT_TRUE(registry_.Heartbeat(hb2, {}).ok());
  // The next heartbeat reports block 3 evicted.
  hb2 = Beat("w2");
  hb2.add_removed_block_hashes(ComputeBlockHashes(tokens, 2, "salt")[3].Short());
  ASSERT_TRUE(registry_.Heartbeat(hb2, {}).ok());
  RoutingSnapshot snap = registry_.Snapshot(probe_, "salt");
  EXPECT_EQ(Find(snap, "w4")->cached_tokens, 8);  // 2 full blocks of 4
  EXPECT_EQ(Find(snap, "w2")->cached_tokens, 6);  // blocks 0..2 of 2; block 3 evicted
  EXPECT_EQ(Find(registry_.Snapshot(probe_, "other"), "w4")->cached_tokens, 0);
  // A re-registration with a new epoch starts from an empty index.
  ASSERT_TRUE(registry_.Register(Info("w4", v1::WORKER_ROLE_PREFILL, 2, 4), {}).ok());
  EXPECT_EQ(Find(registry_.Snapshot(probe_, "salt"), "w4")->cached_tokens, 0);
}

TEST_F(WorkerRegistryTest, BeginCallCountsLoadAndRemembersThePrompt) {
  ASSERT_TRUE(registry_.Register(Info("p", v1::WORKER_ROLE_PREFILL), {}).ok());
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
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_DECODE), {}).ok());
  clock_.Advance(absl::Seconds(4));
  EXPECT_TRUE(registry_.CheckTimeouts().empty());
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(registry_.CheckTimeouts(), std::vector<std::string>{"w"});
  EXPECT_TRUE(registry_.CheckTimeouts().empty());  // reported once
  EXPECT_FALSE(Healthy("w"));
  EXPECT_EQ(Find(registry_.Snapshot(probe_, ""), "w"), nullptr);
  ASSERT_TRUE(*registry_.Heartbeat(Beat("w"), {}));
  EXPECT_TRUE(Healthy("w"));
  EXPECT_NE(Find(registry_.Snapshot(probe_, ""), "w"), nullptr);
  // Silent past forget_after: removed, and its heartbeat asks it to register again.
  clock_.Advance(absl::Minutes(2));
  registry_.CheckTimeouts();
  EXPECT_EQ(registry_.List().workers_size(), 0);
  EXPECT_FALSE(*registry_.Heartbeat(Beat("w"), {}));
}

TEST_F(WorkerRegistryTest, FailedCallsBackOffExponentially) {
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_DECODE), {}).ok());
  for (absl::Duration backoff :
       {absl::Seconds(1), absl::Seconds(2), absl::Seconds(4), absl::Seconds(8), absl::Seconds(8)}) {
    absl::StatusOr<WorkerRef> ref = registry_.BeginCall("w");
    ASSERT_TRUE(ref.ok());
    registry_.EndCall(*ref, true, "connection refused");
    EXPECT_FALSE(Healthy("w"));
    clock_.Advance(backoff - absl::Milliseconds(1));
    ASSERT_TRUE(*registry_.Heartbeat(Beat("w"), {}));
    EXPECT_FALSE(Healthy("w")) << "re-admitted before " << backoff;
    clock_.Advance(absl::Milliseconds(1));
    ASSERT_TRUE(*registry_.Heartbeat(Beat("w"), {}));
    EXPECT_TRUE(Healthy("w")) << "still out after " << backoff;
  }
  // A success resets the backoff.
  absl::StatusOr<WorkerRef> ref = registry_.BeginCall("w");
  registry_.EndCall(*ref, false);
  ref = registry_.BeginCall("w");
  registry_.EndCall(*ref, true, "again");
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(*registry_.Heartbeat(Beat("w"), {}));
  EXPECT_TRUE(Healthy("w"));
}

// A worker that answers a call begun after its failure is reachable again (a link that came
// back): re-admitted at once, its backoff reset. An answer to a call begun before the failure
// proves nothing new and changes nothing.
TEST_F(WorkerRegistryTest, AnAnswerToACallMadeAfterTheFailureReadmitsAtOnce) {
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_DECODE), {}).ok());
  absl::StatusOr<WorkerRef> before = registry_.BeginCall("w");
  ASSERT_TRUE(before.ok());
  clock_.Advance(absl::Milliseconds(10));
  absl::StatusOr<WorkerRef> failed = registry_.BeginCall("w");
  ASSERT_TRUE(failed.ok());
  registry_.EndCall(*failed, true, "failed to connect");
  EXPECT_FALSE(Healthy("w"));
  registry_.Answered(*before);
  EXPECT_FALSE(Healthy("w")) << "an answer to an older call";
  clock_.Advance(absl::Milliseconds(10));
  absl::StatusOr<WorkerRef> after = registry_.BeginCall("w");
  ASSERT_TRUE(after.ok());
  registry_.Answered(*after);
  EXPECT_TRUE(Healthy("w")) << "answered after its failure, before its 1 s backoff ended";
  registry_.EndCall(*after, false);
  registry_.EndCall(*before, false);
  // The backoff starts over: the next failure is out for 1 s again, not 2.
  absl::StatusOr<WorkerRef> again = registry_.BeginCall("w");
  registry_.EndCall(*again, true, "again");
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(*registry_.Heartbeat(Beat("w"), {}));
  EXPECT_TRUE(Healthy("w"));
}

TEST_F(WorkerRegistryTest, FailuresOfAnOldEpochDoNotTouchTheNewOne) {
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_DECODE, 1), {}).ok());
  absl::StatusOr<WorkerRef> old = registry_.BeginCall("w");
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_DECODE, 2), {}).ok());
  registry_.EndCall(*old, true, "old process died");
  EXPECT_TRUE(Healthy("w"));
}

TEST_F(WorkerRegistryTest, NotServingWorkersAreNotCandidates) {
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_MIXED), {}).ok());
  EXPECT_NE(Find(registry_.Snapshot(probe_, ""), "w"), nullptr);  // not reported yet: routable
  v1::HeartbeatRequest hb = Beat("w");
  hb.set_status(v1::SERVING_STATUS_DRAINING);
  ASSERT_TRUE(registry_.Heartbeat(hb, {}).ok());
  RoutingSnapshot snap = registry_.Snapshot(probe_, "");
  EXPECT_EQ(Find(snap, "w"), nullptr);
  EXPECT_EQ(snap.registered, 1);
  const v1::ListWorkersResponse list = registry_.List();
  EXPECT_EQ(list.workers(0).status(), v1::SERVING_STATUS_DRAINING);
}

// Callers as the router's TLS transport reports them (what the certificates name).
RegistryCaller Cert(security::Role role, const std::string& worker_id = "") {
  security::PeerIdentity peer;
  peer.role = role;
  peer.name = worker_id.empty() ? std::string(security::RoleName(role)) : worker_id;
  peer.worker_id = worker_id;
  return RegistryCaller{peer};
}

// Issue 30 item 3: the role-only decode.pem registered as decode-0 with epoch 2^64-1 and took
// its traffic. Item 4: it heartbeat DRAINING for prefill-0 and took that out of routing.
TEST_F(WorkerRegistryTest, RoleOnlyCertificatesClaimNoWorkerId) {
  const RegistryCaller decode0 = Cert(security::Role::kDecode, "decode-0");
  const RegistryCaller prefill0 = Cert(security::Role::kPrefill, "prefill-0");
  ASSERT_TRUE(registry_.Register(Info("decode-0", v1::WORKER_ROLE_DECODE, 5), decode0).ok());
  ASSERT_TRUE(registry_.Register(Info("prefill-0", v1::WORKER_ROLE_PREFILL, 5), prefill0).ok());
  for (security::Role role :
       {security::Role::kDecode, security::Role::kPrefill, security::Role::kMixed}) {
    const RegistryCaller role_only = Cert(role);
    for (const char* id : {"decode-0", "prefill-0", "brand-new"}) {
      v1::WorkerInfo info = Info(id, v1::WORKER_ROLE_DECODE, 6);
      if (role == security::Role::kPrefill) info.set_role(v1::WORKER_ROLE_PREFILL);
      if (role == security::Role::kMixed) info.set_role(v1::WORKER_ROLE_MIXED);
      absl::Status s = registry_.Register(info, role_only);
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << id;
      EXPECT_EQ(s.message(), security::kPermissionDeniedMessage);
      v1::HeartbeatRequest drain = Beat(id, 5);
      drain.set_status(v1::SERVING_STATUS_DRAINING);
      EXPECT_EQ(registry_.Heartbeat(drain, role_only).status().code(),
                absl::StatusCode::kPermissionDenied)
          << id;
    }
  }
  const v1::ListWorkersResponse list = registry_.List();
  ASSERT_EQ(list.workers_size(), 2);
  for (const auto& w : list.workers()) {
    EXPECT_EQ(w.info().epoch(), 5u) << w.info().worker_id();
    EXPECT_NE(w.status(), v1::SERVING_STATUS_DRAINING) << w.info().worker_id();
  }
}

TEST_F(WorkerRegistryTest, AWorkerIdIsClaimedAndBeatenOnlyByTheCertificateNamingIt) {
  const RegistryCaller decode0 = Cert(security::Role::kDecode, "decode-0");
  const RegistryCaller decode1 = Cert(security::Role::kDecode, "decode-1");
  // decode-0's id in a certificate of another role (make_certs.sh --worker=decode-0:prefill).
  const RegistryCaller prefill_named_decode0 = Cert(security::Role::kPrefill, "decode-0");
  ASSERT_TRUE(registry_.Register(Info("decode-0", v1::WORKER_ROLE_DECODE, 3), decode0).ok());
  EXPECT_EQ(registry_.Register(Info("decode-0", v1::WORKER_ROLE_DECODE, 4), decode1).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      registry_.Register(Info("decode-0", v1::WORKER_ROLE_DECODE, 4), prefill_named_decode0).code(),
      absl::StatusCode::kPermissionDenied);  // of another role than it registers
  // Live: replaced only by the same identity.
  EXPECT_EQ(registry_.Register(Info("decode-0", v1::WORKER_ROLE_PREFILL, 4), prefill_named_decode0)
                .code(),
            absl::StatusCode::kPermissionDenied);
  for (const RegistryCaller& other : {decode1, prefill_named_decode0}) {
    v1::HeartbeatRequest drain = Beat("decode-0", 3);
    drain.set_status(v1::SERVING_STATUS_DRAINING);
    EXPECT_EQ(registry_.Heartbeat(drain, other).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_NE(Find(registry_.Snapshot(probe_, ""), "decode-0"), nullptr);
  EXPECT_TRUE(*registry_.Heartbeat(Beat("decode-0", 3), decode0));
  // Its own restart replaces it.
  ASSERT_TRUE(registry_.Register(Info("decode-0", v1::WORKER_ROLE_DECODE, 4), decode0).ok());
  EXPECT_EQ(registry_.List().workers(0).info().epoch(), 4u);
  // Timed out, it is no longer live: another identity naming the id may take it (newer epoch).
  clock_.Advance(absl::Seconds(6));
  ASSERT_EQ(registry_.CheckTimeouts().size(), 1u);
  EXPECT_TRUE(
      registry_.Register(Info("decode-0", v1::WORKER_ROLE_PREFILL, 5), prefill_named_decode0).ok());
  EXPECT_EQ(registry_.Heartbeat(Beat("decode-0", 5), decode0).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(WorkerRegistryTest, EpochsMustBeNewerAndNotAheadOfTheClock) {
  std::mt19937_64 rng(20261128);
  const RegistryCaller w = Cert(security::Role::kMixed, "w");
  const uint64_t now = static_cast<uint64_t>(absl::ToUnixMicros(clock_.Now()));
  const uint64_t minute = 60'000'000;
  // Far ahead (the probe's 2^64 - 1), or just past the allowed minute: refused, nothing kept.
  for (uint64_t epoch : {~uint64_t{0}, now + minute + 1 + rng() % (1000 * minute)}) {
    EXPECT_EQ(registry_.Register(Info("w", v1::WORKER_ROLE_MIXED, epoch), w).code(),
              absl::StatusCode::kFailedPrecondition)
        << epoch;
  }
  EXPECT_EQ(registry_.List().workers_size(), 0);
  // Within the minute (a worker whose clock is a little ahead): taken.
  const uint64_t first = now + rng() % minute;
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_MIXED, first), w).ok());
  // The same epoch again from the same address is a retry; from another address, or older: no.
  EXPECT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_MIXED, first), w).ok());
  v1::WorkerInfo moved = Info("w", v1::WORKER_ROLE_MIXED, first);
  moved.set_address("127.0.0.1:2");
  EXPECT_EQ(registry_.Register(moved, w).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      registry_.Register(Info("w", v1::WORKER_ROLE_MIXED, first - 1 - rng() % first), w).code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.List().workers(0).info().address(), "127.0.0.1:1");
  // The clock moves on: a restart with the epoch of now is newer and taken.
  clock_.Advance(absl::Minutes(2));
  const uint64_t restart = static_cast<uint64_t>(absl::ToUnixMicros(clock_.Now()));
  ASSERT_TRUE(registry_.Register(Info("w", v1::WORKER_ROLE_MIXED, restart), w).ok());
  EXPECT_EQ(registry_.List().workers(0).info().epoch(), restart);
}

TEST_F(WorkerRegistryTest, LimitsAreTheSmallestOfHealthyServingWorkers) {
  EXPECT_EQ(registry_.Limits().vocab_size, 0u);
  std::mt19937 rng(7);
  uint32_t vocab = ~0u, len = ~0u;
  for (int i = 0; i < 5; ++i) {
    v1::WorkerInfo info = Info("w" + std::to_string(i), v1::WORKER_ROLE_MIXED);
    info.set_vocab_size(100 + rng() % 50000);
    info.set_max_model_len(100 + rng() % 50000);
    vocab = std::min(vocab, info.vocab_size());
    len = std::min(len, info.max_model_len());
    ASSERT_TRUE(registry_.Register(info, {}).ok());
  }
  v1::WorkerInfo small = Info("draining", v1::WORKER_ROLE_MIXED);
  small.set_vocab_size(50);
  small.set_max_model_len(50);
  ASSERT_TRUE(registry_.Register(small, {}).ok());
  v1::HeartbeatRequest drain = Beat("draining");
  drain.set_status(v1::SERVING_STATUS_DRAINING);
  ASSERT_TRUE(registry_.Heartbeat(drain, {}).ok());
  EXPECT_EQ(registry_.Limits().vocab_size, vocab);
  EXPECT_EQ(registry_.Limits().max_model_len, len);
}

}  // namespace
}  // namespace tandem::router
