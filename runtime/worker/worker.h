// Worker: the worker daemon's core, apart from its gRPC edge (ARCHITECTURE.md, "Processes",
// "The P->D handoff"). WorkerServiceImpl (worker_service.h) only translates proto <-> these
// types and absl::Status <-> grpc::Status; tests drive a Worker directly.
//
//   Prefill   (prefill/mixed) runs the prompt and samples the first token; with remote decode
//             the blocks stay leased (by the connector), the lease is bound to the decode worker
//             the router named (KvLeaseTable::BindLease) and the result carries the KvHandle.
//   Decode    (decode/mixed)  has the source authorize the read (AuthorizeRead: the handle is
//             what was issued for this request and this worker), links to it, hands the
//             connector the remote KV (it loads, renews and releases the source's
//             lease), streams the tokens after the first one.
//   ReassignLease  (prefill/mixed) the router replaced a failed decode worker: the request's
//             lease is rebound to the new one.
//   Generate  (mixed)         a whole request here.
//   Abort     drops a request in flight, and a lease held for it after its prefill.
//
// Errors: bad input INVALID_ARGUMENT, a duplicate id ALREADY_EXISTS, a full queue
// RESOURCE_EXHAUSTED, the wrong role FAILED_PRECONDITION, draining UNAVAILABLE, a failed KV load
// with policy fail UNAVAILABLE, a KV handle its source does not honour for this worker
// PERMISSION_DENIED (never recomputed: the handle is not ours), the caller gone CANCELLED (the
// request is aborted, its blocks freed). A request's updates are polled in short slices so a
// cancelled caller is noticed.
//
// Thread safety: thread-safe.
#ifndef TANDEM_RUNTIME_WORKER_WORKER_H_
#define TANDEM_RUNTIME_WORKER_WORKER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http/prometheus.h"
#include "kvtransfer/connector.h"
#include "kvtransfer/kv_handle.h"
#include "kvtransfer/lease_table.h"
#include "runtime/worker/engine_loop.h"
#include "tandem/v1/kv.pb.h"
#include "tandem/v1/router.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::runtime {

struct WorkerOptions {
  std::string worker_id;
  uint64_t epoch = 0;
  tandem::v1::WorkerRole role = tandem::v1::WORKER_ROLE_MIXED;
  std::string address;  // host:port of this worker's services (also its KV endpoint)
  std::string model_id;
  uint64_t kv_layout_hash = 0;
  std::string kv_dtype;  // WorkerInfo.kv_dtype: the KV pool's dtype, named for the router
  absl::Duration default_lease = absl::Seconds(30);
  // The longest lease a caller may ask for (PrefillRequest.lease_ms beyond it is cut to it):
  // the worker, not the caller, bounds how long its blocks can be held.
  absl::Duration max_lease = absl::Minutes(2);
  // A remote-decode Prefill must name its decode worker (the daemon sets it with TLS: a lease
  // bound to no reader would be usable by every decode worker). False: an empty name binds the
  // lease to any reader (--insecure).
  bool require_decode_worker = false;
  absl::Duration kv_load_timeout = absl::Seconds(20);
  // A decode worker whose last `kv_failures_unhealthy` KV loads in a row failed (source
  // unreachable, transfer errors) reports NOT_SERVING, so a misconfigured transport is not
  // hidden behind recomputes; after `kv_unhealthy_probe` it serves again to probe. 0: never.
  int kv_failures_unhealthy = 8;
  absl::Duration kv_unhealthy_probe = absl::Seconds(30);
  // The worker's rank group, told to the router (size 1: a single rank).
  tandem::v1::WorkerGroup group;
  // Fills the per-rank KV transfer counters of WorkerStats (kv_*_per_rank); null: none.
  std::function<void(tandem::v1::WorkerStats*)> rank_kv_stats;
};

const char* RoleName(tandem::v1::WorkerRole role);

// True once the caller of a running call has gone away (its RPC was cancelled).
using CallerGone = std::function<bool()>;
// Receives a request's updates in order; false: the caller cannot take more (it went away).
using UpdateSink = std::function<bool(const RequestUpdate& update)>;

struct PrefillResult {
  // The first token (in new_token_ids), usage counts, and the finish reason when the request
  // ended at its first token (eos, a stop token, max_tokens 1: no handle then).
  RequestUpdate first;
  std::optional<tandem::v1::KvHandle> kv_handle;  // remote decode: the leased KV
  tandem::v1::WorkerPhaseTimes times;             // prefill_micros (the request's trace)
};

class Worker {
 public:
  // The KV connector as the worker core uses it: `leases` (the source side's lease table) and
  // `kv_metrics` (its counters and load records; the engine thread drives the connector itself).
  // `leases`, `kv_metrics` and `links` are all null without disaggregation: then a remote-decode
  // Prefill and Decode are refused. All pointers must outlive the worker.
  Worker(EngineLoop* loop, kvtransfer::KvLeaseTable* leases,
         kvtransfer::KvConnectorMetrics* kv_metrics, kvtransfer::KvSourceLinks* links,
         WorkerOptions options);
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // UNAVAILABLE while draining; FAILED_PRECONDITION when this worker's role cannot serve `rpc`.
  absl::Status Admit(tandem::v1::WorkerRole needed, const char* rpc) const;

  // `lease`: how long the KV stays leased for the decode worker (0: the default);
  // `decode_worker_id`: the decode worker the lease is bound to (see require_decode_worker).
  absl::StatusOr<PrefillResult> Prefill(const std::string& id, RequestSpec spec, bool remote_decode,
                                        absl::Duration lease, const CallerGone& gone,
                                        const std::string& decode_worker_id = "");
  // Streams every update after `first_token` to `sink`; OK once the final one was accepted
  // (an aborted request ends with a kAborted update). `times` (may be null) is filled with the
  // request's phase times before the final update goes to `sink` (the request's trace).
  absl::Status Decode(const std::string& id, RequestSpec spec, const tandem::v1::KvHandle& handle,
                      int32_t first_token, KvLoadFailurePolicy on_kv_failure,
                      const CallerGone& gone, const UpdateSink& sink,
                      tandem::v1::WorkerPhaseTimes* times = nullptr);
  absl::Status Generate(const std::string& id, RequestSpec spec, const CallerGone& gone,
                        const UpdateSink& sink, tandem::v1::WorkerPhaseTimes* times = nullptr);
  // True when `id` was in flight or held a lease.
  bool Abort(const std::string& id);
  // Rebinds lease `lease_id` of request `id` to `decode_worker_id`: NOT_FOUND when the request
  // holds no such lease here. Also while draining (the leases are still served then).
  absl::Status ReassignLease(const std::string& id, uint64_t lease_id,
                             const std::string& decode_worker_id);

  // SIGTERM: refuse new requests (UNAVAILABLE), keep serving the ones in flight.
  void StartDraining() { draining_ = true; }
  bool draining() const { return draining_; }
  int64_t NumInFlight() const { return loop_->NumInFlight(); }
  tandem::v1::ServingStatus status() const;
  tandem::v1::WorkerInfo Info() const;
  tandem::v1::WorkerLoad Load() const;
  tandem::v1::WorkerStats StatsProto() const;
  // Latency histograms of the requests served here (worker_metrics.h renders them): the first
  // token (prefill: the prompt's; decode: after the KV load; mixed: both), the gaps between
  // streamed updates, whole requests, the queue time (arrival to first admission by the
  // scheduler: EngineLoop::QueueTimeSnapshot), and the completed KV loads (decode side, posting
  // to end: KvConnectorStats::load_seconds; empty buckets without a connector), and the model
  // steps (EngineLoop::StepSnapshot).
  struct Latencies {
    http::HistogramSnapshot first_token, inter_token, e2e, queue, kv_load;
    StepMetrics::Snapshot steps;
  };
  Latencies LatencySnapshots() const;
  const WorkerOptions& options() const { return options_; }
  // The address this worker serves on, once its server knows its port (before it is announced).
  void SetAddress(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  std::string address() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Hands `stream`'s updates to `sink` until the request finishes, the caller goes away, or
  // the sink refuses one.
  // `start`: when the call arrived (the first-token and e2e histograms measure from it).
  // `times` (may be null): first token, last token and the KV load, filled before the final
  // update goes to `sink`.
  absl::Status Relay(const std::string& id, RequestStream& stream, absl::Time start,
                     const CallerGone& gone, const UpdateSink& sink,
                     tandem::v1::WorkerPhaseTimes* times);

  // INVALID_ARGUMENT for a decode worker id a lease cannot be bound to.
  absl::Status CheckReader(const std::string& decode_worker_id) const;

  EngineLoop* const loop_;
  kvtransfer::KvLeaseTable* const leases_;
  kvtransfer::KvConnectorMetrics* const kv_metrics_;
  kvtransfer::KvSourceLinks* const links_;
  const WorkerOptions options_;
  // Whether the last kv_failures_unhealthy loads all failed (and the probe time has not come).
  bool KvUnhealthy() const ABSL_LOCKS_EXCLUDED(health_mu_);

  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> kv_link_failures_{0};
  std::atomic<uint64_t> kv_link_recomputes_{0};  // of those, recomputed here
  http::Histogram first_token_, inter_token_, e2e_;
  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  // KV failure streak, followed from the connector's counters each time status() is asked.
  mutable absl::Mutex health_mu_;
  mutable uint64_t seen_completed_ ABSL_GUARDED_BY(health_mu_) = 0;
  mutable uint64_t seen_failures_ ABSL_GUARDED_BY(health_mu_) = 0;
  mutable int64_t failure_streak_ ABSL_GUARDED_BY(health_mu_) = 0;
  mutable absl::Time unhealthy_since_ ABSL_GUARDED_BY(health_mu_) = absl::InfinitePast();
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_WORKER_H_
