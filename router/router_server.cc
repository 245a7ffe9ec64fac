#include "router/router_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "router/grpc_worker_client.h"
#include "tandem/v1/limits.h"

namespace tandem::router {
namespace {

absl::Status ValidateOptions(const RouterOptions& o) {
  if (o.max_queue < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_queue must be >= 1, got ", o.max_queue));
  }
  if (o.registry.heartbeat_interval <= absl::ZeroDuration() ||
      o.registry.worker_timeout <= o.registry.heartbeat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 0 < heartbeat_interval < worker_timeout, got ",
                     absl::FormatDuration(o.registry.heartbeat_interval), " and ",
                     absl::FormatDuration(o.registry.worker_timeout)));
  }
  if (o.orchestrator.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("request_timeout must be > 0");
  }
  if (o.registry.prefix_index_max_blocks < 1) {
    return absl::InvalidArgumentError("prefix_index_max_blocks must be >= 1");
  }
  return absl::OkStatus();
}

// "host:PORT" with the bound port replacing the requested one.
std::string WithPort(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":", port);
}

OrchestratorOptions WithMetrics(OrchestratorOptions options, RouterMetrics* metrics) {
  if (options.metrics == nullptr) options.metrics = metrics;
  return options;
}

}  // namespace

std::string RouterServer::MetricsText() {
  return metrics_.Render(registry_.List(), static_cast<int64_t>(requests_.size()));
}

RouterServer::RouterServer(const RouterOptions& options)
    : options_(options),
      registry_(options.registry, absl::Now,
                options.worker_clients ? options.worker_clients : MakeGrpcWorkerClient),
      requests_(options.max_queue),
      orchestrator_(&registry_, WithMetrics(options.orchestrator, &metrics_)),
      router_service_(&registry_, &requests_, &orchestrator_),
      registry_service_(&registry_, options.registry.heartbeat_interval) {}

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  std::unique_ptr<RouterServer> router(new RouterServer(options));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &router->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(v1::kMaxGrpcMessageBytes));
  builder.SetMaxSendMessageSize(static_cast<int>(v1::kMaxGrpcMessageBytes));
  builder.RegisterService(&router->router_service_);
  builder.RegisterService(&router->registry_service_);
  router->server_ = builder.BuildAndStart();
  if (router->server_ == nullptr || router->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  router->address_ = WithPort(options.listen, router->port_);
  router->health_thread_ = std::thread([r = router.get()] { r->HealthLoop(); });
  return router;
}

RouterServer::~RouterServer() { Shutdown(absl::ZeroDuration()); }

void RouterServer::HealthLoop() {
  const absl::Duration tick =
      std::min(options_.registry.heartbeat_interval / 2, absl::Milliseconds(100));
  while (!stop_health_.WaitForNotificationWithTimeout(tick)) {
    for (const std::string& id : registry_.CheckTimeouts()) {
      const int n = requests_.CancelUsingWorker(
          id, absl::UnavailableError(absl::StrCat("worker ", id, " stopped heartbeating")));
      if (n > 0) LOG(WARNING) << "cancelled " << n << " requests on lost worker " << id;
    }
  }
}

void RouterServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  router_service_.StartDraining();
  // New calls are refused from here on; in-flight ones get `grace`, then are cancelled (the
  // cancel propagates to their worker calls).
  if (server_ != nullptr) {
    const absl::Time deadline = absl::Now() + grace;
    // grpc's Shutdown(deadline) only cancels at the deadline; cancel our own calls too so the
    // handlers return with a clear reason.
    std::thread canceller([this, deadline] {
      if (!stop_health_.WaitForNotificationWithTimeout(deadline - absl::Now())) {
        requests_.CancelAll(absl::UnavailableError("the router is shutting down"));
      }
    });
    server_->Shutdown(absl::ToChronoTime(deadline));
    stop_health_.Notify();
    canceller.join();
  } else {
    stop_health_.Notify();
  }
  if (health_thread_.joinable()) health_thread_.join();
}

}  // namespace tandem::router
