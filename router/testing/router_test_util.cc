#include "router/testing/router_test_util.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_hash.h"
#include "gtest/gtest.h"

namespace tandem::router {

RouterOptions TestRouterOptions() {
  RouterOptions o;
  o.listen = "127.0.0.1:0";
  o.registry.heartbeat_interval = absl::Milliseconds(20);
  o.registry.worker_timeout = absl::Seconds(60);
  o.orchestrator.request_timeout = absl::Seconds(60);
  o.orchestrator.abort_timeout = absl::Seconds(2);
  o.max_queue = 256;
  return o;
}

RouterHarness::RouterHarness(RouterOptions options) {
  absl::StatusOr<std::unique_ptr<RouterServer>> server = RouterServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) std::abort();
  server_ = *std::move(server);
  stub_ = v1::Router::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
}

RouterHarness::~RouterHarness() {
  // Workers first: their heartbeat threads talk to the router.
  workers_.clear();
  server_->Shutdown(absl::ZeroDuration());
}

FakeWorker* RouterHarness::AddWorker(const std::string& id, v1::WorkerRole role,
                                     const std::function<void(FakeWorkerOptions&)>& customize) {
  FakeWorkerOptions o;
  o.worker_id = id;
  o.role = role;
  o.router_address = server_->internal_address();  // address() unless internal_listen is set
  if (customize) customize(o);
  absl::StatusOr<std::unique_ptr<FakeWorker>> w = FakeWorker::Start(o);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) std::abort();
  FakeWorker* raw = w->get();
  workers_.push_back(*std::move(w));
  EXPECT_TRUE(raw->WaitRegistered(absl::Seconds(30))) << id << " did not register";
  EXPECT_TRUE(raw->WaitForHeartbeats(1, absl::Seconds(30))) << id << " did not heartbeat";
  return raw;
}

StreamResult RouterHarness::Generate(const v1::GenerateRequest& request, absl::Duration timeout) {
  StreamResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  auto reader = stub_->Generate(&ctx, request);
  v1::GenerateResponse chunk;
  while (reader->Read(&chunk)) {
    if (r.request_id.empty()) r.request_id = chunk.request_id();
    for (uint32_t t : chunk.token_ids()) r.tokens.push_back(t);
    if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      r.finish_reason = chunk.finish_reason();
      r.usage = chunk.usage();
    }
    r.chunks.push_back(chunk);
  }
  r.status = reader->Finish();
  return r;
}

std::vector<v1::WorkerEntry> RouterHarness::Workers() {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::ListWorkersResponse resp;
  grpc::Status s = stub_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return {resp.workers().begin(), resp.workers().end()};
}

bool RouterHarness::WaitForHealth(const std::string& worker_id, bool healthy,
                                  absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    for (const v1::WorkerEntry& w : Workers()) {
      if (w.info().worker_id() == worker_id && w.healthy() == healthy) return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

void RouterHarness::SyncHeartbeats(int n) {
  for (auto& w : workers_) {
    EXPECT_TRUE(w->WaitForHeartbeats(n, absl::Seconds(30))) << w->id() << " stopped heartbeating";
  }
}

v1::GenerateRequest MakeRequest(const std::vector<uint32_t>& prompt, uint32_t max_tokens,
                                const std::string& request_id) {
  v1::GenerateRequest req;
  req.set_request_id(request_id);
  for (uint32_t t : prompt) req.add_prompt_token_ids(t);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  return req;
}

std::vector<uint32_t> RandomPrompt(std::mt19937_64& rng, int length, uint32_t vocab_size) {
  std::uniform_int_distribution<uint32_t> dist(0, vocab_size - 1);
  std::vector<uint32_t> prompt(length);
  for (uint32_t& t : prompt) t = dist(rng);
  return prompt;
}

uint64_t FreshSeed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

std::vector<uint64_t> PromptChain(const std::vector<uint32_t>& prompt, uint32_t block_size,
                                  const std::string& salt) {
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<uint64_t> chain;
  for (const BlockHash& h : ComputeBlockHashes(tokens, block_size, salt)) {
    chain.push_back(h.Short());
  }
  return chain;
}

v1::WorkerLoad Load(uint32_t running, uint32_t waiting, uint32_t free_blocks,
                    uint32_t total_blocks) {
  v1::WorkerLoad load;
  load.set_num_running(running);
  load.set_num_waiting(waiting);
  load.set_kv_blocks_free(free_blocks);
  load.set_kv_blocks_total(total_blocks);
  return load;
}

}  // namespace tandem::router
