// gRPC plumbing of the router: the public Router service and the internal WorkerRegistry service
// (proto/tandem/v1/router.proto). Handlers only convert between gRPC and the absl-typed core
// (RequestTable, Orchestrator, WorkerRegistry); grpc::Status appears nowhere else.
//
// Router.Generate: shape validation (INVALID_ARGUMENT) -> admission (RESOURCE_EXHAUSTED,
// ALREADY_EXISTS) -> Orchestrator::Start. Router.Health is SERVING while some route exists
// (a healthy P/D pair or mixed worker), NOT_SERVING when none does, DRAINING during shutdown.
//
// Generate is a callback (reactor) method: the stream is a ServerWriteReactor fed by the
// asynchronous Orchestrator, one write in flight at a time (chunks queue behind it), and the
// client's cancel (OnCancel) cancels the request. An open stream holds no thread. The unary
// methods stay synchronous (they return at once).
//
// Authentication (public port): with API keys configured every call needs a valid
// `authorization: Bearer` key (UNAUTHENTICATED otherwise); the key's name owns the request ids
// and aborts (RequestTable). Without keys but with a required client certificate, its name does.
// ListWorkers on the public port needs an admin key (or an admin certificate), except in the
// legacy open mode (--insecure without keys). The internal port serves ListWorkers through
// AdminServiceImpl, where the mTLS policy already admitted only admin certificates.
// WorkerRegistryServiceImpl passes the caller's certificate identity to WorkerRegistry, which
// alone decides who may register or heartbeat for a worker id (worker_registry.h, "Identity").
//
// Thread safety: handlers run concurrently on gRPC's threads; the core objects are thread-safe.
#ifndef TANDEM_ROUTER_GRPC_ROUTER_SERVICE_H_
#define TANDEM_ROUTER_GRPC_ROUTER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/grpc_strict_parse.h"
#include "common/security/security_config.h"
#include "router/core/orchestrator.h"
#include "router/core/request_table.h"
#include "router/core/worker_registry.h"
#include "tandem/v1/router.grpc.pb.h"

namespace tandem::router {

// Who called the public port.
struct PublicCaller {
  std::string owner;  // "key:NAME", "cert:NAME" or "" (anonymous)
  bool admin = false;
};

class RouterServiceImpl final : public v1::Router::Service {
 public:
  // `security` must outlive the service; `client_certs`: the public port requires client
  // certificates (their names identify callers when there are no API keys).
  RouterServiceImpl(WorkerRegistry* registry, RequestTable* requests, Orchestrator* orchestrator,
                    const security::SecurityConfig* security, bool client_certs)
      : registry_(registry),
        requests_(requests),
        orchestrator_(orchestrator),
        security_(security),
        client_certs_(client_certs) {}

  // After this, Generate answers UNAVAILABLE and Health DRAINING.
  void StartDraining() { draining_.store(true); }

  // Router.Generate's reactor (registered by StrictRouterService as a callback method).
  grpc::ServerWriteReactor<v1::GenerateResponse>* StartGenerate(grpc::CallbackServerContext* ctx,
                                                                const v1::GenerateRequest* request);
  grpc::Status Abort(grpc::ServerContext* ctx, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;

 private:
  // UNAUTHENTICATED (generic) when keys are configured and the call has no valid one.
  absl::StatusOr<PublicCaller> Authenticate(const grpc::ServerContextBase& ctx) const;

  WorkerRegistry* const registry_;
  RequestTable* const requests_;
  Orchestrator* const orchestrator_;
  const security::SecurityConfig* const security_;
  const bool client_certs_;
  std::atomic<bool> draining_{false};
};

// The internal port's admin calls (only ListWorkers; the rest of Router is UNIMPLEMENTED there).
class AdminServiceImpl final : public v1::Router::Service {
 public:
  explicit AdminServiceImpl(WorkerRegistry* registry) : registry_(registry) {}
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  WorkerRegistry* const registry_;
};

class WorkerRegistryServiceImpl final : public v1::WorkerRegistry::Service {
 public:
  WorkerRegistryServiceImpl(WorkerRegistry* registry, absl::Duration heartbeat_interval,
                            const security::SecurityConfig* security)
      : registry_(registry), heartbeat_interval_(heartbeat_interval), security_(security) {}

  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;

 private:
  // The caller as the registry sees it: its certificate's identity (none with --insecure).
  // UNAUTHENTICATED (generic) when TLS is on and the call has no readable identity.
  absl::StatusOr<RegistryCaller> CallerOf(const grpc::ServerContext& ctx) const;

  WorkerRegistry* const registry_;
  const absl::Duration heartbeat_interval_;
  const security::SecurityConfig* const security_;
};

// The services above behind strict request parsing (common/grpc_strict_parse.h): request bytes
// that do not parse are INVALID_ARGUMENT. Register the result instead of `service` (which must
// outlive it); an error when the list below misses a method of the proto service. The public
// service's Generate is the callback method StartGenerate; the admin service's Generate is the
// base class's (UNIMPLEMENTED).
absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictRouterService(
    RouterServiceImpl* service);
absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictAdminService(AdminServiceImpl* service);
absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictRegistryService(
    v1::WorkerRegistry::Service* service);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_GRPC_ROUTER_SERVICE_H_
