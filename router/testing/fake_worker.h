// FakeWorker: a real gRPC WorkerService on 127.0.0.1 with a deterministic "model", for router
// tests, the router benchmark and the load generator's smoke test. It registers and heartbeats
// with a router exactly like the real worker daemon (RegisterWorker until answered, Heartbeat every
// interval with status, load and prefix-hash deltas, register again on known=false).
//
// The model: next = (31 * prev + 7) % vocab_size (the request's vocab_limit when smaller), starting
// from the last prompt token; the first token comes from Prefill (or the first Generate message),
// Decode streams the rest one token per message. Finish: eos (unless ignore_eos), then stop ids,
// then max_tokens. FakeGenerate computes the expected output, so tests compare whole streams.
//
// Decode and Generate are callback (reactor) streams paced by a small executor's timers, so a
// fake worker holds thousands of open streams without a thread each (http_bench runs 2000); they
// notice a cancel, an Abort or Kill() within 5 ms, as the synchronous Prefill does.
//
// Thread safety: all public methods are thread-safe.
#ifndef TANDEM_ROUTER_TESTING_FAKE_WORKER_H_
#define TANDEM_ROUTER_TESTING_FAKE_WORKER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/security/security_config.h"
#include "router/core/executor.h"
#include "tandem/v1/router.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

struct FakeWorkerOptions {
  std::string worker_id = "fake";
  v1::WorkerRole role = v1::WORKER_ROLE_MIXED;
  uint64_t epoch = 1;
  std::string model_id = "fake-model";
  uint32_t vocab_size = 1000;
  uint32_t max_model_len = 4096;
  uint32_t block_size = 16;
  uint64_t kv_layout_hash = 0x7a11de11;
  std::vector<uint32_t> eos_token_ids;
  uint32_t kv_blocks_total = 4096;
  std::string listen = "127.0.0.1:0";
  std::string router_address;                                // register + heartbeat there when set
  absl::Duration heartbeat_interval = absl::ZeroDuration();  // 0 = as the router says
  absl::Duration prefill_delay = absl::ZeroDuration();
  absl::Duration token_delay = absl::ZeroDuration();        // before each decode/generate token
  absl::Duration abort_reply_delay = absl::ZeroDuration();  // before answering Abort
  // True: generates over the whole vocab_size whatever the request's sampling.vocab_limit (a
  // worker that would return ids its router's tokenizer cannot decode).
  bool ignore_vocab_limit = false;
  // Plain text by default; with TLS its WorkerService is an internal mTLS server (only the router
  // role may call it) and it registers with its certificate.
  security::SecurityConfig security;
};

uint32_t FakeNextToken(uint32_t prev, uint32_t vocab_size);

struct FakeCompletion {
  std::vector<uint32_t> tokens;
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
};

// The ids a fake worker generates among for `request`: [0, min(vocab_size, vocab_limit)).
uint32_t FakeSampledVocab(const v1::GenerateRequest& request, uint32_t vocab_size);

// What a fake worker with `eos_token_ids` generates for `request` (all tokens, first included).
FakeCompletion FakeGenerate(const v1::GenerateRequest& request, uint32_t vocab_size,
                            absl::Span<const uint32_t> eos_token_ids);

class FakeWorker {
 public:
  static absl::StatusOr<std::unique_ptr<FakeWorker>> Start(FakeWorkerOptions options);
  ~FakeWorker();  // Kill()

  FakeWorker(const FakeWorker&) = delete;
  FakeWorker& operator=(const FakeWorker&) = delete;

  const std::string& address() const { return address_; }
  const FakeWorkerOptions& options() const { return options_; }
  const std::string& id() const { return options_.worker_id; }

  // What the next heartbeats report. Default load: nothing running, every block free.
  void SetLoad(const v1::WorkerLoad& load);
  void SetStatus(v1::ServingStatus status);
  // Pretends these blocks entered the prefix cache: reported as added in the next heartbeat.
  void AddCachedBlocks(absl::Span<const uint64_t> hashes);
  void SetHeartbeatsPaused(bool paused);
  // Waits until `n` more heartbeats than now were acknowledged (the router has the state set
  // before the call). False on timeout.
  bool WaitForHeartbeats(int n, absl::Duration timeout);
  // Waits until registered with the router.
  bool WaitRegistered(absl::Duration timeout);

  struct Counters {
    int prefill = 0;
    int decode = 0;
    int generate = 0;
    int abort = 0;
  };
  Counters counters() const;
  int total_calls() const;  // Prefill + Decode + Generate
  bool WasAborted(const std::string& request_id) const;
  // Waits until an Abort for `request_id` arrived. False on timeout.
  bool WaitForAbort(const std::string& request_id, absl::Duration timeout) const;
  // Streams (Decode/Generate) currently open.
  int open_streams() const;

  // Dies: stops heartbeating and shuts the server down at once, breaking open streams.
  void Kill();

 private:
  class Service;
  class StreamReactor;
  explicit FakeWorker(FakeWorkerOptions options);
  void HeartbeatLoop();
  // Registers; returns the router's heartbeat interval, nullopt when the router did not answer.
  std::optional<absl::Duration> Register(v1::WorkerRegistry::Stub& stub);
  bool SendHeartbeat(v1::WorkerRegistry::Stub& stub);
  // Sleeps `d` in slices; false when the call was cancelled, aborted or the worker killed.
  bool Pause(grpc::ServerContext* ctx, const std::string& request_id, absl::Duration d) const;
  // Whether `request_id` was aborted (while running here) or the worker killed.
  bool Stopped(const std::string& request_id) const;
  v1::WorkerInfo Info() const;
  // The ids it generates among for `request` (FakeSampledVocab unless ignore_vocab_limit).
  uint32_t SampledVocab(const v1::GenerateRequest& request) const;

  const FakeWorkerOptions options_;
  Executor executor_{2};  // paces the streams; outlives the server's calls (Kill waits for them)
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<bool> killed_{false};
  absl::Notification stop_;
  std::thread heartbeat_thread_;

  mutable absl::Mutex mu_;
  v1::WorkerLoad load_ ABSL_GUARDED_BY(mu_);
  v1::ServingStatus status_ ABSL_GUARDED_BY(mu_) = v1::SERVING_STATUS_SERVING;
  absl::flat_hash_set<uint64_t> cached_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> pending_added_ ABSL_GUARDED_BY(mu_);
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  int64_t heartbeats_acked_ ABSL_GUARDED_BY(mu_) = 0;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> aborted_ ABSL_GUARDED_BY(mu_);  // every Abort ever received
  // Requests running here -> whether an Abort arrived for them.
  absl::flat_hash_map<std::string, bool> active_ ABSL_GUARDED_BY(mu_);
  int open_streams_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_TESTING_FAKE_WORKER_H_
