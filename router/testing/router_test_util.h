// Test harness: an in-process RouterServer on 127.0.0.1:0 plus FakeWorkers that register and
// heartbeat with it over real gRPC, and a Router client with helpers to run whole streams.
#ifndef TANDEM_ROUTER_TESTING_ROUTER_TEST_UTIL_H_
#define TANDEM_ROUTER_TESTING_ROUTER_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "router/grpc/router_server.h"
#include "router/testing/fake_worker.h"
#include "tandem/v1/router.grpc.pb.h"

namespace tandem::router {

// Fast heartbeats; a long worker timeout, so a loaded CI machine never loses a worker by accident
// (tests about timeouts shorten it).
RouterOptions TestRouterOptions();

struct StreamResult {
  grpc::Status status;
  std::string request_id;
  std::vector<v1::GenerateResponse> chunks;
  std::vector<uint32_t> tokens;
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;
};

class RouterHarness {
 public:
  explicit RouterHarness(RouterOptions options = TestRouterOptions());
  ~RouterHarness();

  // Starts a fake worker registered with this router and waits until its first heartbeat was
  // acknowledged. `customize` may edit the options first.
  FakeWorker* AddWorker(const std::string& id, v1::WorkerRole role,
                        const std::function<void(FakeWorkerOptions&)>& customize = nullptr);

  RouterServer& server() { return *server_; }
  v1::Router::Stub& stub() { return *stub_; }
  const std::string& address() const { return server_->address(); }

  // Runs a whole Generate stream (client deadline `timeout`).
  StreamResult Generate(const v1::GenerateRequest& request,
                        absl::Duration timeout = absl::Seconds(60));
  std::vector<v1::WorkerEntry> Workers();
  // Polls ListWorkers until `worker_id` reports `healthy`. False on timeout.
  bool WaitForHealth(const std::string& worker_id, bool healthy,
                     absl::Duration timeout = absl::Seconds(30));
  // Waits until every worker acknowledged `n` more heartbeats (the router saw their latest load
  // and prefix-cache state).
  void SyncHeartbeats(int n = 2);

 private:
  std::unique_ptr<RouterServer> server_;
  std::unique_ptr<v1::Router::Stub> stub_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

v1::GenerateRequest MakeRequest(const std::vector<uint32_t>& prompt, uint32_t max_tokens,
                                const std::string& request_id = "");
std::vector<uint32_t> RandomPrompt(std::mt19937_64& rng, int length, uint32_t vocab_size);
// A fresh seed from std::random_device; log it with SCOPED_TRACE.
uint64_t FreshSeed();
// The prompt's block-hash chain (short forms), as the router and the workers compute it.
std::vector<uint64_t> PromptChain(const std::vector<uint32_t>& prompt, uint32_t block_size,
                                  const std::string& salt = "");
v1::WorkerLoad Load(uint32_t running, uint32_t waiting, uint32_t free_blocks,
                    uint32_t total_blocks = 4096);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_TESTING_ROUTER_TEST_UTIL_H_
