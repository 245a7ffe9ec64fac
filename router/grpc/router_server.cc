#include "router/grpc/router_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_keepalive.h"
#include "common/logging.h"
#include "common/security/grpc_security.h"
#include "common/status_macros.h"
#include "router/grpc/grpc_worker_client.h"
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
  if (!o.security.insecure && o.internal_listen.empty()) {
    return absl::InvalidArgumentError(
        "with TLS the router needs --internal_listen (WorkerRegistry and admin calls are not "
        "served on the public port)");
  }
  if (!o.security.insecure && !o.security.has_client_cert()) {
    return absl::InvalidArgumentError("with TLS the router needs its certificate (--tls_cert)");
  }
  if (!o.internal_listen.empty() && o.internal_listen == o.listen &&
      !absl::EndsWith(o.listen, ":0")) {
    return absl::InvalidArgumentError("--internal_listen must differ from --listen");
  }
  return absl::OkStatus();
}

// "host:PORT" with the bound port replacing the requested one.
std::string WithPort(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":", port);
}

WorkerClientFactory ClientFactory(const RouterOptions& options) {
  if (options.worker_clients) return options.worker_clients;
  return [security = options.security](const std::string& address) {
    return MakeGrpcWorkerClient(address, security);
  };
}

void SetMessageLimits(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(static_cast<int>(v1::kMaxGrpcMessageBytes));
  builder.SetMaxSendMessageSize(static_cast<int>(v1::kMaxGrpcMessageBytes));
  AllowKeepalivePings(builder);  // workers' registration channels ping every second
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
      registry_(options.registry, absl::Now, ClientFactory(options)),
      requests_(options.max_queue),
      orchestrator_(&registry_, WithMetrics(options.orchestrator, &metrics_)),
      router_service_(&registry_, &requests_, &orchestrator_, &options_.security,
                      !options.public_client_ca_pem.empty()),
      admin_service_(&registry_),
      registry_service_(&registry_, options.registry.heartbeat_interval, &options_.security) {}

absl::Status RouterServer::StartServers() {
  const bool single_port = options_.internal_listen.empty();
  ASSIGN_OR_RETURN(strict_router_, StrictRouterService(&router_service_));
  ASSIGN_OR_RETURN(strict_admin_, StrictAdminService(&admin_service_));
  ASSIGN_OR_RETURN(strict_registry_, StrictRegistryService(&registry_service_));
  grpc::ServerBuilder builder;
  ASSIGN_OR_RETURN(
      listener_, GrpcListener::Add(options_.listen,
                                   security::PublicServerCredentials(options_.security,
                                                                     options_.public_client_ca_pem),
                                   &builder, options_.grpc_ports));
  port_ = listener_->port();
  SetMessageLimits(builder);
  builder.RegisterService(strict_router_.get());
  if (single_port) builder.RegisterService(strict_registry_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  listener_->Start();
  address_ = WithPort(options_.listen, port_);
  if (single_port) {
    internal_address_ = address_;
    return absl::OkStatus();
  }
  grpc::ServerBuilder internal;
  ASSIGN_OR_RETURN(internal_listener_,
                   GrpcListener::Add(options_.internal_listen,
                                     security::InternalServerCredentials(options_.security),
                                     &internal, options_.grpc_ports));
  SetMessageLimits(internal);
  internal.RegisterService(strict_registry_.get());
  internal.RegisterService(strict_admin_.get());
  internal_server_ = internal.BuildAndStart();
  if (internal_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.internal_listen));
  }
  internal_listener_->Start();
  internal_address_ = WithPort(options_.internal_listen, internal_listener_->port());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  std::unique_ptr<RouterServer> router(new RouterServer(options));
  if (absl::Status s = router->StartServers(); !s.ok()) return s;
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
    if (internal_server_ != nullptr) internal_server_->Shutdown(absl::ToChronoTime(deadline));
    stop_health_.Notify();
    canceller.join();
  } else {
    stop_health_.Notify();
  }
  if (health_thread_.joinable()) health_thread_.join();
}

}  // namespace tandem::router
