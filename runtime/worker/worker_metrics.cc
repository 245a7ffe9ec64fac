#include "runtime/worker/worker_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/http/metrics_server.h"
#include "common/http/prometheus.h"
#include "runtime/engine/speculative.h"

namespace tandem::runtime {

std::string WorkerMetricsText(const tandem::v1::WorkerStats& s,
                              const Worker::Latencies& latencies) {
  const http::Labels labels = {{"model_name", s.info().model_id()},
                               {"worker_id", s.info().worker_id()},
                               {"role", tandem::v1::WorkerRole_Name(s.info().role())}};
  http::PrometheusText p;
  const tandem::v1::WorkerLoad& load = s.load();
  p.Gauge("tandem:num_requests_running", "Requests in the running batch.", load.num_running(),
          labels);
  p.Gauge("tandem:num_requests_waiting", "Requests waiting to be scheduled.", load.num_waiting(),
          labels);
  const double total = load.kv_blocks_total();
  p.Gauge("tandem:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).",
          total > 0 ? 1.0 - load.kv_blocks_free() / total : 0.0, labels);
  p.Gauge("tandem:kv_blocks_leased", "KV blocks held under leases for decode workers.",
          load.kv_blocks_leased(), labels);
  p.Gauge("tandem:worker_serving", "1 while the worker is SERVING, else 0.",
          s.status() == tandem::v1::SERVING_STATUS_SERVING ? 1 : 0, labels);
  p.Counter("tandem:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            s.prefix_cache_queried_tokens(), labels);
  p.Counter("tandem:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
            s.prefix_cache_hit_tokens(), labels);
  p.Counter("tandem:request_success_total", "Requests that finished.", s.requests_finished(),
            labels);
  p.Counter("tandem:request_aborted_total", "Requests aborted (cancelled, failed).",
            s.requests_aborted(), labels);
  p.Counter("tandem:kv_leases_granted_total", "KV leases granted (prefill side).",
            s.leases_granted(), labels);
  p.Counter("tandem:kv_leases_released_total", "KV leases released by their reader.",
            s.leases_released(), labels);
  p.Counter("tandem:kv_leases_expired_total", "KV leases that expired unreleased.",
            s.leases_expired(), labels);
  p.Counter("tandem:kv_transfer_bytes_sent_total", "KV bytes read from this worker.",
            s.kv_bytes_sent(), labels);
  p.Counter("tandem:kv_transfer_bytes_received_total", "KV bytes this worker read.",
            s.kv_bytes_received(), labels);
  p.Counter("tandem:kv_loads_total", "Completed KV loads (decode side).", s.kv_loads_completed(),
            labels);
  p.Counter("tandem:kv_load_seconds_total", "Time of the completed KV loads, summed.",
            s.kv_load_micros() / 1e6, labels);
  p.Counter("tandem:kv_load_failures_total", "KV loads that failed.", s.kv_load_failures(), labels);
  // vLLM-style KV-transfer names (the counters above say the same per direction / as leases).
  p.Counter("tandem:kv_transfer_bytes_total", "KV bytes moved by this worker's transfers.",
            s.kv_bytes_received() + s.kv_bytes_sent(), labels);
  p.Counter("tandem:kv_transfer_failures_total",
            "KV loads that failed (source unreachable, transfer error, deadline).",
            s.kv_load_failures(), labels);
  p.Counter("tandem:kv_lease_expiries_total",
            "KV leases that expired before their reader released them.", s.leases_expired(),
            labels);
  p.Counter("tandem:kv_recomputes_total",
            "Requests whose KV load failed and whose prompt was prefilled here instead.",
            s.kv_recomputes(), labels);
  // Speculative decoding (vLLM's spec_decode names): counters, and the rates they give.
  SpecStats spec;
  spec.verify_passes = s.spec_verify_passes();
  spec.drafted_tokens = s.spec_draft_tokens();
  spec.accepted_tokens = s.spec_accepted_tokens();
  p.Counter("tandem:spec_decode_num_drafts_total",
            "Verify passes: a request's step that verified at least one draft token.",
            spec.verify_passes, labels);
  p.Counter("tandem:spec_decode_num_draft_tokens_total", "Draft tokens fed to the model.",
            spec.drafted_tokens, labels);
  p.Counter("tandem:spec_decode_num_accepted_tokens_total", "Draft tokens accepted.",
            spec.accepted_tokens, labels);
  p.Gauge("tandem:spec_decode_acceptance_rate",
          "Accepted / drafted tokens since the worker started (0 without drafts).",
          spec.acceptance_rate(), labels);
  p.Gauge("tandem:spec_decode_mean_accepted_length",
          "Tokens a verify pass yields on average: 1 + accepted / passes (0 without passes).",
          spec.mean_accepted_length(), labels);
  // Mixture-of-experts load: one series per expert (global id), for placement (EPLB) decisions.
  for (int e = 0; e < s.moe_expert_tokens_size(); ++e) {
    http::Labels expert = labels;
    expert.emplace_back("expert", absl::StrCat(e));
    p.Counter("tandem:moe_expert_tokens_total",
              "Tokens routed to the expert, summed over the MoE layers (one per token and chosen "
              "expert; prefill and decode).",
              static_cast<double>(s.moe_expert_tokens(e)), expert);
  }
  p.Histogram("tandem:kv_transfer_duration_seconds",
              "A completed KV load, from posting the read to seeing it end (decode side).",
              latencies.kv_load, labels);
  p.Histogram("tandem:request_queue_time_seconds",
              "From a request's arrival at the worker to the scheduler admitting it (to run, or "
              "to load its remote KV).",
              latencies.queue, labels);
  p.Histogram("tandem:worker_time_to_first_token_seconds",
              "From a call's arrival to its first token here (prefill: the prompt; decode: after "
              "the KV load).",
              latencies.first_token, labels);
  p.Histogram("tandem:worker_inter_token_latency_seconds", "Gap between streamed updates.",
              latencies.inter_token, labels);
  p.Histogram("tandem:worker_e2e_request_latency_seconds", "A call from arrival to its end.",
              latencies.e2e, labels);
  // The model steps (step_trace.h): decode-only steps and steps that fed prompt tokens apart, so
  // that a decode ITL tail shows which kind of step it is.
  for (const auto& [kind, seconds] : {std::pair{"decode", &latencies.steps.decode_seconds},
                                      std::pair{"prefill", &latencies.steps.prefill_seconds}}) {
    http::Labels with_kind = labels;
    with_kind.emplace_back("kind", kind);
    p.Histogram("tandem:step_duration_seconds",
                "A model step's wall time on the engine thread; kind=prefill when it fed prompt "
                "tokens (with or without decodes), else decode.",
                *seconds, with_kind);
  }
  p.Histogram("tandem:iteration_tokens_total", "Tokens a model step fed (prompt, decode, drafts).",
              latencies.steps.tokens, labels);
  return p.text();
}

absl::StatusOr<std::unique_ptr<http::HttpServer>> StartWorkerHttp(const std::string& listen,
                                                                  const Worker* worker) {
  return http::StartMetricsServer(
      listen, "metrics_listen",
      [worker] { return WorkerMetricsText(worker->StatsProto(), worker->LatencySnapshots()); },
      [worker]() -> std::pair<int, std::string> {
        const tandem::v1::ServingStatus status = worker->status();
        return {status == tandem::v1::SERVING_STATUS_SERVING ? 200 : 503,
                tandem::v1::ServingStatus_Name(status) + "\n"};
      });
}

}  // namespace tandem::runtime
