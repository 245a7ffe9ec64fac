// RouterServer: the whole router in one object: the public gRPC server (Router), the internal one
// (WorkerRegistry + the admin ListWorkers, mTLS), the worker registry, admission, the
// orchestrator and the health thread. The daemon's main() and the in-process tests both use it.
//
// Planes: `listen` serves only the public Router service (TLS + API keys unless insecure);
// `internal_listen` serves WorkerRegistry and ListWorkers under the internal plane's role policy
// (common/security/internal_policy.h). An insecure router without `internal_listen` serves both
// on `listen` (the legacy single port, for tests and demos only). Workers are called with the
// router's certificate (their WorkerService admits only the router role).
//
// The health thread ticks every min(heartbeat_interval / 2, 100 ms): workers silent for longer
// than worker_timeout become unhealthy and the requests with a call open on them are cancelled
// with UNAVAILABLE, so a hung (not crashed) worker cannot hold a client forever.
//
// Thread safety: Shutdown() may be called from any thread, more than once.
#ifndef TANDEM_ROUTER_GRPC_ROUTER_SERVER_H_
#define TANDEM_ROUTER_GRPC_ROUTER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/grpc_listener.h"
#include "common/security/security_config.h"
#include "router/core/orchestrator.h"
#include "router/core/request_table.h"
#include "router/core/router_metrics.h"
#include "router/core/worker_registry.h"
#include "router/grpc/router_service.h"

namespace tandem::router {

struct RouterOptions {
  // host:port; loopback by default (internal ports never bind all interfaces unless asked).
  // Port 0 picks a free port (see RouterServer::port()).
  std::string listen = "127.0.0.1:0";
  // host:port of the internal port (WorkerRegistry, admin ListWorkers); required with TLS.
  std::string internal_listen;
  // Default: insecure (plain text, no keys). With TLS: the router's certificate (role router),
  // the cluster CA, API keys for the public port.
  security::SecurityConfig security;
  // PEM CA the public port's clients must present certificates from (empty: none asked for).
  std::string public_client_ca_pem;
  RegistryOptions registry;
  OrchestratorOptions orchestrator;
  int max_queue = 1024;  // requests in flight at once; more -> RESOURCE_EXHAUSTED
  // Each gRPC port's connection cap and handshake timeout (the public and the internal one).
  GrpcListenerOptions grpc_ports;
  // Makes each worker's client; empty: the gRPC one (MakeGrpcWorkerClient with `security`).
  // Tests inject fakes.
  WorkerClientFactory worker_clients;
};

class RouterServer {
 public:
  // UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(const RouterOptions& options);
  ~RouterServer();  // Shutdown(0)

  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  int port() const { return port_; }
  // "host:port" with the bound port (the listen host as given).
  const std::string& address() const { return address_; }
  // Where workers register and admins list workers (address() on a single-port router).
  const std::string& internal_address() const { return internal_address_; }

  // Stops accepting requests, lets in-flight ones run for up to `grace`, then cancels them
  // (clients get UNAVAILABLE) and stops the health thread. Idempotent.
  void Shutdown(absl::Duration grace);

  WorkerRegistry& registry() { return registry_; }
  RequestTable& requests() { return requests_; }
  Orchestrator& orchestrator() { return orchestrator_; }
  // Requests' latencies and outcomes plus the workers' state as Prometheus text.
  std::string MetricsText();

 private:
  explicit RouterServer(const RouterOptions& options);
  absl::Status StartServers();
  void HealthLoop();

  const RouterOptions options_;
  RouterMetrics metrics_;  // before orchestrator_ (which records into it)
  WorkerRegistry registry_;
  RequestTable requests_;
  Orchestrator orchestrator_;
  RouterServiceImpl router_service_;
  AdminServiceImpl admin_service_;
  WorkerRegistryServiceImpl registry_service_;
  // The three above behind strict request parsing (registered instead of them; outlive the
  // servers).
  std::unique_ptr<StrictParsingService> strict_router_, strict_admin_, strict_registry_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> internal_server_;  // null on a single-port router
  // The servers' ports, accepted by us (common/grpc_listener.h: a failed accept is retried).
  std::unique_ptr<GrpcListener> listener_, internal_listener_;
  int port_ = 0;
  std::string address_;
  std::string internal_address_;
  absl::Notification stop_health_;
  std::thread health_thread_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_GRPC_ROUTER_SERVER_H_
