// WorkerDaemon::Create from a WorkerConfig, as tandem_worker's main uses it: a whole worker
// (dummy tiny model, UCX agent on loopback, gRPC server) in this process, served and drained;
// bad configurations are refused with the flag's problem named.
#include "runtime/worker/worker_daemon.h"

#include <atomic>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/http/test_client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvtransfer/transfer_agent.h"
#include "runtime/worker/transfer_agent_factory.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::runtime {
namespace {

// GET `path` from 127.0.0.1:port: "HTTP/1.1 <status>" + the body.
std::string HttpGet(int port, const std::string& path) {
  const http::TestResponse r = http::HttpCall(port, "GET", path);
  return absl::StrCat("HTTP/1.1 ", r.status, "\n", r.body);
}

// The value of the first sample of `metrics` whose line starts with `series` and contains
// `with`; "" when none does.
std::string SampleOf(const std::string& metrics, const std::string& series,
                     const std::string& with) {
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, series) || line.find(with) == absl::string_view::npos) continue;
    return std::string(line.substr(line.rfind(' ') + 1));
  }
  return "";
}

WorkerConfig TinyConfig(tandem::v1::WorkerRole role) {
  WorkerConfig config;
  config.role = role;
  config.model.load_format = "dummy";
  config.model.dummy_config = "tiny";
  config.backend.num_threads = 1;
  config.engine.num_threads = 1;
  config.engine.kv_cache_bytes = int64_t{4} << 20;
  config.worker_id = "daemon-test";
  return config;
}

// The daemon's agent (MakeTransferAgent's) behind a wrapper that counts the memory it is asked
// to export (RegisterMemory, AllocateMemory); everything else is forwarded.
class ExportCountingAgent final : public kvtransfer::TransferAgent {
 public:
  ExportCountingAgent(std::unique_ptr<kvtransfer::TransferAgent> base,
                      std::shared_ptr<std::atomic<int>> exports)
      : base_(std::move(base)), exports_(std::move(exports)) {}

  std::string transport() const override { return base_->transport(); }
  absl::StatusOr<uint32_t> RegisterMemory(void* base, uint64_t length,
                                          tandem::v1::MemoryKind kind) override {
    ++*exports_;
    return base_->RegisterMemory(base, length, kind);
  }
  absl::StatusOr<std::pair<void*, uint32_t>> AllocateMemory(uint64_t length,
                                                            tandem::v1::MemoryKind kind) override {
    ++*exports_;
    return base_->AllocateMemory(length, kind);
  }
  absl::Status SyncForRemoteRead(uint32_t region,
                                 absl::Span<const kvtransfer::ByteRange> ranges) override {
    return base_->SyncForRemoteRead(region, ranges);
  }
  absl::Status FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) override {
    return base_->FillLocalDescriptor(handshake);
  }
  std::string IssueAccessToken() override { return base_->IssueAccessToken(); }
  absl::Status AddPeer(const std::string& name,
                       const tandem::v1::TransferHandshake& peer) override {
    return base_->AddPeer(name, peer);
  }
  void RemovePeer(const std::string& name) override { base_->RemovePeer(name); }
  absl::StatusOr<kvtransfer::TransferId> PostRead(
      const std::string& peer, absl::Span<const kvtransfer::CopyOp> ops) override {
    return base_->PostRead(peer, ops);
  }
  absl::StatusOr<bool> CheckTransfer(kvtransfer::TransferId id) override {
    return base_->CheckTransfer(id);
  }
  void Cancel(kvtransfer::TransferId id) override { base_->Cancel(id); }
  kvtransfer::TransferAgentStats Stats() const override { return base_->Stats(); }

 private:
  std::unique_ptr<kvtransfer::TransferAgent> base_;
  std::shared_ptr<std::atomic<int>> exports_;
};

// `config` with its agent counted in `exports`.
void CountExports(WorkerConfig& config, std::shared_ptr<std::atomic<int>> exports) {
  config.make_agent = [transfer = config.transfer, exports = std::move(exports)]()
      -> absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> {
    absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> base = MakeTransferAgent(transfer);
    if (!base.ok()) return base.status();
    return std::make_unique<ExportCountingAgent>(*std::move(base), exports);
  };
}

TEST(WorkerDaemonTest, ServesFromAConfigAndDrains) {
  WorkerConfig config = TinyConfig(tandem::v1::WORKER_ROLE_MIXED);
  config.metrics_listen = "127.0.0.1:0";
  config.step_trace = absl::StrCat(::testing::TempDir(), "/daemon_steps.jsonl");
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon = WorkerDaemon::Create(config);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_EQ((*daemon)->address().rfind("127.0.0.1:", 0), 0u) << (*daemon)->address();
  EXPECT_GT((*daemon)->epoch(), 0u);
  auto stub = tandem::v1::WorkerService::NewStub(
      grpc::CreateChannel((*daemon)->address(), grpc::InsecureChannelCredentials()));
  tandem::v1::GenerateRequest request;
  request.set_request_id("r");
  for (uint32_t t : {3u, 1u, 4u, 1u, 5u}) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_max_tokens(6);
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, request);
  tandem::v1::GenerateResponse msg;
  int tokens = 0;
  while (reader->Read(&msg)) tokens += msg.token_ids_size();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 6);
  const tandem::v1::WorkerStats stats = (*daemon)->worker().StatsProto();
  EXPECT_EQ(stats.info().worker_id(), "daemon-test");
  EXPECT_EQ(stats.requests_finished(), 1u);
  EXPECT_NE(stats.info().kv_layout_hash(), 0u);
  // The HTTP plane: the request is counted, the worker is healthy.
  ASSERT_GT((*daemon)->metrics_port(), 0);
  const std::string metrics = HttpGet((*daemon)->metrics_port(), "/metrics");
  EXPECT_NE(metrics.find("HTTP/1.1 200"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("# TYPE tandem:request_success_total counter"), std::string::npos);
  EXPECT_NE(metrics.find("tandem:request_success_total{model_name=\""), std::string::npos);
  EXPECT_NE(metrics.find("worker_id=\"daemon-test\",role=\"WORKER_ROLE_MIXED\"} 1\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("tandem:worker_serving{"), std::string::npos);
  // One Generate: one first token, one whole request, 5 gaps between its 6 streamed tokens (or
  // fewer when updates carried several tokens).
  for (const char* h : {"tandem:worker_time_to_first_token_seconds_count{",
                        "tandem:worker_e2e_request_latency_seconds_count{",
                        "tandem:request_queue_time_seconds_count{"}) {
    const size_t at = metrics.find(h);
    ASSERT_NE(at, std::string::npos) << h;
    EXPECT_EQ(metrics.substr(metrics.find("} ", at) + 2, 2), "1\n") << h;
  }
  EXPECT_NE(metrics.find("le=\"+Inf\"} 1\n"), std::string::npos);
  // The model steps: the 5-token prompt's step (its first token), then 5 decode steps.
  EXPECT_EQ(SampleOf(metrics, "tandem:step_duration_seconds_count{", "kind=\"prefill\""), "1");
  EXPECT_EQ(SampleOf(metrics, "tandem:step_duration_seconds_count{", "kind=\"decode\""), "5");
  EXPECT_EQ(SampleOf(metrics, "tandem:iteration_tokens_total_count{", ""), "6");
  EXPECT_EQ(SampleOf(metrics, "tandem:iteration_tokens_total_sum{", ""), "10");
  EXPECT_NE(HttpGet((*daemon)->metrics_port(), "/health").find("HTTP/1.1 200"), std::string::npos);

  (*daemon)->Drain(absl::Seconds(5));
  EXPECT_EQ((*daemon)->worker().status(), tandem::v1::SERVING_STATUS_DRAINING);
  EXPECT_NE(HttpGet((*daemon)->metrics_port(), "/health").find("HTTP/1.1 503"), std::string::npos)
      << "a draining worker is not healthy";
  grpc::ClientContext after;
  after.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  tandem::v1::HealthResponse health;
  EXPECT_FALSE(stub->Health(&after, tandem::v1::WorkerHealthRequest(), &health).ok())
      << "the server stopped";
  // --step_trace: one line a model step, written out when the worker goes.
  daemon->reset();
  std::ifstream in(config.step_trace);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_NE(lines[0].find("\"seqs\":1,\"decode\":0,\"prefill_tokens\":5,"), std::string::npos)
      << lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_NE(lines[i].find("\"decode\":1,\"prefill_tokens\":0,\"draft_tokens\":0,\"tokens\":1,"),
              std::string::npos)
        << lines[i];
  }
}

// A prefill worker's SIGTERM: no new prefills, but a KV lease a decode worker has yet to read
// keeps the server up until it is released (here by Abort, as the router sends), or, bounded by
// the drain timeout, until the timeout.
TEST(WorkerDaemonTest, PrefillDrainWaitsForItsKvLeases) {
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon =
      WorkerDaemon::Create(TinyConfig(tandem::v1::WORKER_ROLE_PREFILL));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto stub = tandem::v1::WorkerService::NewStub(
      grpc::CreateChannel((*daemon)->address(), grpc::InsecureChannelCredentials()));
  auto prefill = [&](const std::string& id) {
    tandem::v1::PrefillRequest request;
    request.mutable_request()->set_request_id(id);
    for (uint32_t t : {3u, 1u, 4u, 1u, 5u}) request.mutable_request()->add_prompt_token_ids(t);
    request.mutable_request()->mutable_sampling()->set_max_tokens(8);
    request.mutable_request()->mutable_sampling()->set_ignore_eos(true);
    request.set_remote_decode(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    tandem::v1::PrefillResponse response;
    return stub->Prefill(&ctx, request, &response);
  };
  ASSERT_TRUE(prefill("leased").ok());
  ASSERT_GT((*daemon)->worker().Load().kv_blocks_leased(), 0u);

  absl::Notification drained;
  std::thread drain([&] {
    (*daemon)->Drain(absl::Seconds(20));
    drained.Notify();
  });
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(drained.HasBeenNotified()) << "the lease is still held: the worker must wait";
  EXPECT_EQ(prefill("new").error_code(), grpc::StatusCode::UNAVAILABLE) << "draining";
  grpc::ClientContext ctx;
  tandem::v1::AbortRequest abort;
  abort.set_request_id("leased");
  tandem::v1::AbortResponse aborted;
  ASSERT_TRUE(stub->Abort(&ctx, abort, &aborted).ok()) << "still serving while draining";
  EXPECT_TRUE(aborted.found());
  EXPECT_TRUE(drained.WaitForNotificationWithTimeout(absl::Seconds(5)))
      << "released: the drain ends";
  drain.join();
}

TEST(WorkerDaemonTest, DrainIsBoundedByItsTimeout) {
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon =
      WorkerDaemon::Create(TinyConfig(tandem::v1::WORKER_ROLE_PREFILL));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto stub = tandem::v1::WorkerService::NewStub(
      grpc::CreateChannel((*daemon)->address(), grpc::InsecureChannelCredentials()));
  tandem::v1::PrefillRequest request;
  request.mutable_request()->set_request_id("held");
  request.mutable_request()->add_prompt_token_ids(7);
  request.mutable_request()->mutable_sampling()->set_max_tokens(4);
  request.set_remote_decode(true);
  grpc::ClientContext ctx;
  tandem::v1::PrefillResponse response;
  ASSERT_TRUE(stub->Prefill(&ctx, request, &response).ok());
  const absl::Time start = absl::Now();
  (*daemon)->Drain(absl::Milliseconds(600));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(550));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST(WorkerDaemonTest, AWildcardListenAdvertisesAnAddressPeersCanReach) {
  // Listening on every interface, the worker must not register as 0.0.0.0.
  WorkerConfig config = TinyConfig(tandem::v1::WORKER_ROLE_MIXED);
  config.listen = "0.0.0.0:0";
  config.advertise_host = "127.0.0.1";
  config.transfer.ucx_net_device = "auto";
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon = WorkerDaemon::Create(config);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_EQ((*daemon)->address().rfind("127.0.0.1:", 0), 0u) << (*daemon)->address();
  EXPECT_EQ((*daemon)->worker().Info().address(), (*daemon)->address());
  // Reachable at the advertised address (the server listens on all of them).
  auto stub = tandem::v1::WorkerService::NewStub(
      grpc::CreateChannel((*daemon)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  tandem::v1::HealthResponse health;
  EXPECT_TRUE(stub->Health(&ctx, tandem::v1::WorkerHealthRequest(), &health).ok());

  // Without --advertise_address: the host's first non-loopback address, never the wildcard.
  config.advertise_host.clear();
  config.worker_id = "daemon-test-2";
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> guessed = WorkerDaemon::Create(config);
  if (guessed.ok()) {
    EXPECT_EQ((*guessed)->address().rfind("0.0.0.0", 0), std::string::npos)
        << (*guessed)->address();
  } else {
    EXPECT_EQ(guessed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(guessed.status().message().find("--advertise_address"), std::string::npos);
  }
}

// Issue 31: a mixed worker serves whole requests, never a P->D source or reader, so its start
// exports no KV pool to its agent (with UCX and a CUDA pool that was a pinned host mirror of the
// whole pool, most of a TP=4 group's start). It still serves Generate; a remote-decode Prefill is
// refused. A prefill worker (the control) still exports its pool once.
TEST(WorkerDaemonTest, AMixedWorkerExportsNoKvPoolAndStillServes) {
  auto mixed_exports = std::make_shared<std::atomic<int>>(0);
  WorkerConfig config = TinyConfig(tandem::v1::WORKER_ROLE_MIXED);
  CountExports(config, mixed_exports);
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> mixed = WorkerDaemon::Create(config);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed_exports->load(), 0) << "no RegisterMemory / AllocateMemory for a mixed worker";
  auto stub = tandem::v1::WorkerService::NewStub(
      grpc::CreateChannel((*mixed)->address(), grpc::InsecureChannelCredentials()));
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> token(1, 200);
  tandem::v1::GenerateRequest request;
  request.set_request_id("whole");
  for (int i = 0; i < 7; ++i) request.add_prompt_token_ids(token(rng));
  request.mutable_sampling()->set_max_tokens(5);
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, request);
  tandem::v1::GenerateResponse msg;
  int tokens = 0;
  while (reader->Read(&msg)) tokens += msg.token_ids_size();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 5);
  EXPECT_EQ((*mixed)->worker().StatsProto().requests_finished(), 1u);

  tandem::v1::PrefillRequest prefill;
  *prefill.mutable_request() = request;
  prefill.mutable_request()->set_request_id("p-d");
  prefill.set_remote_decode(true);
  grpc::ClientContext pctx;
  tandem::v1::PrefillResponse presponse;
  EXPECT_EQ(stub->Prefill(&pctx, prefill, &presponse).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION)
      << "no KV lease can be served from an unexported pool";
  EXPECT_EQ(mixed_exports->load(), 0);
  (*mixed)->Drain(absl::Seconds(5));

  auto prefill_exports = std::make_shared<std::atomic<int>>(0);
  WorkerConfig prefill_config = TinyConfig(tandem::v1::WORKER_ROLE_PREFILL);
  prefill_config.worker_id = "daemon-test-prefill";
  CountExports(prefill_config, prefill_exports);
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> source = WorkerDaemon::Create(prefill_config);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(prefill_exports->load(), 1) << "a prefill worker's pool is exported once";
}

TEST(WorkerDaemonTest, BadConfigurationsAreRefusedNamingTheProblem) {
  WorkerConfig queue = TinyConfig(tandem::v1::WORKER_ROLE_MIXED);
  queue.max_queued_requests = 0;
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> d = WorkerDaemon::Create(queue);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("max_queued_requests"), std::string::npos) << d.status();

  WorkerConfig transport = TinyConfig(tandem::v1::WORKER_ROLE_MIXED);
  transport.transfer.transport = "carrier-pigeon";
  d = WorkerDaemon::Create(transport);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();

  WorkerConfig listen = TinyConfig(tandem::v1::WORKER_ROLE_MIXED);
  listen.listen = "256.1.1.1:0";
  d = WorkerDaemon::Create(listen);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable) << d.status();

  WorkerConfig id = TinyConfig(tandem::v1::WORKER_ROLE_MIXED);
  id.worker_id = std::string(1000, 'w');
  d = WorkerDaemon::Create(id);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();

  WorkerConfig trace = TinyConfig(tandem::v1::WORKER_ROLE_MIXED);
  trace.step_trace = absl::StrCat(::testing::TempDir(), "/no-such-dir/steps.jsonl");
  d = WorkerDaemon::Create(trace);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
  EXPECT_NE(d.status().message().find("no-such-dir/steps.jsonl"), std::string::npos) << d.status();
}

}  // namespace
}  // namespace tandem::runtime
