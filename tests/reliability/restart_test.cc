// A worker restarted on its own port (tests/reliability/README.md): the new process is a new
// epoch, a KV handle from the old one is refused (or recomputed, never read), the old lease
// cannot be released or renewed on the new process, and repeated restarts of P and D with
// streams in flight leave the other daemons without leaked threads or fds.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tandem/v1/kv.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/reliability/reliability_util.h"

namespace tandem::reliability {
namespace {

uint64_t EpochOf(Cluster& cluster, const std::string& worker) {
  absl::StatusOr<v1::WorkerStats> s = cluster.Stats(worker);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? s->info().epoch() : 0;
}

uint64_t ListedEpoch(Cluster& cluster, const std::string& worker) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::ListWorkersResponse list;
  const grpc::Status s = cluster.router().ListWorkers(&ctx, v1::ListWorkersRequest(), &list);
  EXPECT_TRUE(s.ok()) << s.error_message();
  for (const v1::WorkerEntry& e : list.workers()) {
    if (e.info().worker_id() == worker) return e.info().epoch();
  }
  return 0;
}

// The epoch the router lists for `worker` once it equals `want`, or the last one listed when
// `timeout` passes first. A restarted worker re-registers asynchronously: right after
// WaitHealthy the router may still list the old process's entry (its heartbeats stopped less
// than the unhealthy threshold ago; seen under CI load).
uint64_t WaitListedEpoch(Cluster& cluster, const std::string& worker, uint64_t want,
                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t listed = ListedEpoch(cluster, worker);
  while (listed != want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    listed = ListedEpoch(cluster, worker);
  }
  return listed;
}

// D's decode of `request` from `handle`, as the router would call it.
Outcome DecodeDirect(Cluster& cluster, const v1::GenerateRequest& request, uint32_t first_token,
                     const v1::KvHandle& handle, v1::KvLoadFailurePolicy policy) {
  auto d =
      v1::WorkerService::NewStub(Connect(cluster, cluster.worker("decode-0")->address, "router"));
  v1::DecodeRequest dreq;
  *dreq.mutable_request() = request;
  dreq.set_first_token(first_token);
  *dreq.mutable_kv_handle() = handle;
  dreq.set_on_kv_failure(policy);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  const absl::Time start = absl::Now();
  auto reader = d->Decode(&ctx, dreq);
  Outcome out;
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    out.tokens.insert(out.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) out.finish = msg.finish_reason();
  }
  out.status = reader->Finish();
  out.took = absl::Now() - start;
  return out;
}

TEST(RestartTest, SamePortIsANewEpochAndStaleHandlesAreRefused) {
  auto cluster = Start(SmallModelCluster(1, 1, 0));
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  LeakCheck leaks(*cluster);
  const uint64_t old_epoch = EpochOf(*cluster, "prefill-0");
  ASSERT_EQ(ListedEpoch(*cluster, "prefill-0"), old_epoch);

  // A handle from the old P (prefilled directly, as the router does).
  v1::GenerateRequest request = MakeRequest(2024, 100, 20);
  request.set_request_id("stale-handle");
  auto p = v1::WorkerService::NewStub(
      Connect(*cluster, cluster->worker("prefill-0")->address, "router"));
  v1::PrefillRequest preq;
  *preq.mutable_request() = request;
  preq.set_remote_decode(true);
  preq.set_decode_worker_id("decode-0");  // the lease is bound to the decode worker
  v1::PrefillResponse prefilled;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    const grpc::Status s = p->Prefill(&ctx, preq, &prefilled);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(prefilled.has_kv_handle());
  const v1::KvHandle stale = prefilled.kv_handle();
  EXPECT_EQ(stale.epoch(), old_epoch);

  ASSERT_TRUE(cluster->RestartWorker("prefill-0", SIGKILL).ok()) << cluster->Logs();
  ASSERT_TRUE(cluster->WaitHealthy(2, absl::Seconds(30)).ok()) << cluster->Logs();
  const uint64_t new_epoch = EpochOf(*cluster, "prefill-0");
  EXPECT_GT(new_epoch, old_epoch);
  EXPECT_EQ(WaitListedEpoch(*cluster, "prefill-0", new_epoch, absl::Seconds(10)), new_epoch)
      << "the router learns the new epoch";

  // Policy fail: refused, naming the restart. Policy recompute: D prefills the prompt itself;
  // if it serves the request, the tokens are the model's (never the old process's blocks).
  Outcome refused = DecodeDirect(*cluster, request, prefilled.first_token(), stale,
                                 v1::KV_LOAD_FAILURE_POLICY_FAIL);
  EXPECT_FALSE(refused.status.ok());
  EXPECT_TRUE(refused.tokens.empty());
  std::printf("stale handle, policy fail: %d %s\n", refused.status.error_code(),
              refused.status.error_message().c_str());
  request.set_request_id("stale-handle-2");
  v1::KvHandle stale_2 = stale;  // a handle names its request: this one as if issued for it
  stale_2.set_request_id("stale-handle-2");
  Outcome recomputed = DecodeDirect(*cluster, request, prefilled.first_token(), stale_2,
                                    v1::KV_LOAD_FAILURE_POLICY_RECOMPUTE);
  std::printf("stale handle, policy recompute: %d %s, %zu tokens\n", recomputed.status.error_code(),
              recomputed.status.error_message().c_str(), recomputed.tokens.size());
  request.clear_request_id();
  Outcome reference = RunRequest(cluster->router(), request);
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();
  ASSERT_EQ(reference.tokens.size(), 20u);
  EXPECT_EQ(reference.tokens[0], prefilled.first_token());
  if (recomputed.status.ok()) {
    EXPECT_EQ(recomputed.tokens,
              std::vector<uint32_t>(reference.tokens.begin() + 1, reference.tokens.end()));
  }

  // The old lease is no lease of the new process (asked by the decode worker it was bound to).
  auto kv = v1::KvTransferService::NewStub(
      Connect(*cluster, cluster->worker("prefill-0")->address, "decode-0"));
  for (uint64_t epoch : {old_epoch, new_epoch}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ReleaseLeaseRequest release;
    release.set_worker_id("prefill-0");
    release.set_epoch(epoch);
    release.set_lease_id(stale.lease_id());
    v1::ReleaseLeaseResponse released;
    const grpc::Status s = kv->ReleaseLease(&ctx, release, &released);
    EXPECT_FALSE(s.ok() && released.released()) << "epoch " << epoch;
    grpc::ClientContext ctx2;
    ctx2.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::RenewLeaseRequest renew;
    renew.set_worker_id("prefill-0");
    renew.set_epoch(epoch);
    renew.set_lease_id(stale.lease_id());
    renew.set_extend_ms(60000);
    v1::RenewLeaseResponse renewed;
    const grpc::Status r = kv->RenewLease(&ctx2, renew, &renewed);
    EXPECT_FALSE(r.ok() && renewed.renewed()) << "epoch " << epoch;
  }
  WarmUp(*cluster, 8, 4);
  leaks.Rebase(*cluster, "prefill-0");
  ExpectNothingLost(*cluster, leaks);
}

// P and D restarted on their ports in turn, each time with streams in flight: the streams end
// (UNAVAILABLE on a restarted D; on through D when P restarts), the router serves through the
// new process, and the daemons that stayed up do not accumulate threads or fds (channels,
// UCX endpoints to dead incarnations).
TEST(RestartTest, RepeatedRestartsUnderLoadLeakNothing) {
  auto cluster = Start(SmallModelCluster(1, 1, 0));
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  LeakCheck leaks(*cluster);
  const int restarts = Iterations(6, 40);
  for (int i = 0; i < restarts; ++i) {
    const std::string victim = i % 2 == 0 ? "prefill-0" : "decode-0";
    SCOPED_TRACE(testing::Message() << "restart " << i << " of " << victim);
    std::vector<std::unique_ptr<Stream>> streams;
    for (int s = 0; s < 3; ++s) {
      streams.push_back(std::make_unique<Stream>(
          cluster->router(), MakeRequest(3000 + 10 * i + s, 30, 3000), absl::Seconds(60)));
      ASSERT_GE(streams.back()->ReadTokens(2), 2);
    }
    ASSERT_TRUE(cluster->RestartWorker(victim, SIGKILL).ok()) << cluster->Logs();
    for (auto& s : streams) {
      if (victim == "prefill-0") s->Cancel();  // D streams on; end it here
      const Outcome o = s->Finish();
      EXPECT_EQ(o.status.error_code(),
                victim == "prefill-0" ? grpc::StatusCode::CANCELLED : grpc::StatusCode::UNAVAILABLE)
          << o.status.error_message();
    }
    ASSERT_TRUE(cluster->WaitHealthy(2, absl::Seconds(30)).ok()) << cluster->Logs();
    WarmUp(*cluster, 8, 4);
    leaks.Rebase(*cluster, victim);
    ASSERT_TRUE(WaitPoolsWhole(*cluster, absl::Seconds(10)).ok());
  }
  ExpectNothingLost(*cluster, leaks);
}

}  // namespace
}  // namespace tandem::reliability
