// RouterMetrics: what the router measures of the requests it serves (gRPC and HTTP alike: the
// Orchestrator records them) and renders with the registry's view of the workers as Prometheus
// text (`GET /metrics` on --metrics_listen): time to first token, end-to-end latency and
// inter-token gap histograms, requests by outcome, tokens, per-worker health/load gauges, and
// the routing decisions (which worker was chosen, for which role).
// Names follow vLLM's with the `tandem:` prefix.
//
// Thread safety: thread-safe.
#ifndef TANDEM_ROUTER_CORE_ROUTER_METRICS_H_
#define TANDEM_ROUTER_CORE_ROUTER_METRICS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http/prometheus.h"
#include "tandem/v1/router.pb.h"

namespace tandem::router {

class RouterMetrics {
 public:
  RouterMetrics();
  // One finished request: when its first token and last chunk left, its status, token counts.
  void RecordRequest(absl::Duration ttft, absl::Duration e2e, int64_t completion_tokens,
                     int64_t prompt_tokens, const absl::Status& status);
  // The gap between two consecutive chunks of one stream.
  void RecordInterToken(absl::Duration gap);
  // The router chose `worker_id` to serve a request as `role` (PREFILL / DECODE of a P/D pair,
  // MIXED for a whole request); a retry on another worker is a decision of its own.
  void RecordRouting(const std::string& worker_id, v1::WorkerRole role);
  // The families above plus the workers' (`workers`: the registry's ListWorkers answer) and the
  // requests in flight now.
  std::string Render(const v1::ListWorkersResponse& workers, int64_t in_flight) const;

 private:
  http::Histogram ttft_, e2e_, itl_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint64_t> outcomes_ ABSL_GUARDED_BY(mu_);
  uint64_t prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::pair<std::string, int>, uint64_t> routed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_ROUTER_METRICS_H_
