// EngineLoop: runs one Engine on its own thread for the worker daemon's RPC handlers.
//
// Handlers Submit() a request under its external (router-assigned) string id and read its
// updates from the returned RequestStream; Abort() drops it. The loop thread steps the engine
// whenever it has work, and otherwise wakes every `idle_poll` to let the connector expire
// leases. One mutex guards the engine: Submit/Abort wait at most one step.
//
// Thread safety: all public methods are thread-safe.
#ifndef TANDEM_RUNTIME_WORKER_ENGINE_LOOP_H_
#define TANDEM_RUNTIME_WORKER_ENGINE_LOOP_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/engine/engine.h"

namespace tandem::runtime {

// The updates of one request, in order; the last one has finish_reason != kNone.
class RequestStream {
 public:
  explicit RequestStream(int64_t engine_id) : engine_id_(engine_id) {}
  // Waits up to `timeout` for the next update. False on timeout.
  bool Next(RequestUpdate* update, absl::Duration timeout);
  int64_t engine_id() const { return engine_id_; }

  void Push(RequestUpdate update);  // called by the loop

 private:
  const int64_t engine_id_;
  absl::Mutex mu_;
  std::deque<RequestUpdate> queue_ ABSL_GUARDED_BY(mu_);
};

struct EngineLoopStats {
  int64_t num_running = 0;  // running + loading remote KV
  int64_t num_waiting = 0;
  KvCacheStats kv;
  uint64_t requests_finished = 0;
  uint64_t requests_aborted = 0;
  uint64_t step_errors = 0;
};

class EngineLoop {
 public:
  // Starts the loop thread. `engine` must have its connector attached already (if any).
  explicit EngineLoop(std::unique_ptr<Engine> engine,
                      absl::Duration idle_poll = absl::Milliseconds(10));
  ~EngineLoop();  // stops the thread; open streams get no more updates
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Validates and queues the request (Engine::AddRequest's errors; ALREADY_EXISTS when `id` is
  // in flight).
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(const std::string& id, RequestSpec spec);
  // Aborts the in-flight request `id`; false when unknown. Its stream gets a final kAborted.
  bool Abort(const std::string& id);
  // Requests in flight (submitted, not yet finished).
  int64_t NumInFlight() const;
  // As of the last step: never waits for a running step (heartbeats must not stall behind a
  // long prefill).
  EngineLoopStats Stats() const;
  // Prefix-cache events collected after each step (Engine::TakeCacheEvents); never waits.
  void TakeCacheEvents(std::vector<uint64_t>* added, std::vector<uint64_t>* removed);
  // Runs `fn` with the engine under the loop's lock (e.g. to read prefix-cache events).
  template <typename Fn>
  auto WithEngine(Fn fn) {
    absl::MutexLock lock(&mu_);
    return fn(*engine_);
  }
  const ModelConfig& model_config() const { return engine_->model_config(); }
  int64_t max_model_len() const { return engine_->max_model_len(); }
  int64_t block_size() const { return engine_->block_size(); }
  int64_t num_kv_blocks() const { return engine_->num_kv_blocks(); }

 private:
  void Run();
  // Refreshes the snapshot read by Stats / TakeCacheEvents. REQUIRES: mu_ held.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration idle_poll_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Engine> engine_ ABSL_PT_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<RequestStream>> by_name_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, std::string> names_ ABSL_GUARDED_BY(mu_);
  int64_t next_engine_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  EngineLoopStats counters_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;

  // Lock order: mu_ before snapshot_mu_.
  mutable absl::Mutex snapshot_mu_;
  EngineLoopStats snapshot_ ABSL_GUARDED_BY(snapshot_mu_);
  std::vector<uint64_t> added_ ABSL_GUARDED_BY(snapshot_mu_);
  std::vector<uint64_t> removed_ ABSL_GUARDED_BY(snapshot_mu_);
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_ENGINE_LOOP_H_
