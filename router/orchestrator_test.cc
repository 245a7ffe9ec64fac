// The orchestrator over FakeWorkerClients, no network: the test releases each worker reply
// itself, so the interleavings that are races over gRPC (a reply held while the client
// cancels, a reply released after the worker was declared dead) happen exactly. Over real gRPC
// servers: router_fault_test, router_stream_test.
#include "router/orchestrator.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "router/fake_worker_client.h"
#include "router/manual_clock.h"

namespace tandem::router {
namespace {

class TestCaller final : public CallerContext {
 public:
  bool Cancelled() const override { return cancelled; }
  absl::Time deadline() const override { return absl::InfiniteFuture(); }
  std::atomic<bool> cancelled{false};
};

class CollectingSink final : public ResponseSink {
 public:
  bool Send(const v1::GenerateResponse& chunk) override {
    absl::MutexLock lock(&mu_);
    chunks_.push_back(chunk);
    return true;
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

// A registry whose workers are FakeWorkerClients (one per address), an orchestrator over it,
// and one request running on its own thread.
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
        requests(16),
        orchestrator(&registry, OrchestratorOptions()) {
    EXPECT_TRUE(registry.Register(Info("p0", v1::WORKER_ROLE_PREFILL)).ok());
    EXPECT_TRUE(registry.Register(Info("d0", v1::WORKER_ROLE_DECODE)).ok());
  }
  ~Harness() {
    if (thread.joinable()) thread.join();
  }
  FakeWorkerClient& client(const std::string& worker) {
    absl::MutexLock lock(&mu);
    return *clients.at(worker + ":1");
  }
  void Start(const std::string& id, uint32_t max_tokens) {
    v1::GenerateRequest request;
    request.set_request_id(id);
    for (uint32_t t : {5u, 6u, 7u}) request.add_prompt_token_ids(t);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    absl::StatusOr<Admission> admitted = requests.Admit(id);
    ASSERT_TRUE(admitted.ok());
    admission = std::make_unique<Admission>(*std::move(admitted));
    thread = std::thread([this, request] {
      result = orchestrator.Generate(request, admission->request(), &caller, sink);
      done.Notify();
    });
  }
  absl::Status Result() {
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20))) << "request hung";
    thread.join();
    return result;
  }
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
  WorkerRegistry registry;
  RequestTable requests;
  Orchestrator orchestrator;
  TestCaller caller;
  CollectingSink sink;
  std::unique_ptr<Admission> admission;
  std::thread thread;
  absl::Notification done;
  absl::Status result;
};

v1::PrefillResponse Prefilled(const std::string& id, uint32_t first) {
  v1::PrefillResponse r;
  r.set_request_id(id);
  r.set_first_token(first);
  r.mutable_kv_handle()->set_worker_id("p0");
  r.mutable_kv_handle()->set_lease_id(42);
  return r;
}

TEST(OrchestratorTest, DecodeReplyHeldWhileTheClientCancels) {
  Harness h;
  h.Start("r1", 50);
  const int prefill = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(prefill, 0);
  h.client("p0").ReplyPrefill(prefill, Prefilled("r1", 11));
  const int decode = h.client("d0").WaitForCall(FakeWorkerClient::kDecode);
  ASSERT_GE(decode, 0);
  v1::GenerateResponse second;
  second.add_token_ids(12);
  h.client("d0").Push(decode, second);
  for (int i = 0; i < 10000 && h.sink.tokens().size() < 2; ++i)
    absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(h.sink.tokens().size(), 2u) << "the second token reached the client";
  // D holds its next reply; the client goes away meanwhile.
  h.caller.cancelled = true;
  const absl::Status s = h.Result();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_TRUE(h.client("d0").cancelled(decode));
  EXPECT_EQ(h.sink.tokens(), (std::vector<uint32_t>{11, 12}));
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
  EXPECT_TRUE(h.sink.tokens().empty()) << "no token from a worker declared dead";
  EXPECT_EQ(h.client("d0").WaitForCall(FakeWorkerClient::kDecode, absl::Milliseconds(50)), -1);
  EXPECT_EQ(h.client("p0").aborts(), std::vector<std::string>{"r2"});  // its lease, if any
}

TEST(OrchestratorTest, ClientOutlivesTheRegistryEntryOfARestartedWorker) {
  Harness h;
  h.Start("r3", 50);
  const int prefill = h.client("p0").WaitForCall(FakeWorkerClient::kPrefill);
  ASSERT_GE(prefill, 0);
  h.client("p0").ReplyPrefill(prefill, Prefilled("r3", 11));
  const int decode = h.client("d0").WaitForCall(FakeWorkerClient::kDecode);
  ASSERT_GE(decode, 0);
  // D restarts on a new address while its old incarnation's stream is open: the registry entry
  // (and its client) is replaced; the call keeps the old client alive until it ends.
  v1::WorkerInfo restarted = Info("d0", v1::WORKER_ROLE_DECODE);
  restarted.set_epoch(2);
  restarted.set_address("d0-new:1");
  ASSERT_TRUE(h.registry.Register(restarted).ok());
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
  ASSERT_TRUE(h.registry.Register(Info("d1", v1::WORKER_ROLE_DECODE)).ok());  // back
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
  EXPECT_EQ(h.sink.tokens(), (std::vector<uint32_t>{11, 12, 13}));
}

}  // namespace
}  // namespace tandem::router
