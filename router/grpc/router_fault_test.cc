// Faults end to end: admission limit, client cancel, Router.Abort, deadlines, workers that die
// mid-stream or before answering, workers that stop heartbeating (hung) and come back, router
// shutdown. No test asserts on timing; every wait has a generous bound so a broken router fails
// instead of hanging.
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "router/testing/fake_worker.h"
#include "router/testing/router_test_util.h"

namespace tandem::router {
namespace {

using v1::WORKER_ROLE_DECODE;
using v1::WORKER_ROLE_PREFILL;

constexpr absl::Duration kWait = absl::Seconds(30);

// Slow decoding with room for long outputs: requests stay in flight until ended.
void SlowDecode(FakeWorkerOptions& o) {
  o.token_delay = absl::Milliseconds(10);
  o.max_model_len = 1 << 20;
}
void LongContext(FakeWorkerOptions& o) { o.max_model_len = 1 << 20; }

// A Generate stream driven by the test.
class OpenStream {
 public:
  OpenStream(v1::Router::Stub& stub, const v1::GenerateRequest& req) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    reader_ = stub.Generate(&ctx_, req);
  }
  // Reads until `n` tokens arrived (or the stream ended).
  int ReadTokens(int n) {
    v1::GenerateResponse chunk;
    while (tokens_ < n && reader_->Read(&chunk)) {
      tokens_ += chunk.token_ids_size();
      if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) finish_ = chunk.finish_reason();
    }
    return tokens_;
  }
  grpc::Status Finish() {
    v1::GenerateResponse chunk;
    while (reader_->Read(&chunk)) {
      tokens_ += chunk.token_ids_size();
      if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) finish_ = chunk.finish_reason();
    }
    return reader_->Finish();
  }
  void Cancel() { ctx_.TryCancel(); }
  v1::FinishReason finish() const { return finish_; }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;
  int tokens_ = 0;
  v1::FinishReason finish_ = v1::FINISH_REASON_UNSPECIFIED;
};

bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout = kWait) {
  const absl::Time until = absl::Now() + timeout;
  while (!cond()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

TEST(RouterFaultTest, QueueFullIsResourceExhaustedBeforeAnyWorkerCall) {
  RouterOptions options = TestRouterOptions();
  options.max_queue = 2;
  RouterHarness h(options);
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL, LongContext);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE, SlowDecode);
  OpenStream a(h.stub(), MakeRequest({1, 2}, 100000, "a"));
  OpenStream b(h.stub(), MakeRequest({3, 4}, 100000, "b"));
  ASSERT_EQ(a.ReadTokens(1), 1);
  ASSERT_EQ(b.ReadTokens(1), 1);
  ASSERT_TRUE(WaitFor([&] { return d->open_streams() == 2; }));
  const int calls = p->total_calls() + d->total_calls();
  StreamResult r = h.Generate(MakeRequest({5}, 1));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << r.status.error_message();
  EXPECT_EQ(p->total_calls() + d->total_calls(), calls);
  // Router.Abort ends both with FINISH_REASON_ABORTED and OK; then there is room again.
  for (const char* id : {"a", "b"}) {
    grpc::ClientContext ctx;
    v1::AbortRequest req;
    req.set_request_id(id);
    v1::AbortResponse resp;
    ASSERT_TRUE(h.stub().Abort(&ctx, req, &resp).ok());
    EXPECT_TRUE(resp.found());
  }
  EXPECT_TRUE(a.Finish().ok());
  EXPECT_TRUE(b.Finish().ok());
  EXPECT_EQ(a.finish(), v1::FINISH_REASON_ABORTED);
  EXPECT_EQ(b.finish(), v1::FINISH_REASON_ABORTED);
  EXPECT_TRUE(p->WaitForAbort("a", kWait));
  EXPECT_TRUE(d->WaitForAbort("a", kWait));
  ASSERT_TRUE(WaitFor([&] { return h.server().requests().size() == 0; }));
  EXPECT_TRUE(h.Generate(MakeRequest({5}, 1)).status.ok());
}

TEST(RouterFaultTest, AbortOfAnUnknownRequestIsNotFound) {
  RouterHarness h;
  grpc::ClientContext ctx;
  v1::AbortRequest req;
  req.set_request_id("nobody");
  v1::AbortResponse resp;
  ASSERT_TRUE(h.stub().Abort(&ctx, req, &resp).ok());
  EXPECT_FALSE(resp.found());
}

TEST(RouterFaultTest, ClientCancelAbortsPrefillAndDecode) {
  RouterHarness h;
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL, LongContext);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE, SlowDecode);
  OpenStream s(h.stub(), MakeRequest({7, 8, 9}, 100000, "cancel-me"));
  ASSERT_EQ(s.ReadTokens(3), 3);
  s.Cancel();
  EXPECT_EQ(s.Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(p->WaitForAbort("cancel-me", kWait));
  EXPECT_TRUE(d->WaitForAbort("cancel-me", kWait));
  EXPECT_TRUE(WaitFor([&] { return d->open_streams() == 0; }));
  EXPECT_TRUE(WaitFor([&] { return h.server().requests().size() == 0; }));
  // Cancelling is not a worker failure.
  EXPECT_TRUE(h.WaitForHealth("d0", true));
  EXPECT_TRUE(h.Generate(MakeRequest({1}, 3)).status.ok());
}

TEST(RouterFaultTest, ClientCancelDuringPrefillAbortsPrefill) {
  RouterHarness h;
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL,
                              [](FakeWorkerOptions& o) { o.prefill_delay = absl::Seconds(60); });
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE);
  OpenStream s(h.stub(), MakeRequest({1, 2}, 10, "slow-prefill"));
  ASSERT_TRUE(WaitFor([&] { return p->counters().prefill == 1; }));
  s.Cancel();
  EXPECT_EQ(s.Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(p->WaitForAbort("slow-prefill", kWait));
  EXPECT_EQ(d->total_calls(), 0);
  EXPECT_TRUE(h.WaitForHealth("p0", true));
}

TEST(RouterFaultTest, DeadlineExceededAbortsWorkersWithoutBlamingThem) {
  RouterOptions options = TestRouterOptions();
  options.orchestrator.request_timeout = absl::Milliseconds(300);
  RouterHarness h(options);
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL, LongContext);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE, SlowDecode);
  StreamResult r = h.Generate(MakeRequest({1, 2}, 100000, "too-slow"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << r.status.error_message();
  EXPECT_FALSE(r.tokens.empty());
  EXPECT_TRUE(p->WaitForAbort("too-slow", kWait));
  EXPECT_TRUE(d->WaitForAbort("too-slow", kWait));
  for (const v1::WorkerEntry& w : h.Workers()) EXPECT_TRUE(w.healthy()) << w.info().worker_id();
}

TEST(RouterFaultTest, DecodeDyingMidStreamIsUnavailableAndMarksItUnhealthy) {
  RouterHarness h;
  h.AddWorker("p0", WORKER_ROLE_PREFILL, LongContext);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE, SlowDecode);
  OpenStream s(h.stub(), MakeRequest({1, 2, 3}, 100000));
  ASSERT_EQ(s.ReadTokens(4), 4);
  d->Kill();
  // The client deadline is 60 s: UNAVAILABLE (not DEADLINE_EXCEEDED) shows the router did not
  // wait for it.
  grpc::Status status = s.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("d0"), std::string::npos) << status.error_message();
  EXPECT_TRUE(h.WaitForHealth("d0", false));
  // With the only decode worker gone there is no route (after waiting half of the 1 s deadline
  // for d0 to come back from its failure backoff).
  EXPECT_EQ(h.Generate(MakeRequest({1}, 2), absl::Seconds(1)).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

// A decode worker restarted on its own address (a higher epoch) while the streams to its old
// incarnation are breaking: reported to crash the router (SIGSEGV in grpc_completion_queue_next
// or "ref_counted.h: prior > 0", issue 15). Every restart has streams in flight (asserted), they
// end UNAVAILABLE, and the router keeps serving. 10 restarts; TANDEM_LONG=1: 100.
TEST(RouterFaultTest, DecodeRestartedOnItsAddressUnderLoadLeavesTheRouterServing) {
  const int restarts = std::getenv("TANDEM_LONG") != nullptr ? 100 : 10;
  constexpr int kStreams = 4;
  RouterHarness h;
  h.AddWorker("p0", WORKER_ROLE_PREFILL, LongContext);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE, SlowDecode);
  const std::string address = d->address();
  for (int i = 0; i < restarts; ++i) {
    SCOPED_TRACE(testing::Message() << "restart " << i);
    std::vector<std::unique_ptr<OpenStream>> streams;
    for (int s = 0; s < kStreams; ++s) {
      streams.push_back(std::make_unique<OpenStream>(
          h.stub(), MakeRequest({1, 2, static_cast<uint32_t>(3 + s)}, 100000)));
    }
    for (auto& s : streams) ASSERT_GE(s->ReadTokens(2), 2) << "stream not in flight";
    ASSERT_EQ(d->open_streams(), kStreams);
    d->Kill();
    // Back at once on the same address with a new epoch, while the old calls are failing.
    d = h.AddWorker("d0", WORKER_ROLE_DECODE, [&](FakeWorkerOptions& o) {
      SlowDecode(o);
      o.listen = address;
      o.epoch = static_cast<uint64_t>(i) + 2;
    });
    ASSERT_NE(d, nullptr);
    for (auto& s : streams) {
      const grpc::Status status = s->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    }
    ASSERT_TRUE(h.WaitForHealth("d0", true));
    v1::GenerateRequest req = MakeRequest({7, 8, static_cast<uint32_t>(i)}, 4);
    StreamResult r = h.Generate(req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, FakeGenerate(req, 1000, {}).tokens);
  }
}

// One sequence that could produce that crash: the router's Abort to a worker still waits for its
// reply when the worker re-registers (new epoch, new address) and the request has ended, so the
// Abort's completion callback holds the last reference to the old worker's client and the gRPC
// channel is destroyed inside its own callback. The router must survive it.
TEST(RouterFaultTest, AbortReplyAfterTheWorkerReRegisteredDoesNotFreeItsClientInTheCallback) {
  RouterHarness h;
  h.AddWorker("p0", WORKER_ROLE_PREFILL, LongContext);
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(testing::Message() << "round " << i);
    FakeWorker* old_d = h.AddWorker("d0", WORKER_ROLE_DECODE, [&](FakeWorkerOptions& o) {
      SlowDecode(o);
      o.epoch = 10 * i + 1;
      o.abort_reply_delay = absl::Milliseconds(300);
    });
    {
      OpenStream s(h.stub(), MakeRequest({1, 2, 3}, 100000));
      ASSERT_GE(s.ReadTokens(2), 2);
      s.Cancel();  // the router aborts p0 and d0; d0 answers only after 300 ms
      EXPECT_EQ(s.Finish().error_code(), grpc::StatusCode::CANCELLED);
    }
    // Re-register under the same id elsewhere while that Abort waits for its reply.
    h.AddWorker("d0", WORKER_ROLE_DECODE, [&](FakeWorkerOptions& o) { o.epoch = 10 * i + 2; });
    absl::SleepFor(absl::Milliseconds(400));  // the reply arrives: the callback runs
    ASSERT_TRUE(WaitFor([&] { return old_d->counters().abort >= 1; }));
    v1::GenerateRequest req = MakeRequest({4, 5, static_cast<uint32_t>(i)}, 3);
    StreamResult r = h.Generate(req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, FakeGenerate(req, 1000, {}).tokens);
  }
}

TEST(RouterFaultTest, UnreachablePrefillIsRetriedOnAnother) {
  RouterHarness h;
  FakeWorker* p0 = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* p1 = h.AddWorker("p1", WORKER_ROLE_PREFILL);
  h.AddWorker("d0", WORKER_ROLE_DECODE);
  p1->SetLoad(Load(5, 0, 4096));  // p0 is preferred
  h.SyncHeartbeats();
  p0->Kill();  // dead, but its heartbeats were recent: still "healthy" to the router
  v1::GenerateRequest req = MakeRequest({11, 12}, 6);
  StreamResult r = h.Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGenerate(req, 1000, {}).tokens);
  EXPECT_EQ(p1->counters().prefill, 1);
  EXPECT_TRUE(h.WaitForHealth("p0", false));
}

TEST(RouterFaultTest, UnreachableDecodeIsRetriedWithTheSameHandle) {
  RouterHarness h;
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* d0 = h.AddWorker("d0", WORKER_ROLE_DECODE);
  FakeWorker* d1 = h.AddWorker("d1", WORKER_ROLE_DECODE);
  d0->SetLoad(Load(0, 0, 4000));
  d1->SetLoad(Load(0, 0, 10));
  h.SyncHeartbeats();
  d0->Kill();
  v1::GenerateRequest req = MakeRequest({21, 22, 23}, 9);
  StreamResult r = h.Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGenerate(req, 1000, {}).tokens);
  EXPECT_EQ(p->counters().prefill, 1);
  EXPECT_EQ(d1->counters().decode, 1);
  EXPECT_TRUE(h.WaitForHealth("d0", false));
}

TEST(RouterFaultTest, OnlyPrefillDeadIsUnavailable) {
  RouterOptions options = TestRouterOptions();
  options.orchestrator.max_attempts = 1;
  RouterHarness h(options);
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE);
  p->Kill();
  StreamResult r = h.Generate(MakeRequest({1, 2}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("p0"), std::string::npos);
  EXPECT_TRUE(r.chunks.empty());
  EXPECT_EQ(d->total_calls(), 0);
  EXPECT_TRUE(h.WaitForHealth("p0", false));
}

// The H5 fault probe's restart case: a worker killed while idle is still listed healthy (its
// last heartbeat is recent), so the next request's call to it fails (connection refused) and
// there is no other prefill worker. Before, that request was refused at once with "no healthy
// worker" although the restarted worker registered on the same address a moment later; now it
// waits (bounded) for a worker in its failure backoff and is served by the new incarnation.
TEST(RouterFaultTest, ARequestRightAfterAWorkerRestartWaitsForItsNewIncarnation) {
  RouterHarness h;
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  h.AddWorker("d0", WORKER_ROLE_DECODE);
  const std::string address = p->address();
  p->Kill();
  FakeWorker* back = nullptr;
  std::thread restart([&] {
    absl::SleepFor(absl::Milliseconds(300));  // the new process loads, then registers
    back = h.AddWorker("p0", WORKER_ROLE_PREFILL, [&](FakeWorkerOptions& o) {
      o.listen = address;
      o.epoch = 2;
    });
  });
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  v1::GenerateRequest req = MakeRequest(RandomPrompt(rng, 8, 1000), 4);
  StreamResult r = h.Generate(req);
  restart.join();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGenerate(req, 1000, {}).tokens);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->counters().prefill, 1);
}

// The wait is bounded: a prefill worker that never comes back fails the request UNAVAILABLE
// after half of the time left to its deadline (not DEADLINE_EXCEEDED), and once the worker timed
// out (silent) nothing waits for it: the refusal is immediate again.
TEST(RouterFaultTest, WaitingForAWorkerInBackoffEndsWithinHalfTheDeadline) {
  RouterOptions options = TestRouterOptions();
  options.registry.worker_timeout = absl::Milliseconds(800);
  RouterHarness h(options);
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  h.AddWorker("d0", WORKER_ROLE_DECODE);
  p->Kill();
  const absl::Time killed = absl::Now();
  StreamResult r = h.Generate(MakeRequest({1, 2}, 3), absl::Seconds(1));
  const absl::Duration waited = absl::Now() - killed;
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("no healthy worker"), std::string::npos)
      << r.status.error_message();
  EXPECT_GE(waited, absl::Milliseconds(400));
  EXPECT_LT(waited, absl::Milliseconds(950));
  absl::SleepFor(killed + absl::Seconds(1) - absl::Now());  // p0 silent for > 800 ms
  const absl::Time t0 = absl::Now();
  r = h.Generate(MakeRequest({1, 2}, 3), absl::Seconds(10));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(500));
}

// D's port goes away and comes back `away` later at the same address with the same epoch (the
// router keeps its entry and its channel, as after a drop) while a request is between P's first
// token and D: it must be served, every token once and in order, decoded on D from the same KV
// handle.
void ExpectDecodeWorkerWaitedFor(const RouterOptions& options, absl::Duration away) {
  RouterHarness h(options);
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE);
  const std::string address = d->address();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  v1::GenerateRequest warm = MakeRequest(RandomPrompt(rng, 8, 1000), 3);
  ASSERT_TRUE(h.Generate(warm).status.ok());  // the router's channel to d0 is up
  d->Kill();
  FakeWorker* back = nullptr;
  std::thread relink([&] {
    absl::SleepFor(away);
    back = h.AddWorker("d0", WORKER_ROLE_DECODE, [&](FakeWorkerOptions& o) { o.listen = address; });
  });
  v1::GenerateRequest req = MakeRequest(RandomPrompt(rng, 8, 1000), 6);
  StreamResult r = h.Generate(req);
  relink.join();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGenerate(req, 1000, {}).tokens);
  EXPECT_EQ(p->counters().prefill, 2);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->counters().decode, 1);
}

// The H5 fault probe's network-drop rows: right after D's link came back, the router's channel
// to it was still reconnecting, so the decode call failed at once ("failed to connect") after P
// had sent the first token, and with no other decode worker the request failed. The decode now
// waits for D's connection and decodes there.
TEST(RouterFaultTest, ADecodeWorkerWhoseLinkComesBackIsWaitedFor) {
  RouterOptions options = TestRouterOptions();
  options.orchestrator.decode_wait = absl::Seconds(4);  // gRPC reconnects within ~1.2 s
  ExpectDecodeWorkerWaitedFor(options, absl::Milliseconds(300));
}

// The same with the default waits and D's link back only after 2.5 s: past the routing wait
// (--route_wait_ms, 2 s), which the decode wait used to share, so the request failed after P's
// first token. The decode wait has its own budget (--decode_wait_ms, 20 s).
TEST(RouterFaultTest, ADecodeWorkerWhoseLinkComesBackAfterTheRouteWaitIsWaitedFor) {
  ExpectDecodeWorkerWaitedFor(TestRouterOptions(), absl::Milliseconds(2500));
}

// A decode worker that does not come back within the wait: the request fails UNAVAILABLE after
// P's first token, within the wait's bound.
TEST(RouterFaultTest, ADecodeWorkerThatStaysAwayFailsTheRequestAfterTheWait) {
  RouterOptions options = TestRouterOptions();
  options.orchestrator.decode_wait = absl::Milliseconds(600);
  RouterHarness h(options);
  h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE);
  d->Kill();
  const absl::Time t0 = absl::Now();
  StreamResult r = h.Generate(MakeRequest({5, 6, 7}, 6));
  const absl::Duration took = absl::Now() - t0;
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 1u);  // P's first token, never repeated
  EXPECT_GE(took, absl::Milliseconds(500));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST(RouterFaultTest, SilentWorkerIsSkippedAndReadmittedWhenItHeartbeatsAgain) {
  RouterOptions options = TestRouterOptions();
  options.registry.worker_timeout = absl::Milliseconds(400);
  RouterHarness h(options);
  FakeWorker* p0 = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* p1 = h.AddWorker("p1", WORKER_ROLE_PREFILL);
  h.AddWorker("d0", WORKER_ROLE_DECODE);
  p1->SetLoad(Load(5, 0, 4096));  // p0 is preferred while healthy
  h.SyncHeartbeats();
  p0->SetHeartbeatsPaused(true);
  ASSERT_TRUE(h.WaitForHealth("p0", false));
  ASSERT_TRUE(h.Generate(MakeRequest({1, 2}, 3)).status.ok());
  EXPECT_EQ(p0->counters().prefill, 0);
  EXPECT_EQ(p1->counters().prefill, 1);
  p0->SetHeartbeatsPaused(false);
  ASSERT_TRUE(h.WaitForHealth("p0", true));
  ASSERT_TRUE(h.Generate(MakeRequest({1, 2}, 3)).status.ok());
  EXPECT_EQ(p0->counters().prefill, 1);
}

TEST(RouterFaultTest, HungDecodeWorkerIsCutOffByTheHeartbeatTimeout) {
  // The worker process is alive (its stream stays open) but stops heartbeating: the router
  // cancels the requests on it rather than waiting for the client deadline.
  RouterOptions options = TestRouterOptions();
  options.registry.worker_timeout = absl::Milliseconds(400);
  RouterHarness h(options);
  h.AddWorker("p0", WORKER_ROLE_PREFILL, LongContext);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE, [](FakeWorkerOptions& o) {
    o.token_delay = absl::Seconds(5);
    o.max_model_len = 1 << 20;
  });
  OpenStream s(h.stub(), MakeRequest({1, 2}, 1000, "hung"));
  ASSERT_EQ(s.ReadTokens(1), 1);
  ASSERT_TRUE(WaitFor([&] { return d->open_streams() == 1; }));
  d->SetHeartbeatsPaused(true);
  grpc::Status status = s.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("heartbeat"), std::string::npos) << status.error_message();
  EXPECT_TRUE(d->WaitForAbort("hung", kWait));
}

TEST(RouterFaultTest, ShutdownEndsInFlightRequestsWithUnavailable) {
  RouterHarness h;
  h.AddWorker("p0", WORKER_ROLE_PREFILL, LongContext);
  h.AddWorker("d0", WORKER_ROLE_DECODE, SlowDecode);
  OpenStream s(h.stub(), MakeRequest({1, 2}, 100000));
  ASSERT_EQ(s.ReadTokens(2), 2);
  std::thread stopper([&] { h.server().Shutdown(absl::Milliseconds(50)); });
  grpc::Status status = s.Finish();
  stopper.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

}  // namespace
}  // namespace tandem::router
