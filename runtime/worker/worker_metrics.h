// The worker's HTTP plane: `GET /metrics` (Prometheus text, names after vLLM's with the
// `tandem:` prefix so existing dashboards map over) and `GET /health` (200 while SERVING, 503
// otherwise, with the status in the body), served by common/http on --metrics_listen.
//
// Thread safety: WorkerMetricsText is pure; the server calls the Worker's thread-safe getters.
#ifndef TANDEM_RUNTIME_WORKER_WORKER_METRICS_H_
#define TANDEM_RUNTIME_WORKER_WORKER_METRICS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/http/http_server.h"
#include "runtime/worker/worker.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::runtime {

// The metric families of one worker's stats and latency histograms (labels: model_name,
// worker_id, role).
std::string WorkerMetricsText(const tandem::v1::WorkerStats& stats,
                              const Worker::Latencies& latencies);

// Serves /metrics and /health of `worker` (outliving the server) on `listen` (HOST:PORT; port 0 =
// any free one).
absl::StatusOr<std::unique_ptr<http::HttpServer>> StartWorkerHttp(const std::string& listen,
                                                                  const Worker* worker);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_WORKER_METRICS_H_
