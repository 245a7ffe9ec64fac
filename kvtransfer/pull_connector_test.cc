// PullKvConnector on its own over InProcessAgents: block-pair coalescing, bit-exact loads of
// random non-contiguous block lists, deadlines, cancel, leases (release, renew, expiry) and the
// rule that a load's blocks are reported only after its transfer ended. The engine-level flow
// (scheduler + connector) is //runtime/engine:disagg_engine_test.
#include "kvtransfer/pull_connector.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/testing/fault_injecting_agent.h"

namespace tandem::kvtransfer {
namespace {

TEST(PullKvConnectorTest, CoalescesRunsWhereBothSidesAreContiguous) {
  PullKvConnectorOptions options;
  options.block_bytes = 100;
  const std::vector<std::pair<int32_t, int32_t>> blocks = {{4, 10},  {5, 11},  {6, 12}, {9, 13},
                                                           {10, 20}, {11, 21}, {3, 2}};
  const std::vector<CopyOp> ops = PullKvConnector::BlocksToCopyOps(blocks, options);
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(ops[0].remote_offset, 400u);
  EXPECT_EQ(ops[0].local_offset, 1000u);
  EXPECT_EQ(ops[0].length, 300u);
  EXPECT_EQ(ops[1].remote_offset, 900u);  // source contiguous, local jumps: split
  EXPECT_EQ(ops[1].length, 100u);
  EXPECT_EQ(ops[2].remote_offset, 1000u);
  EXPECT_EQ(ops[2].local_offset, 2000u);
  EXPECT_EQ(ops[2].length, 200u);
  EXPECT_EQ(ops[3].length, 100u);
  EXPECT_TRUE(PullKvConnector::BlocksToCopyOps({}, options).empty());
}

struct Pair {
  static constexpr int kBlocks = 32;
  static constexpr int kBlockBytes = 4096;
  std::shared_ptr<InProcessFabric> fabric = std::make_shared<InProcessFabric>();
  std::vector<uint8_t> src = std::vector<uint8_t>(kBlocks * kBlockBytes);
  std::vector<uint8_t> dst = std::vector<uint8_t>(kBlocks * kBlockBytes);
  std::unique_ptr<InProcessAgent> p, d;
  std::unique_ptr<PullKvConnector> pc, dc;

  explicit Pair(uint32_t seed) {
    std::mt19937 rng(seed);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    for (auto& b : dst) b = static_cast<uint8_t>(rng());
    p = std::make_unique<InProcessAgent>(fabric, "p");
    d = std::make_unique<InProcessAgent>(fabric, "d");
    EXPECT_TRUE(p->RegisterMemory(src.data(), src.size(), tandem::v1::MEMORY_KIND_HOST).ok());
    EXPECT_TRUE(d->RegisterMemory(dst.data(), dst.size(), tandem::v1::MEMORY_KIND_HOST).ok());
    tandem::v1::TransferHandshake hs;
    EXPECT_TRUE(p->FillLocalDescriptor(&hs).ok());
    EXPECT_TRUE(d->AddPeer("p", hs).ok());
    PullKvConnectorOptions options;
    options.block_size = 16;
    options.block_bytes = kBlockBytes;
    pc = std::make_unique<PullKvConnector>(p.get(), options);
    dc = std::make_unique<PullKvConnector>(d.get(), options);
  }
  // Polls D's connector until request `id` ends; true = loaded.
  bool WaitLoad(int64_t id) {
    for (int i = 0; i < 5000; ++i) {
      FinishedTransfers f = dc->GetFinished(absl::Now());
      if (std::count(f.receiving_done.begin(), f.receiving_done.end(), id)) return true;
      for (const LoadError& e : dc->GetLoadErrors()) {
        if (e.request_id == id) return false;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    ADD_FAILURE() << "load " << id << " never ended";
    return false;
  }
};

TEST(PullKvConnectorTest, LoadsRandomBlockListsBitExactAndSkipsLocalPrefix) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 10; ++trial) {
    Pair pair(rng());
    const std::vector<uint8_t> before = pair.dst;
    std::vector<int32_t> src_ids(Pair::kBlocks), dst_ids(Pair::kBlocks);
    std::iota(src_ids.begin(), src_ids.end(), 0);
    std::iota(dst_ids.begin(), dst_ids.end(), 0);
    std::shuffle(src_ids.begin(), src_ids.end(), rng);
    std::shuffle(dst_ids.begin(), dst_ids.end(), rng);
    const int n = 1 + static_cast<int>(rng() % 12);
    const int64_t num_tokens = (n - 1) * 16 + 1 + static_cast<int64_t>(rng() % 16);  // partial tail
    const int64_t local_hit = 16 * static_cast<int64_t>(rng() % n);  // full blocks D has
    RemoteKvSpec remote;
    remote.peer = "p";
    remote.num_tokens = num_tokens;
    remote.block_ids.assign(src_ids.begin(), src_ids.begin() + n);
    std::vector<int32_t> table(dst_ids.begin(), dst_ids.begin() + n);
    EXPECT_EQ(pair.dc->GetNumNewMatchedTokens(trial, remote, local_hit), num_tokens - local_hit);
    pair.dc->UpdateStateAfterAlloc(trial, remote, table, local_hit);
    ASSERT_TRUE(pair.dc->StartLoad(pair.dc->BuildStepMeta()).ok());
    ASSERT_TRUE(pair.WaitLoad(trial));
    const int first = static_cast<int>(local_hit / 16);
    std::vector<uint8_t> expect = before;
    for (int i = first; i < n; ++i) {
      std::copy_n(pair.src.begin() + src_ids[i] * Pair::kBlockBytes, Pair::kBlockBytes,
                  expect.begin() + table[i] * Pair::kBlockBytes);
    }
    ASSERT_EQ(pair.dst, expect) << "trial " << trial << ": n=" << n << " hit=" << local_hit;
    EXPECT_EQ(pair.dc->Stats().bytes_loaded, static_cast<uint64_t>(n - first) * Pair::kBlockBytes);
  }
}

// load_micros sums each completed load's wait from posting to the poll that saw it end; failed
// loads add nothing.
TEST(PullKvConnectorTest, LoadTimeCountsFromPostToSeenFinished) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Pair pair(seed);
  pair.d->HoldTransfers(true);
  RemoteKvSpec remote;
  remote.peer = "p";
  remote.num_tokens = 33;
  remote.block_ids = {5, 1, 2};
  pair.dc->UpdateStateAfterAlloc(1, remote, std::vector<int32_t>{3, 4, 9}, 0);
  const absl::Time before = absl::Now();
  ASSERT_TRUE(pair.dc->StartLoad(pair.dc->BuildStepMeta()).ok());
  absl::SleepFor(absl::Milliseconds(40));
  EXPECT_TRUE(pair.dc->GetFinished(absl::Now()).receiving_done.empty());
  EXPECT_EQ(pair.dc->Stats().load_micros, 0u);  // nothing completed yet
  pair.d->HoldTransfers(false);
  ASSERT_TRUE(pair.WaitLoad(1));
  const uint64_t waited = static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - before));
  const KvConnectorStats stats = pair.dc->Stats();
  EXPECT_EQ(stats.loads_completed, 1u);
  EXPECT_GE(stats.load_micros, 40000u);
  EXPECT_LE(stats.load_micros, waited);
  // A second load that fails (cancelled while held) leaves the sum alone.
  pair.d->HoldTransfers(true);
  pair.dc->UpdateStateAfterAlloc(2, remote, std::vector<int32_t>{6, 7, 8}, 0);
  ASSERT_TRUE(pair.dc->StartLoad(pair.dc->BuildStepMeta()).ok());
  pair.dc->CancelLoad(2);
  EXPECT_FALSE(pair.WaitLoad(2));
  EXPECT_EQ(pair.dc->Stats().load_micros, stats.load_micros);
  EXPECT_EQ(pair.dc->Stats().load_failures, 1u);
}

TEST(PullKvConnectorTest, DeadlineAndCancelEndOnlyAfterTheTransferEnded) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Pair pair(seed);
  pair.d->HoldTransfers(true);
  RemoteKvSpec remote;
  remote.peer = "p";
  remote.num_tokens = 40;
  remote.block_ids = {1, 2, 3};
  remote.deadline = absl::Now() + absl::Milliseconds(20);
  pair.dc->UpdateStateAfterAlloc(1, remote, std::vector<int32_t>{7, 8, 9}, 0);
  remote.deadline = absl::InfiniteFuture();
  pair.dc->UpdateStateAfterAlloc(2, remote, std::vector<int32_t>{4, 5, 6}, 0);
  ASSERT_TRUE(pair.dc->StartLoad(pair.dc->BuildStepMeta()).ok());
  pair.dc->CancelLoad(2);
  absl::SleepFor(absl::Milliseconds(30));
  std::vector<LoadError> errors;
  for (int i = 0; i < 2000 && errors.size() < 2; ++i) {
    EXPECT_TRUE(pair.dc->GetFinished(absl::Now()).receiving_done.empty());
    for (LoadError& e : pair.dc->GetLoadErrors()) errors.push_back(std::move(e));
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(errors.size(), 2u);
  std::sort(errors.begin(), errors.end(),
            [](const LoadError& a, const LoadError& b) { return a.request_id < b.request_id; });
  EXPECT_EQ(errors[0].status.code(), absl::StatusCode::kDeadlineExceeded) << errors[0].status;
  EXPECT_EQ(errors[0].block_ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(errors[1].status.code(), absl::StatusCode::kCancelled) << errors[1].status;
  EXPECT_FALSE(pair.dc->HasPendingLoads());
  EXPECT_EQ(pair.dc->Stats().load_failures, 2u);
  // Unknown peer: fails at once, nothing was posted.
  remote.peer = "nobody";
  pair.dc->UpdateStateAfterAlloc(3, remote, std::vector<int32_t>{1, 2, 3}, 0);
  ASSERT_TRUE(pair.dc->StartLoad(pair.dc->BuildStepMeta()).ok());
  auto failed = pair.dc->GetLoadErrors();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].request_id, 3);
}

TEST(PullKvConnectorTest, LeasesReleaseRenewAndExpire) {
  Pair pair(1);
  auto a = pair.pc->RequestFinished(10, "", true, 3, absl::Milliseconds(40));
  auto b = pair.pc->RequestFinished(11, "", true, 2, absl::Seconds(30));
  auto c = pair.pc->RequestFinished(12, "", true, 1, absl::Milliseconds(40));
  EXPECT_FALSE(pair.pc->RequestFinished(13, "", false, 4, absl::Seconds(1)).has_value());
  ASSERT_TRUE(a && b && c);
  EXPECT_NE(a->lease_id, b->lease_id);
  EXPECT_EQ(pair.pc->Stats().blocks_leased, 6u);
  ASSERT_TRUE(pair.pc->RenewLease(c->lease_id, absl::Seconds(30)).has_value());
  EXPECT_TRUE(pair.pc->ReleaseLease(b->lease_id));
  EXPECT_FALSE(pair.pc->ReleaseLease(b->lease_id));
  absl::SleepFor(absl::Milliseconds(60));
  FinishedTransfers f = pair.pc->GetFinished(absl::Now());
  std::sort(f.sending_done.begin(), f.sending_done.end());
  EXPECT_EQ(f.sending_done, (std::vector<int64_t>{10, 11})) << "released + expired, not renewed";
  const KvConnectorStats stats = pair.pc->Stats();
  EXPECT_EQ(stats.leases_expired, 1u);
  EXPECT_EQ(stats.leases_released, 1u);
  EXPECT_EQ(stats.leases_active, 1u);
  EXPECT_EQ(stats.blocks_leased, 1u);
  EXPECT_FALSE(pair.pc->RenewLease(a->lease_id, absl::Seconds(1)).has_value());
}

// A LeaseClient that renews on the source connector directly (inline, as the contract
// allows), or answers with a scripted error for the first `fail_first` calls.
class DirectRenewer final : public LeaseClient {
 public:
  explicit DirectRenewer(PullKvConnector* source) : source_(source) {}
  void RenewLeaseAsync(const std::string& /*peer*/, uint64_t /*epoch*/, uint64_t lease_id,
                       absl::Duration extend,
                       std::function<void(absl::StatusOr<absl::Time>)> done) override {
    absl::Status scripted = absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      if (fail_first_ > 0) {
        --fail_first_;
        scripted = failure_;
      }
    }
    if (!scripted.ok()) return done(scripted);
    std::optional<absl::Time> deadline = source_->RenewLease(lease_id, extend);
    if (!deadline.has_value()) return done(absl::NotFoundError("unknown lease"));
    done(*deadline);
  }
  // Records the connector's request (the source is told by the test itself where it matters).
  void ReleaseLeaseAsync(const std::string& /*peer*/, uint64_t /*epoch*/,
                         uint64_t lease_id) override {
    absl::MutexLock lock(&mu_);
    released_.push_back(lease_id);
  }
  std::vector<uint64_t> released() {
    absl::MutexLock lock(&mu_);
    return released_;
  }
  void FailFirst(int n, absl::Status failure) {
    absl::MutexLock lock(&mu_);
    fail_first_ = n;
    failure_ = std::move(failure);
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  PullKvConnector* const source_;
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_first_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> released_ ABSL_GUARDED_BY(mu_);
};

// P leases blocks for `lease`; D's transfers are delayed by `delay` (longer than the lease).
struct SlowPair {
  Pair pair;
  FaultInjectingAgent slow_d;
  std::unique_ptr<PullKvConnector> dc;
  std::shared_ptr<DirectRenewer> renewer;

  SlowPair(uint32_t seed, absl::Duration delay) : pair(seed), slow_d(pair.d.get()) {
    slow_d.SetFaults({.delay = delay});
    PullKvConnectorOptions options;
    options.block_size = 16;
    options.block_bytes = Pair::kBlockBytes;
    options.lease_safety_margin = absl::Milliseconds(100);
    dc = std::make_unique<PullKvConnector>(&slow_d, options);
    renewer = std::make_shared<DirectRenewer>(pair.pc.get());
  }
  // Loads source blocks {3, 4, 9} into {0, 1, 2} under a fresh lease; drives both connectors
  // until the load ends. Returns the load's end (OK = loaded) and P's finished requests.
  absl::Status Load(absl::Duration lease_duration, bool renew, std::vector<int64_t>* source_done,
                    bool release_mid_load = false) {
    std::optional<KvLease> lease = pair.pc->RequestFinished(77, "", true, 3, lease_duration);
    EXPECT_TRUE(lease.has_value());
    RemoteKvSpec remote;
    remote.peer = "p";
    remote.epoch = 1;
    remote.num_tokens = 48;
    remote.block_ids = {3, 4, 9};
    remote.lease_id = lease->lease_id;
    remote.lease_deadline = lease->deadline;
    remote.deadline = absl::Now() + absl::Seconds(30);
    if (renew) remote.lease_client = renewer;
    dc->UpdateStateAfterAlloc(5, remote, std::vector<int32_t>{0, 1, 2}, 0);
    EXPECT_TRUE(dc->StartLoad(dc->BuildStepMeta()).ok());
    if (release_mid_load) {
      EXPECT_TRUE(pair.pc->ReleaseLease(lease->lease_id));
    }
    for (int i = 0; i < 60000; ++i) {
      const absl::Time now = absl::Now();
      FinishedTransfers p = pair.pc->GetFinished(now);
      source_done->insert(source_done->end(), p.sending_done.begin(), p.sending_done.end());
      FinishedTransfers d = dc->GetFinished(now);
      if (!d.receiving_done.empty()) return absl::OkStatus();
      std::vector<LoadError> errors = dc->GetLoadErrors();
      if (!errors.empty()) return errors[0].status;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return absl::DeadlineExceededError("test: the load never ended");
  }
};

TEST(PullKvConnectorTest, LongLoadRenewsTheSourceLease) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  SlowPair slow(seed, absl::Milliseconds(2500));
  // One transient failure first: retried, the lease still holds.
  slow.renewer->FailFirst(1, absl::UnavailableError("injected: source unreachable"));
  std::vector<int64_t> source_done;
  ASSERT_TRUE(slow.Load(absl::Seconds(1), /*renew=*/true, &source_done).ok());
  EXPECT_TRUE(source_done.empty()) << "P gave the blocks back while D still read them";
  EXPECT_GE(slow.renewer->calls(), 3);  // at 0.5 s, the retry, then at half of each new lease
  EXPECT_GE(slow.dc->Stats().lease_renewals, 2u);
  EXPECT_EQ(slow.pair.pc->Stats().leases_expired, 0u);
  EXPECT_EQ(slow.pair.pc->Stats().leases_active, 1u);  // the release is D's LeaseClient's
  // The load ended: the connector asked (once) for the source's lease to be released.
  EXPECT_EQ(slow.renewer->released().size(), 1u);
  for (int i = 0; i < 3; ++i) {
    const int src = std::vector<int>{3, 4, 9}[i];
    ASSERT_TRUE(std::equal(slow.pair.src.begin() + src * Pair::kBlockBytes,
                           slow.pair.src.begin() + (src + 1) * Pair::kBlockBytes,
                           slow.pair.dst.begin() + i * Pair::kBlockBytes))
        << "block " << i;
  }
}

TEST(PullKvConnectorTest, LongLoadWithoutRenewalStopsBeforeTheLeaseEnds) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  SlowPair slow(seed, absl::Milliseconds(2500));
  std::vector<int64_t> source_done;
  const absl::Status end = slow.Load(absl::Seconds(1), /*renew=*/false, &source_done);
  EXPECT_EQ(end.code(), absl::StatusCode::kDeadlineExceeded) << end;
  EXPECT_NE(end.message().find("lease"), std::string::npos) << end;
  EXPECT_EQ(slow.renewer->calls(), 0);
}

TEST(PullKvConnectorTest, LoadFailsWhenTheSourceDroppedTheLease) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  SlowPair slow(seed, absl::Milliseconds(2500));
  std::vector<int64_t> source_done;
  const absl::Status end =
      slow.Load(absl::Seconds(1), /*renew=*/true, &source_done, /*release_mid_load=*/true);
  EXPECT_EQ(end.code(), absl::StatusCode::kFailedPrecondition) << end;
  EXPECT_EQ(source_done, (std::vector<int64_t>{77}));
  EXPECT_EQ(slow.dc->Stats().lease_renewals, 0u);
}

}  // namespace
}  // namespace tandem::kvtransfer

namespace tandem::kvtransfer {
namespace {

TEST(PullKvConnectorTest, ReleaseLeaseOfFindsTheLeaseByTheRequestsExternalId) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Pair pair(seed);
  ASSERT_TRUE(pair.pc->RequestFinished(5, "req-a", true, 2, absl::Seconds(30)).has_value());
  ASSERT_TRUE(pair.pc->RequestFinished(6, "req-b", true, 1, absl::Milliseconds(1)).has_value());
  EXPECT_FALSE(pair.pc->ReleaseLeaseOf("unknown"));
  EXPECT_TRUE(pair.pc->ReleaseLeaseOf("req-a"));
  EXPECT_FALSE(pair.pc->ReleaseLeaseOf("req-a"));  // once
  absl::SleepFor(absl::Milliseconds(5));
  FinishedTransfers done = pair.pc->GetFinished(absl::Now());
  std::sort(done.sending_done.begin(), done.sending_done.end());
  EXPECT_EQ(done.sending_done, (std::vector<int64_t>{5, 6}));
  EXPECT_FALSE(pair.pc->ReleaseLeaseOf("req-b"));  // expired: gone with its lease
  EXPECT_EQ(pair.pc->Stats().leases_released, 1u);
  EXPECT_EQ(pair.pc->Stats().leases_expired, 1u);
}

TEST(PullKvConnectorTest, DroppedRemoteKvReleasesTheSourceLeaseAtOnce) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Pair pair(seed);
  auto client = std::make_shared<DirectRenewer>(pair.pc.get());
  RemoteKvSpec remote;
  remote.peer = "p";
  remote.epoch = 3;
  remote.lease_id = 41;
  remote.lease_client = client;
  pair.dc->DropRemote(remote);
  EXPECT_EQ(client->released(), std::vector<uint64_t>{41});
  remote.lease_client = nullptr;
  pair.dc->DropRemote(remote);  // no client: nothing to tell (the source frees at expiry)
  EXPECT_EQ(client->released().size(), 1u);
}

TEST(PullKvConnectorTest, BlocksToByteRangesCoalescesRuns) {
  const std::vector<ByteRange> ranges =
      PullKvConnector::BlocksToByteRanges(std::vector<int32_t>{3, 4, 5, 9, 10, 2}, 100);
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0].offset, 300u);
  EXPECT_EQ(ranges[0].length, 300u);
  EXPECT_EQ(ranges[1].offset, 900u);
  EXPECT_EQ(ranges[1].length, 200u);
  EXPECT_EQ(ranges[2].offset, 200u);
  EXPECT_EQ(ranges[2].length, 100u);
}

}  // namespace
}  // namespace tandem::kvtransfer
