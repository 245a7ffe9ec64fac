// EngineLoop: runs one Engine on its own thread for the worker daemon's RPC handlers.
//
// Admission path (runtime/worker/README.md, "Admission"): handlers never wait for a step.
// Submit() validates the request against the engine's fixed limits (no engine lock: validation
// reads only what was fixed before the first request), registers its id, and pushes it onto a
// bounded inbox under `mu_`, a small lock that no one holds across a model step. Abort() does
// the same with an abort (or takes a not-yet-admitted submission straight out of the inbox).
// The loop thread drains the inbox at the top of every step, so a request submitted while a
// step runs is in the scheduler for the very next step, and an abort frees the request's KV
// blocks at the start of the next step. The engine itself is touched only by the loop thread.
//
// Idle: the loop sleeps until the inbox has something, or `idle_poll` passes (so the connector
// can expire leases without traffic).
//
// Thread safety: all public methods are thread-safe; none waits for a model step.
#ifndef TANDEM_RUNTIME_WORKER_ENGINE_LOOP_H_
#define TANDEM_RUNTIME_WORKER_ENGINE_LOOP_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http/prometheus.h"
#include "runtime/engine/engine.h"
#include "runtime/worker/step_trace.h"

namespace tandem::runtime {

// The updates of one request, in order; the last one has finish_reason != kNone.
class RequestStream {
 public:
  // `submit_step`: the loop's step index when the request was queued (EngineLoop::Submit).
  RequestStream(int64_t engine_id, int64_t submit_step)
      : engine_id_(engine_id), submit_step_(submit_step) {}
  // Waits up to `timeout` for the next update. False on timeout. `step` (optional) receives
  // the index of the loop step that produced the update (EngineLoopStats::steps counts them;
  // an abort's final update carries the step count when it was requested).
  bool Next(RequestUpdate* update, absl::Duration timeout, int64_t* step = nullptr);
  int64_t engine_id() const { return engine_id_; }
  // The step running (or last run) when the request was queued: the engine has the request
  // before step submit_step() + 1 starts, so a request the scheduler admits at once has its
  // first update from that step (the trace's queue time in steps).
  int64_t submit_step() const { return submit_step_; }

  void Push(RequestUpdate update, int64_t step);  // called by the loop (and Abort)

 private:
  struct Item {
    RequestUpdate update;
    int64_t step = 0;
  };
  const int64_t engine_id_;
  const int64_t submit_step_;
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
};

struct EngineLoopStats {
  int64_t num_running = 0;  // running + loading remote KV
  int64_t num_waiting = 0;  // in the scheduler's queue or the loop's inbox
  KvCacheStats kv;
  uint64_t requests_finished = 0;
  uint64_t requests_aborted = 0;
  uint64_t step_errors = 0;
  int64_t steps = 0;  // loop steps completed (each drains the inbox, then steps the engine)
  // Requests whose remote KV failed to load and were queued to prefill here instead.
  uint64_t kv_recomputes = 0;
  SpecStats spec;             // speculative decoding counters (Engine::spec_stats)
  uint64_t mtp_handoffs = 0;  // MtpProposer::num_handoffs (P -> D MTP state made or taken)
  // MoE models: tokens routed to each expert (ExecutorStats::moe_expert_tokens).
  std::vector<uint64_t> moe_expert_tokens;
};

struct EngineLoopOptions {
  // How long the idle loop sleeps between lease-expiry polls.
  absl::Duration idle_poll = absl::Milliseconds(10);
  // Requests submitted but not yet running (inbox + the scheduler's waiting queue) at most;
  // Submit answers RESOURCE_EXHAUSTED beyond it.
  int64_t max_queued_requests = 4096;
  // Called (from the loop thread, no lock held) with the lease of a request that finished
  // holding its KV for a remote reader but was aborted meanwhile: its handle never reaches a
  // reader, so the lease must end now, not at expiry (e.g. KvConnector::ReleaseLease).
  std::function<void(uint64_t lease_id)> release_orphan_lease;
  // Where each model step's record goes, one JSON line a step (step_trace.h; null: nowhere).
  // Used by the loop thread only.
  std::shared_ptr<StepTraceWriter> step_trace;
};

class EngineLoop {
 public:
  // Starts the loop thread. `engine` must have its connector attached already (if any).
  explicit EngineLoop(std::unique_ptr<Engine> engine, EngineLoopOptions options = {});
  ~EngineLoop();  // stops the thread; open streams get no more updates
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Validates and queues the request: Engine::ValidateRequest's errors, ALREADY_EXISTS when
  // `id` is in flight, RESOURCE_EXHAUSTED when max_queued_requests are queued already.
  // Never waits for a step.
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(const std::string& id, RequestSpec spec)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Aborts the in-flight request `id`; false when unknown. Its stream gets a final kAborted at
  // once; the engine drops it (freeing its blocks, releasing a remote KV lease it carries) at
  // the start of the next step, even when it was still in the inbox.
  bool Abort(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Requests in flight (submitted, not yet finished or aborted).
  int64_t NumInFlight() const ABSL_LOCKS_EXCLUDED(mu_);
  // As of the last step (queue depth as of now): never waits for a running step.
  EngineLoopStats Stats() const ABSL_LOCKS_EXCLUDED(mu_, snapshot_mu_);
  // The executor's health (a worker group's process group): never waits for a running step.
  absl::Status ExecutorHealth() const { return engine_->executor_health(); }
  // Prefix-cache events collected after each step (Engine::TakeCacheEvents); never waits.
  void TakeCacheEvents(std::vector<uint64_t>* added, std::vector<uint64_t>* removed)
      ABSL_LOCKS_EXCLUDED(snapshot_mu_);
  // Every short hash in the prefix cache as of the last step (needs the engine's cache events
  // enabled, Engine::EnableCacheEvents); never waits.
  std::vector<uint64_t> CachedHashes() const ABSL_LOCKS_EXCLUDED(snapshot_mu_);
  // Queue time (seconds, http::LatencyBuckets): from Submit (RequestSpec::arrival, unless the
  // caller set it earlier) to the step whose scheduling first admitted the request (to run, or
  // to load its remote KV); one observation per request admitted. Never waits.
  http::HistogramSnapshot QueueTimeSnapshot() const { return queue_time_.Snapshot(); }
  // The model steps' times (decode-only / with prompt tokens) and tokens (StepMetrics). Never
  // waits.
  StepMetrics::Snapshot StepSnapshot() const { return step_metrics_.Take(); }

  // Fixed at creation: safe from any thread.
  const ModelConfig& model_config() const { return engine_->model_config(); }
  int64_t max_model_len() const { return engine_->max_model_len(); }
  int64_t block_size() const { return engine_->block_size(); }
  int64_t num_kv_blocks() const { return engine_->num_kv_blocks(); }

 private:
  struct Op {
    enum class Kind { kSubmit, kAbort } kind;
    int64_t engine_id = 0;
    RequestSpec spec;  // kSubmit
  };

  void Run();
  // Loop thread: hands the inbox's submissions and aborts to the engine.
  void Apply(std::deque<Op> ops, int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Loop thread: hands a step's updates to their streams; collects the leases of aborted ones.
  void DeliverLocked(std::vector<RequestUpdate>& updates, int64_t step,
                     std::vector<uint64_t>* orphan_leases) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loop thread: hands a step's updates to their streams.
  void Deliver(std::vector<RequestUpdate> updates, int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Loop thread: a failed step fails every request in flight (their KV may be bad).
  void FailAll(const absl::Status& error, int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Loop thread: the step metrics and trace line of a model step that started at `start`.
  void RecordStep(int64_t step, absl::Time start);
  // Loop thread: refreshes the snapshot read by Stats / TakeCacheEvents / CachedHashes.
  void Publish() ABSL_LOCKS_EXCLUDED(snapshot_mu_);

  const EngineLoopOptions options_;
  // Owned by the loop thread after construction; other threads call only its const,
  // creation-time accessors (model_config, limits, ValidateRequest).
  const std::unique_ptr<Engine> engine_;

  // The admission lock: held only for bookkeeping, never across a step.
  mutable absl::Mutex mu_;
  std::deque<Op> inbox_ ABSL_GUARDED_BY(mu_);
  int64_t queued_submissions_ ABSL_GUARDED_BY(mu_) = 0;  // kSubmit ops in inbox_
  // Submissions the loop took out of the inbox and has not yet added (counted as queued).
  int64_t draining_submissions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t engine_waiting_ ABSL_GUARDED_BY(mu_) = 0;  // the scheduler's queue, as of the loop
  absl::flat_hash_map<std::string, std::shared_ptr<RequestStream>> by_name_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, std::string> names_ ABSL_GUARDED_BY(mu_);
  int64_t next_engine_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;  // steps started: the index of the current step
  uint64_t requests_aborted_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // Loop thread only.
  uint64_t requests_finished_ = 0;
  uint64_t step_errors_ = 0;
  int64_t steps_done_ = 0;
  http::Histogram queue_time_{http::LatencyBuckets()};  // thread-safe
  StepMetrics step_metrics_;                            // thread-safe
  absl::Time last_step_end_ = absl::InfinitePast();

  // Lock order: mu_ is never held while taking snapshot_mu_ or the reverse.
  mutable absl::Mutex snapshot_mu_;
  EngineLoopStats snapshot_ ABSL_GUARDED_BY(snapshot_mu_);
  std::vector<uint64_t> added_ ABSL_GUARDED_BY(snapshot_mu_);
  std::vector<uint64_t> removed_ ABSL_GUARDED_BY(snapshot_mu_);
  absl::flat_hash_set<uint64_t> cached_ ABSL_GUARDED_BY(snapshot_mu_);

  std::thread thread_;  // last: starts after every member is initialised
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_ENGINE_LOOP_H_
