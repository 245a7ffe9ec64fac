#include "common/http/metrics_server.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::http {

absl::StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& listen,
                                                          const std::string& flag) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be HOST:PORT, got '", listen, "'"));
  }
  return std::make_pair(listen.substr(0, colon), port);
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsServer(
    const std::string& listen, const std::string& flag, std::function<std::string()> metrics,
    std::function<std::pair<int, std::string>()> health) {
  absl::StatusOr<std::pair<std::string, int>> address = ParseHostPort(listen, flag);
  if (!address.ok()) return address.status();
  HttpServerOptions options;
  options.address = address->first;
  options.port = address->second;
  options.threads = 1;
  options.max_body_bytes = 4096;
  std::map<std::pair<std::string, std::string>, Handler> routes;
  routes[{"GET", "/metrics"}] = [metrics](const Request&, std::shared_ptr<Responder> r) {
    Response res;
    res.content_type = "text/plain; version=0.0.4; charset=utf-8";
    res.body = metrics();
    r->Reply(std::move(res));
  };
  routes[{"GET", "/health"}] = [health](const Request&, std::shared_ptr<Responder> r) {
    auto [status, body] = health();
    Response res;
    res.status = status;
    res.content_type = "text/plain";
    res.body = std::move(body);
    r->Reply(std::move(res));
  };
  return HttpServer::Start(options, std::move(routes));
}

}  // namespace tandem::http
