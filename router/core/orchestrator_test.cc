// The orchestrator over FakeWorkerClients, no network: the test releases each worker reply
// itself, so the interleavings that are races over gRPC (a reply held while the client
// cancels, a reply released after the worker was declared dead) happen exactly. Requests run
// asynchronously on the orchestrator's own threads; the sink records their chunks and end. Over
// real gRPC servers: router_fault_test, router_stream_test.
#include "router/core/orchestrator.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "router/testing/fake_worker_client.h"
#include "router/testing/manual_clock.h"

namespace tandem::router {
namespace {

class TestCaller final : public CallerContext {
 public:
  bool Cancelled() const override {
    if (cancelled) return true;
    // Armed: says so only from its third question on, as a server context that learns of the
    // client's cancel a moment after the worker call it cut.
    return armed && asked.fetch_add(1) >= 2;
  }
  absl::Time deadline() const override { return absl::InfiniteFuture(); }
  std::atomic<bool> cancelled{false};
  std::atomic<bool> armed{false};
  mutable std::atomic<int> asked{0};
};

int64_t ProcessThreads() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

class CollectingSink final : public ResponseSink {
 public:
  bool Send(const v1::GenerateResponse& chunk) override {
    absl::MutexLock lock(&mu_);
    chunks_.push_back(chunk);
    return true;
  }
  void Finish(const absl::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      status_ = status;
    }
    done_.Notify();
  }
  // The request's final status; fails the test when it did not end in time.
  absl::Status Wait() {
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(absl::Seconds(20))) << "request hung";
    absl::MutexLock lock(&mu_);
    return status_;
  }
  v1::GenerateResponse last() {
    absl::MutexLock lock(&mu_);
    return chunks_.empty() ? v1::GenerateResponse() : chunks_.back();
  }
  std::vector<uint32_t> tokens() {
    absl::MutexLock lock(&mu_);
    std::vector<uint32_t> out;
    for (const auto& c : chunks_) out.insert(out.end(), c.token_ids().begin(), c.token_ids().end());
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::GenerateResponse> chunks_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Notification done_;
};

v1::WorkerInfo Info(const std::string& id, v1::WorkerRole role) {
  v1::WorkerInfo info;
  info.set_worker_id(id);
  info.set_address(id + ":1");
  info.set_role(role);
  info.set_epoch(1);
  info.set_model_id("m");
  info.set_vocab_size(1000);
  info.set_max_model_len(4096);
  info.set_block_size(16);
  info.set_kv_layout_hash(7);
  return info;
}

v1::PrefillResponse Prefilled(const std::string& id, uint32_t first) {
  v1::PrefillResponse r;
  r.set_request_id(id);
  r.set_first_token(first);
  r.mutable_kv_handle()->set_worker_id("p0");
  r.mutable_kv_handle()->set_lease_id(42);
  return r;
}

// A registry whose workers are FakeWorkerClients (one per address), an orchestrator over it,
// and one request running on it.
struct Harness {
  Harness()
      : registry(
            RegistryOptions(), [this] { return clock.Now(); },
            [this](const std::string& address) {
              absl::MutexLock lock(&mu);
              auto& client = clients[address];
              if (client == nullptr) client = std::make_shared<FakeWorkerClient>();
              return client;
            }),
        requests(512),
        orchestrator(&registry, OrchestratorOptions()) {
    EXPECT_TRUE(registry.Register(Info("p0", v1::WORKER_ROLE_PREFILL), {}).ok());
    EXPECT_TRUE(registry.Register(Info("d0", v1::WORKER_ROLE_DECODE), {}).ok());
  }
  FakeWorkerClient& client(const std::string& worker) {
    absl::MutexLock lock(&mu);
    return *clients.at(worker + ":1");
  }
  void Start(const std::string& id, uint32_t max_tokens,
             std::shared_ptr<CollectingSink> into = nullptr) {
    v1::GenerateRequest request;
    request.set_request_id(id);
    for (uint32_t t : {5u, 6u, 7u}) request.add_prompt_token_ids(t);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    absl::StatusOr<Admission> admitted = requests.Admit(id);
    ASSERT_TRUE(admitted.ok());
    orchestrator.Start(request, *std::move(admitted), &caller, into != nullptr ? into : sink);
  }
  // Starts request `id` (its prompt, `max_tokens`), releases p0's prefill reply (first token 11)
  // and returns d0's decode call: -1, with a test failure, where either call never came.
  int StartThroughPrefill(const std::string& id, uint32_t max_tokens) {
    Start(id, max_tokens);
    const int prefill = client("p0").WaitForCall(FakeWorkerClient::kPrefill);
    EXPECT_GE(prefill, 0);
    if (prefill < 0) return -1;
    client("p0").ReplyPrefill(prefill, Prefilled(id, 11));
    const int decode = client("d0").WaitForCall(FakeWorkerClient::kDecode);
    EXPECT_GE(decode, 0);
    return decode;
  }
  // Answers p0's `prefill` of request `id` (first token 11), then d0 decodes 12 and the length
  // ends it: the request ends OK with both tokens.
  void ServeFromPrefill(int prefill, const std::string& id) {
    client("p0").ReplyPrefill(prefill, Prefilled(id, 11));
    const int decode = client("d0").WaitForCall(FakeWorkerClient::kDecode);
    ASSERT_GE(decode, 0);
    v1::GenerateResponse rest;
    rest.add_token_ids(12);
    rest.set_finish_reason(v1::FINISH_REASON_LENGTH);
    client("d0").Push(decode, rest);
    client("d0").End(decode, absl::OkStatus());
    const absl::Status s = Result();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(sink->tokens(), (std::vector<uint32_t>{11, 12}));
  }
  absl::Status Result() { return sink->Wait(); }
  bool Healthy(const std::string& id) {
    const v1::ListWorkersResponse list = registry.List();
    for (const auto& w : list.workers()) {
      if (w.info().worker_id() == id) return w.healthy();
    }
    return false;
  }

  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::shared_ptr<FakeWorkerClient>> clients ABSL_GUARDED_BY(mu);
  ManualClock clock;
  TestCaller caller;  // outlives the orchestrator (and every request it runs)
  std::shared_ptr<CollectingSink> sink = std::make_shared<CollectingSink>();
  WorkerRegistry registry;
  RequestTable requests;
  Orchestrator orchestrator;
};

TEST(OrchestratorTest, DecodeReplyHeldWhileTheClientCancels) {
  Harness h;
  const int decode = h.StartThroughPrefill("r1", 50);
  ASSERT_GE(decode, 0);
  v1::GenerateResponse second;
  second.add_token_ids(12);
  h.client("d0").Push(decode, second);
  for (int i = 0; i < 10000 && h.sink->tokens().size() < 2; ++i)
    absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(h.sink->tokens().size(), 2u) << "the second token reached the client";
  // D holds its next reply; the client goes away meanwhile.
  h.caller.cancelled = true;
  const absl::Status s = h.Result();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_TRUE(h.client("d0").cancelled(decode));
  EXPECT_EQ(h.sink->tokens(), (std::vector<uint32_t>{11, 12}));
  // Both workers are told to drop the request (P's lease, D's stream); neither is blamed.
  EXPECT_EQ(h.client("d0").aborts(), std::vector<std::string>{"r1"});
  EXPECT_EQ(h.client("p0").aborts(), std::vector<std::string>{"r1"});
  EXPECT_TRUE(h.Healthy("p0"));
  EXPECT_TRUE(h.Healthy("d0"));
  // A late reply from D changes nothing.
  h.client("d0").End(decode, absl::OkStatus());
}

TEST(OrchestratorTest, PrefillReplyReleasedAfterTheWorkerIsMarkedDead) {
  Harness h;
  h.Start("r2", 50);
  const int prefill = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(prefill, 0);
  // P stops heartbeating: the registry times it out and the router cancels its requests (what
  // RouterServer's health loop does).
  h.clock.Advance(absl::Seconds(6));
  const std::vector<std::string> lost = h.registry.CheckTimeouts();
  EXPECT_NE(std::find(lost.begin(), lost.end(), "p0"), lost.end());
  EXPECT_FALSE(h.Healthy("p0"));
  EXPECT_EQ(h.requests.CancelUsingWorker("p0", absl::UnavailableError("p0 stopped heartbeating")),
            1);
  // Its reply arrives afterwards: too late, the request already ended.
  h.client("p0").ReplyPrefill(prefill, Prefilled("r2", 11));
  const absl::Status s = h.Result();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("p0"), std::string::npos) << s;
  EXPECT_TRUE(h.sink->tokens().empty()) << "no token from a worker declared dead";
  EXPECT_EQ(h.client("d0").WaitForCall(FakeWorkerClient::kDecode, absl::Milliseconds(50)), -1);
  EXPECT_EQ(h.client("p0").aborts(), std::vector<std::string>{"r2"});  // its lease, if any
}

TEST(OrchestratorTest, ClientOutlivesTheRegistryEntryOfARestartedWorker) {
  Harness h;
  const int decode = h.StartThroughPrefill("r3", 50);
  ASSERT_GE(decode, 0);
  // D restarts on a new address while its old incarnation's stream is open: the registry entry
  // (and its client) is replaced; the call keeps the old client alive until it ends.
  v1::WorkerInfo restarted = Info("d0", v1::WORKER_ROLE_DECODE);
  restarted.set_epoch(2);
  restarted.set_address("d0-new:1");
  ASSERT_TRUE(h.registry.Register(restarted, {}).ok());
  h.client("d0").End(decode, absl::UnavailableError("connection reset"));
  const absl::Status s = h.Result();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(h.Healthy("d0")) << "the new incarnation is not blamed for the old one";
}

// A rolling restart under load: the decode worker chosen at routing time starts draining while
// the prefill runs, and the one that was away then is back. The retry routes with the registry
// of now (a stale snapshot had no other decode worker: the request failed).
TEST(OrchestratorTest, DecodeRetryUsesTheWorkersOfNowNotOfRoutingTime) {
  Harness h;
  h.Start("r4", 3);
  const int prefill = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(prefill, 0);
  ASSERT_TRUE(h.registry.Register(Info("d1", v1::WORKER_ROLE_DECODE), {}).ok());  // back
  h.client("p0").ReplyPrefill(prefill, Prefilled("r4", 11));
  const int refused = h.client("d0").WaitForCall(FakeWorkerClient::kDecode);
  ASSERT_GE(refused, 0);
  h.client("d0").End(refused, absl::UnavailableError("worker d0 is draining"));
  const int decode = h.client("d1").WaitForCall(FakeWorkerClient::kDecode);
  ASSERT_GE(decode, 0) << "retried on the decode worker registered after routing";
  // P bound the lease to d0 (the decode worker routing picked); the retry moved it to d1 first.
  EXPECT_EQ(h.client("p0").decode_worker_id(prefill), "d0");
  const std::vector<v1::ReassignLeaseRequest> moved = h.client("p0").reassigns();
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].request_id(), "r4");
  EXPECT_EQ(moved[0].lease_id(), 42u);
  EXPECT_EQ(moved[0].decode_worker_id(), "d1");
  v1::GenerateResponse rest;
  rest.add_token_ids(12);
  rest.add_token_ids(13);
  rest.set_finish_reason(v1::FINISH_REASON_LENGTH);
  h.client("d1").Push(decode, rest);
  h.client("d1").End(decode, absl::OkStatus());
  const absl::Status s = h.Result();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(h.sink->tokens(), (std::vector<uint32_t>{11, 12, 13}));
}

// A prefill worker whose call failed while its link was down (its channel reconnecting), with no
// other prefill worker: the waiting request re-admits it as soon as its connection is up again,
// without waiting out its backoff (1 s of the registry's clock, never advanced here), and is
// served. Before, it waited for the heartbeat after the backoff (here: never; for real: up to
// route_wait, then "no healthy worker").
TEST(OrchestratorTest, AWorkerWhoseLinkIsBackIsReadmittedForAWaitingRequest) {
  Harness h;
  h.Start("r11", 2);
  const int refused = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(refused, 0);
  h.client("p0").SetConnected(false);
  h.client("p0").ReplyPrefill(refused, absl::UnavailableError("failed to connect"));
  absl::SleepFor(absl::Milliseconds(200));  // waiting, calling no one
  EXPECT_FALSE(h.Healthy("p0"));
  EXPECT_LT(h.client("p0").WaitForCall(FakeWorkerClient::kPrefill, absl::ZeroDuration()), 0);
  h.client("p0").SetConnected(true);
  const int prefill = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(prefill, 0) << "routed to p0 once its link was back";
  EXPECT_TRUE(h.Healthy("p0"));
  h.ServeFromPrefill(prefill, "r11");
}

// A decode worker whose call failed before a token of its own while its link is down (gRPC fails
// every call at once while the channel reconnects), with no other decode worker: the request
// waits for its connection and decodes there from the same KV handle (no lease to move, P's
// first token not sent again). Before, it failed UNAVAILABLE after the first token.
TEST(OrchestratorTest, ADecodeWorkerWhoseLinkIsDownIsWaitedFor) {
  Harness h;
  const int failed = h.StartThroughPrefill("r9", 3);
  ASSERT_GE(failed, 0);
  h.client("d0").SetConnected(false);
  h.client("d0").End(failed, absl::UnavailableError("failed to connect to all addresses"));
  absl::SleepFor(absl::Milliseconds(200));  // waiting, calling no one
  EXPECT_LT(h.client("d0").WaitForCall(FakeWorkerClient::kDecode, absl::ZeroDuration()), 0);
  h.client("d0").SetConnected(true);
  const int decode = h.client("d0").WaitForCall(FakeWorkerClient::kDecode);
  ASSERT_GE(decode, 0) << "decoded again on d0 once its link was back";
  v1::GenerateResponse rest;
  rest.add_token_ids(12);
  rest.add_token_ids(13);
  rest.set_finish_reason(v1::FINISH_REASON_LENGTH);
  EXPECT_FALSE(h.Healthy("d0"));  // in its backoff (1 s of the registry's clock, never advanced)
  h.client("d0").Push(decode, rest);
  h.client("d0").End(decode, absl::OkStatus());
  const absl::Status s = h.Result();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(h.sink->tokens(), (std::vector<uint32_t>{11, 12, 13}));
  EXPECT_TRUE(h.client("p0").reassigns().empty());
  EXPECT_TRUE(h.Healthy("d0")) << "its answer re-admitted it: the next request need not wait";
}

// One whose link is up (the worker itself failed the call) is not waited for: UNAVAILABLE at
// once, as before.
TEST(OrchestratorTest, ADecodeWorkerWhoseLinkIsUpIsNotWaitedFor) {
  Harness h;
  const int failed = h.StartThroughPrefill("r10", 3);
  ASSERT_GE(failed, 0);
  const absl::Time t0 = absl::Now();
  h.client("d0").End(failed, absl::UnknownError("the handler crashed"));
  const absl::Status s = h.Result();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  EXPECT_EQ(h.sink->tokens(), (std::vector<uint32_t>{11}));
  EXPECT_LT(h.client("d0").WaitForCall(FakeWorkerClient::kDecode, absl::ZeroDuration()), 0);
}

// The H5 fault probe's network drop: a worker's first call after its link came back fails (its
// channel still reconnecting) and the worker sits out its failure backoff. A request with no
// other prefill worker waits for it (OrchestratorOptions::route_wait) instead of being refused
// "no healthy worker"; the heartbeat after the backoff re-admits it and the request is served.
TEST(OrchestratorTest, ARequestWaitsForTheOnlyPrefillWorkerToLeaveItsBackoff) {
  Harness h;
  h.Start("r8", 2);
  const int refused = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(refused, 0);
  h.client("p0").ReplyPrefill(refused, absl::UnavailableError("failed to connect"));
  // p0 is out for its backoff (1 s of the registry's clock); the request waits, calling no one.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(h.Healthy("p0"));
  EXPECT_LT(h.client("p0").WaitForCall(FakeWorkerClient::kPrefill, absl::ZeroDuration()), 0);
  h.clock.Advance(absl::Seconds(1));
  v1::HeartbeatRequest beat;
  beat.set_worker_id("p0");
  beat.set_epoch(1);
  beat.set_status(v1::SERVING_STATUS_SERVING);
  ASSERT_TRUE(h.registry.Heartbeat(beat, {}).ok());
  ASSERT_TRUE(h.Healthy("p0"));
  const int prefill = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(prefill, 0) << "routed again to the re-admitted worker";
  h.ServeFromPrefill(prefill, "r8");
}

// The point of the asynchronous orchestrator: requests waiting for their workers are state
// machines, not threads. 200 prefills held open at once on an orchestrator of 2 threads add no
// thread to the process; released, every request finishes.
TEST(OrchestratorTest, RequestsWaitingForWorkersHoldNoThread) {
  Harness h;
  constexpr int kRequests = 200;
  const int64_t threads_before = ProcessThreads();
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < kRequests; ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    h.Start(absl::StrCat("many-", i), 1, sinks.back());
  }
  std::vector<int> calls;
  for (int i = 0; i < kRequests; ++i) {
    calls.push_back(h.client("p0").WaitForCall(FakeWorkerClient::kPrefill));
    ASSERT_GE(calls.back(), 0) << "request " << i << " did not reach its prefill";
  }
  EXPECT_EQ(h.orchestrator.executor().threads(), 2);
  EXPECT_LE(ProcessThreads(), threads_before) << "a thread per request in flight";
  EXPECT_EQ(h.requests.size(), static_cast<size_t>(kRequests));
  for (int call : calls) {
    v1::PrefillResponse done = Prefilled(h.client("p0").request(call).request_id(), 11);
    done.set_finish_reason(v1::FINISH_REASON_LENGTH);  // max_tokens 1: the first token ends it
    h.client("p0").ReplyPrefill(call, done);
  }
  for (auto& sink : sinks) {
    const absl::Status s = sink->Wait();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(sink->tokens(), std::vector<uint32_t>{11});
  }
  EXPECT_EQ(h.requests.size(), 0u) << "every admission released before its end was reported";
}

// Router.Abort while P holds the request: the stream ends FINISH_REASON_ABORTED with OK, and P
// (the only worker that saw it) is told to drop it.
TEST(OrchestratorTest, RouterAbortDuringPrefillEndsTheStreamAborted) {
  Harness h;
  h.Start("r5", 50);
  const int prefill = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(prefill, 0);
  EXPECT_TRUE(h.requests.Cancel("r5", absl::AbortedError("request r5 aborted")));
  const absl::Status s = h.Result();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(h.client("p0").cancelled(prefill));
  EXPECT_EQ(h.sink->last().finish_reason(), v1::FINISH_REASON_ABORTED);
  EXPECT_EQ(h.client("p0").aborts(), std::vector<std::string>{"r5"});
  EXPECT_TRUE(h.client("d0").aborts().empty());
  EXPECT_TRUE(h.Healthy("p0"));
}

// A worker stream that ends CANCELLED although nobody cancelled it (a worker shutting down its
// streams) is the worker's fault; one the client cut is not, even when the client's cancel shows
// only a moment later (the orchestrator looks again on a timer, without a thread sleeping).
TEST(OrchestratorTest, CancelledStreamsAreTheWorkersFaultUnlessTheClientCancelled) {
  for (const bool client_cancelled : {false, true}) {
    SCOPED_TRACE(client_cancelled ? "the client cancelled" : "nobody cancelled");
    Harness h;
    const int decode = h.StartThroughPrefill("r6", 50);
    ASSERT_GE(decode, 0);
    h.caller.armed = client_cancelled;
    h.client("d0").End(decode, absl::CancelledError("stream cancelled"));
    const absl::Status s = h.Result();
    EXPECT_EQ(s.code(),
              client_cancelled ? absl::StatusCode::kCancelled : absl::StatusCode::kUnavailable)
        << s;
    EXPECT_EQ(h.Healthy("d0"), client_cancelled);
    EXPECT_EQ(h.client("d0").aborts(), std::vector<std::string>{"r6"});
  }
}

// The shape check runs in the orchestrator, for every entry (the HTTP API calls Start directly,
// the gRPC service too): a request over a wire limit ends INVALID_ARGUMENT naming the field, and
// no worker is called; a request at the limits is served.
TEST(OrchestratorTest, EveryEntryGetsTheShapeCheckBeforeAnyWorker) {
  Harness h;
  struct Case {
    const char* field;
    std::function<void(v1::GenerateRequest&)> spoil;
  };
  const Case cases[] = {
      {"cache_salt", [](v1::GenerateRequest& r) { r.set_cache_salt(std::string(129, 'u')); }},
      {"stop_token_ids",
       [](v1::GenerateRequest& r) {
         for (int i = 0; i < 65; ++i) r.mutable_sampling()->add_stop_token_ids(i);
       }},
      {"temperature", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1); }},
      {"top_p", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); }},
      {"max_tokens", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(0); }},
      {"prompt_token_ids", [](v1::GenerateRequest& r) { r.clear_prompt_token_ids(); }},
  };
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    v1::GenerateRequest request;
    const std::string id = absl::StrCat("bad-", n++);
    request.set_request_id(id);
    for (uint32_t t : {5u, 6u, 7u}) request.add_prompt_token_ids(t);
    request.mutable_sampling()->set_max_tokens(4);
    c.spoil(request);
    absl::StatusOr<Admission> admitted = h.requests.Admit(id);
    ASSERT_TRUE(admitted.ok());
    auto sink = std::make_shared<CollectingSink>();
    h.orchestrator.Start(request, *std::move(admitted), &h.caller, sink);
    const absl::Status s = sink->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s;
  }
  EXPECT_EQ(h.client("p0").WaitForCall(FakeWorkerClient::kPrefill, absl::Milliseconds(100)), -1)
      << "a malformed request reached the prefill worker";
  EXPECT_EQ(h.requests.size(), 0u) << "admissions released";
  // At the limits (a 128-byte salt, 64 stop ids): served as usual.
  v1::GenerateRequest ok;
  ok.set_request_id("edge");
  for (uint32_t t : {5u, 6u, 7u}) ok.add_prompt_token_ids(t);
  ok.mutable_sampling()->set_max_tokens(1);
  ok.set_cache_salt(std::string(128, 'u'));
  for (int i = 0; i < 64; ++i) ok.mutable_sampling()->add_stop_token_ids(900 + i % 10);
  absl::StatusOr<Admission> admitted = h.requests.Admit("edge");
  ASSERT_TRUE(admitted.ok());
  h.orchestrator.Start(ok, *std::move(admitted), &h.caller, h.sink);
  const int call = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(call, 0);
  EXPECT_EQ(h.client("p0").request(call).cache_salt(), std::string(128, 'u'));
  v1::PrefillResponse first = Prefilled("edge", 9);
  first.set_finish_reason(v1::FINISH_REASON_LENGTH);
  first.clear_kv_handle();
  h.client("p0").ReplyPrefill(call, first);
  EXPECT_TRUE(h.Result().ok());
}

}  // namespace
}  // namespace tandem::router
