#include "router/core/router_metrics.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem::router {
RouterMetrics::RouterMetrics()
    : ttft_(http::LatencyBuckets()),
      e2e_(http::LatencyBuckets()),
      itl_(http::InterTokenBuckets()) {}

void RouterMetrics::RecordRequest(absl::Duration ttft, absl::Duration e2e,
                                  int64_t completion_tokens, int64_t prompt_tokens,
                                  const absl::Status& status) {
  if (completion_tokens > 0) ttft_.Observe(absl::ToDoubleSeconds(ttft));
  e2e_.Observe(absl::ToDoubleSeconds(e2e));
  const std::string outcome =
      status.ok() ? "ok" : absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
  absl::MutexLock lock(&mu_);
  ++outcomes_[outcome];
  prompt_tokens_ += prompt_tokens;
  generation_tokens_ += completion_tokens;
}

void RouterMetrics::RecordInterToken(absl::Duration gap) {
  itl_.Observe(absl::ToDoubleSeconds(gap));
}

void RouterMetrics::RecordRouting(const std::string& worker_id, v1::WorkerRole role) {
  absl::MutexLock lock(&mu_);
  ++routed_[{worker_id, static_cast<int>(role)}];
}

std::string RouterMetrics::Render(const v1::ListWorkersResponse& workers, int64_t in_flight) const {
  http::PrometheusText p;
  p.Gauge("tandem:router_requests_in_flight", "Requests the router is serving now.", in_flight);
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [outcome, n] : outcomes_) {
      p.Counter("tandem:router_requests_total", "Requests finished, by outcome (status code).", n,
                {{"outcome", outcome}});
    }
    p.Counter("tandem:prompt_tokens_total", "Prompt tokens of finished requests.", prompt_tokens_);
    p.Counter("tandem:generation_tokens_total", "Tokens streamed to clients.", generation_tokens_);
    std::vector<std::pair<std::string, int>> routed;
    for (const auto& [key, n] : routed_) routed.push_back(key);
    std::sort(routed.begin(), routed.end());
    for (const auto& key : routed) {
      p.Counter(
          "tandem:routing_decisions_total",
          "Requests routed to a worker, by the role it served them in (a retry counts again).",
          routed_.at(key),
          {{"worker_id", key.first},
           {"role", v1::WorkerRole_Name(static_cast<v1::WorkerRole>(key.second))}});
    }
  }
  p.Histogram("tandem:time_to_first_token_seconds", "Time from arrival to the first token.",
              ttft_.Snapshot());
  p.Histogram("tandem:e2e_request_latency_seconds", "Time from arrival to the last chunk.",
              e2e_.Snapshot());
  p.Histogram("tandem:inter_token_latency_seconds", "Gap between consecutive streamed chunks.",
              itl_.Snapshot());
  for (const v1::WorkerEntry& w : workers.workers()) {
    const http::Labels labels = {{"worker_id", w.info().worker_id()},
                                 {"role", v1::WorkerRole_Name(w.info().role())}};
    p.Gauge("tandem:worker_healthy", "1 when the router routes to the worker.", w.healthy() ? 1 : 0,
            labels);
    p.Gauge("tandem:worker_num_requests_running", "Running requests the worker reported.",
            w.load().num_running(), labels);
    p.Gauge("tandem:worker_num_requests_waiting", "Waiting requests the worker reported.",
            w.load().num_waiting(), labels);
  }
  return p.text();
}

}  // namespace tandem::router
