// StartMetricsServer: a daemon's observability plane on its own HTTP port — `GET /metrics`
// (Prometheus text from `metrics`) and `GET /health` (`health` gives the status code and body) —
// for the router's and the workers' --metrics_listen.
#ifndef TANDEM_COMMON_HTTP_METRICS_SERVER_H_
#define TANDEM_COMMON_HTTP_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/http/http_server.h"

namespace tandem::http {

// HOST:PORT -> {host, port}; INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& listen,
                                                          const std::string& flag);

// `metrics` and `health` run on the server's thread (they must be thread-safe and quick).
absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsServer(
    const std::string& listen, const std::string& flag, std::function<std::string()> metrics,
    std::function<std::pair<int, std::string>()> health);

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_METRICS_SERVER_H_
