// Orchestrator: serves one admitted request end to end (ARCHITECTURE.md, "The P->D handoff").
//
//   route     registry snapshot -> ChooseRoute (P by cached prefix then load, D by free blocks
//             then load; a mixed worker when no P/D pair exists)
//   validate  against the chosen model's vocab_size / max_model_len (before any worker call)
//   P->D      P.Prefill(remote_decode) -> first token to the client at once -> if not finished,
//             D.Decode(kv_handle) and relay its stream
//   mixed     W.Generate and relay its stream
// The client's last message carries finish_reason and usage counted by the router (prompt and
// completion tokens; cached prompt tokens as the prefill/mixed worker reported them).
//
// Failures, never hangs: every worker call has the request deadline and inherits the client's
// cancellation. A worker that is unreachable or breaks its stream (UNAVAILABLE, CANCELLED that we
// did not cause, UNKNOWN) is marked unhealthy and the client gets UNAVAILABLE; when nothing was
// produced yet by that worker (no token from this phase), the phase is retried on another worker
// (up to max_attempts). Client cancel, Router.Abort and deadline send Abort to P and D (async,
// best effort). Router.Abort ends the stream with FINISH_REASON_ABORTED and OK status. Worker
// errors that are about the request (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...) pass through with
// the worker named.
//
// Thread safety: Generate() may run concurrently from many threads; one call per request.
#ifndef TANDEM_ROUTER_ORCHESTRATOR_H_
#define TANDEM_ROUTER_ORCHESTRATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/request_table.h"
#include "router/worker_client.h"
#include "router/worker_registry.h"
#include "tandem/v1/router.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

class RouterMetrics;

struct OrchestratorOptions {
  absl::Duration request_timeout = absl::Minutes(10);
  // Deadline of the best-effort Abort calls sent to workers.
  absl::Duration abort_timeout = absl::Seconds(2);
  uint32_t lease_ms = 0;  // PrefillRequest.lease_ms; 0 = the worker's default
  v1::KvLoadFailurePolicy on_kv_failure = v1::KV_LOAD_FAILURE_POLICY_RECOMPUTE;
  // Workers tried per phase when the previous one was unreachable before producing output.
  int max_attempts = 2;
  // Records each request's latencies and outcome (may be null; outlives the Orchestrator).
  RouterMetrics* metrics = nullptr;
  // Writes each finished request's RequestTrace as one JSON line to stderr (--log_format=json).
  bool log_trace_json = false;
};

// Where a request's chunks go. Send returns false when the client is gone.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual bool Send(const v1::GenerateResponse& chunk) = 0;
};

class Orchestrator {
 public:
  Orchestrator(WorkerRegistry* registry, OrchestratorOptions options);
  // Waits (bounded by abort_timeout) for outstanding Abort calls.
  ~Orchestrator();

  Orchestrator(const Orchestrator&) = delete;
  Orchestrator& operator=(const Orchestrator&) = delete;

  // Serves `request` (already shape-validated; request_id final). `client` may be null (no
  // client cancellation to inherit). Returns the status for the client; OK after a finish.
  absl::Status Generate(const v1::GenerateRequest& request, InFlightRequest& flight,
                        const CallerContext* client, ResponseSink& sink);

  // Best effort, returns at once: Abort(request_id) on `worker` with abort_timeout.
  void SendAbort(const WorkerRef& worker, const std::string& request_id);

  const OrchestratorOptions& options() const { return options_; }
  WorkerRegistry& registry() const { return *registry_; }

 private:
  // Abort calls in flight; shared with their callbacks so a late one never outlives it.
  struct PendingAborts {
    absl::Mutex mu;
    int count ABSL_GUARDED_BY(mu) = 0;
  };

  WorkerRegistry* const registry_;
  const OrchestratorOptions options_;
  const std::shared_ptr<PendingAborts> aborts_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ORCHESTRATOR_H_
