// Orchestrator: serves admitted requests end to end (ARCHITECTURE.md, "The P->D handoff").
//
//   route     registry snapshot -> ChooseRoute (P by cached prefix then load, D by free blocks
//             then load; a mixed worker when no P/D pair exists)
//   validate  the shape every entry shares (ValidateRequestShape: ids, sizes, sampling ranges),
//             then the chosen model's vocab_size / max_model_len (before any worker call)
//   P->D      P.Prefill(remote_decode) -> first token to the client at once -> if not finished,
//             D.Decode(kv_handle) and relay its stream
//   mixed     W.Generate and relay its stream
// The client's last message carries finish_reason and usage counted by the router (prompt and
// completion tokens; cached prompt tokens as the prefill/mixed worker reported them).
//
// Asynchronous: Start() returns at once. Each request is a state machine (GenerateFlow,
// generate_flow.h) advanced by its worker calls' completion callbacks, one step at a time on the
// request's strand (executor.h): on the completion's own thread (gRPC's callback threads) when the
// strand is idle, else on a fixed pool of `threads`. A request waiting for a worker holds no
// thread, so the router's thread count does not grow with the requests in flight.
//
// Failures, never hangs: every worker call has the request deadline and inherits the client's
// cancellation. A worker that is unreachable or breaks its stream (UNAVAILABLE, CANCELLED that we
// did not cause, UNKNOWN) is marked unhealthy and the client gets UNAVAILABLE; when nothing was
// produced yet by that worker (no token from this phase), the phase is retried on another worker
// (up to max_attempts; a decode worker is replaced after P was asked to move the KV lease to
// the new one, WorkerService.ReassignLease; with none free, a decode worker whose link is down is
// waited for within decode_wait). Client cancel, Router.Abort and deadline send Abort
// to P and D (async, best effort). Router.Abort ends the stream with FINISH_REASON_ABORTED and OK
// status. Worker errors that are about the request (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...)
// pass through with the worker named.
//
// Thread safety: Start() from any thread, concurrently. A request's sink is called on the threads
// that run its steps (above), one call at a time.
#ifndef TANDEM_ROUTER_CORE_ORCHESTRATOR_H_
#define TANDEM_ROUTER_CORE_ORCHESTRATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/core/executor.h"
#include "router/core/request_table.h"
#include "router/core/worker_client.h"
#include "router/core/worker_registry.h"
#include "tandem/v1/router.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

class RouterMetrics;

struct OrchestratorOptions {
  absl::Duration request_timeout = absl::Minutes(10);
  // Deadline of the best-effort Abort (and ReassignLease) calls sent to workers.
  absl::Duration abort_timeout = absl::Seconds(2);
  uint32_t lease_ms = 0;  // PrefillRequest.lease_ms; 0 = the worker's default
  v1::KvLoadFailurePolicy on_kv_failure = v1::KV_LOAD_FAILURE_POLICY_RECOMPUTE;
  // Workers tried per phase when the previous one was unreachable before producing output.
  int max_attempts = 2;
  // A request that finds no route while a worker is only in its short failure backoff (a
  // restarted worker about to register again, one whose channel is reconnecting) routes again
  // every 50 ms for up to this long, and at most half of the time left to its deadline, before
  // it fails UNAVAILABLE. Workers that stopped heartbeating are not waited for. 0: never wait.
  absl::Duration route_wait = absl::Seconds(2);
  // A decode worker that failed before a token of its own while its connection is down (a link
  // drop, a restart on the same address) is waited for, polling every 50 ms for another free
  // decode worker or for its connection to be back, for up to this long and at most half of the
  // time left to the deadline; then the request fails UNAVAILABLE. A budget of its own, not
  // route_wait's: the client already has P's first token, and P holds the prompt's KV under a
  // lease (the workers' default --lease_ms is 30 s, vLLM's NIXL lease too), so a decode worker
  // back within this finds the KV still there (past the lease it recomputes, or fails, by
  // on_kv_failure). A link drop is seen ~2 s after it began (keepalive), and the TCP connect
  // that ends it may wait out a SYN retransmission (1, 2, 4 s ...). 0: never wait.
  absl::Duration decode_wait = absl::Seconds(20);
  // Records each request's latencies and outcome (may be null; outlives the Orchestrator).
  RouterMetrics* metrics = nullptr;
  // Writes each finished request's RequestTrace as one JSON line to stderr (--log_format=json).
  bool log_trace_json = false;
  // Threads running the requests' steps that do not run on a completion's own thread (their
  // start, timed steps, steps queued behind a busy strand), with their sink's work (the HTTP API
  // detokenizes and formats SSE there). Fixed: the requests in flight do not add any.
  int threads = 2;
};

// Where a request's chunks and its end go. Called on the threads that run the request's steps,
// one call at a time per request; must not block (it would hold one of the few threads that run
// every request).
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // Queues `chunk` for the client; false when the client is gone (the request then ends
  // CANCELLED and is aborted on its workers).
  virtual bool Send(const v1::GenerateResponse& chunk) = 0;
  // The request's final status for the client (OK after a finish). Runs once, last: every worker
  // call of the request has ended and its admission (slot and id) is released.
  virtual void Finish(const absl::Status& status) = 0;
};

class Orchestrator {
 public:
  Orchestrator(WorkerRegistry* registry, OrchestratorOptions options);
  // Cancels the requests still running (UNAVAILABLE), waits for them to end, then waits
  // (bounded by abort_timeout) for outstanding Abort calls.
  ~Orchestrator();

  Orchestrator(const Orchestrator&) = delete;
  Orchestrator& operator=(const Orchestrator&) = delete;

  // Starts serving `request` (request_id = the admission's id on the workers) and returns at
  // once. A request that fails ValidateRequestShape ends INVALID_ARGUMENT naming the field,
  // before any worker is called, whichever entry it came from. The orchestrator keeps `admission`
  // until the request ends and `sink` until sink->Finish returned. `client` may be null (no client
  // cancellation to inherit); else it must stay valid until sink->Finish was called.
  void Start(v1::GenerateRequest request, Admission admission, const CallerContext* client,
             std::shared_ptr<ResponseSink> sink);

  // Best effort, returns at once: Abort(request_id) on `worker` with abort_timeout.
  void SendAbort(const WorkerRef& worker, const std::string& request_id);

  const OrchestratorOptions& options() const { return options_; }
  WorkerRegistry& registry() const { return *registry_; }
  Executor& executor() { return executor_; }

 private:
  // Abort calls in flight; shared with their callbacks so a late one never outlives it.
  struct PendingAborts {
    absl::Mutex mu;
    int count ABSL_GUARDED_BY(mu) = 0;
  };

  WorkerRegistry* const registry_;
  const OrchestratorOptions options_;
  const std::shared_ptr<PendingAborts> aborts_;
  absl::Mutex mu_;
  // The requests running now, by a key of their own (cancelled by the destructor).
  absl::flat_hash_map<uint64_t, std::shared_ptr<InFlightRequest>> running_ ABSL_GUARDED_BY(mu_);
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 0;
  Executor executor_;  // last: its threads stop before anything above is destroyed
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_ORCHESTRATOR_H_
