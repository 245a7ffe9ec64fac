// gRPC plumbing of the router: the public Router service and the internal WorkerRegistry service
// (proto/tandem/v1/router.proto). Handlers only convert between gRPC and the absl-typed core
// (RequestTable, Orchestrator, WorkerRegistry); grpc::Status appears nowhere else.
//
// Router.Generate: shape validation (INVALID_ARGUMENT) -> admission (RESOURCE_EXHAUSTED,
// ALREADY_EXISTS) -> Orchestrator::Generate. Router.Health is SERVING while some route exists
// (a healthy P/D pair or mixed worker), NOT_SERVING when none does, DRAINING during shutdown.
//
// Thread safety: handlers run concurrently on gRPC's threads; the core objects are thread-safe.
#ifndef TANDEM_ROUTER_ROUTER_SERVICE_H_
#define TANDEM_ROUTER_ROUTER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "absl/status/status.h"
#include "router/orchestrator.h"
#include "router/request_table.h"
#include "router/worker_registry.h"
#include "tandem/v1/router.grpc.pb.h"

namespace tandem::router {

class RouterServiceImpl final : public v1::Router::Service {
 public:
  RouterServiceImpl(WorkerRegistry* registry, RequestTable* requests, Orchestrator* orchestrator)
      : registry_(registry), requests_(requests), orchestrator_(orchestrator) {}

  // After this, Generate answers UNAVAILABLE and Health DRAINING.
  void StartDraining() { draining_.store(true); }

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Abort(grpc::ServerContext* ctx, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;

 private:
  WorkerRegistry* const registry_;
  RequestTable* const requests_;
  Orchestrator* const orchestrator_;
  std::atomic<bool> draining_{false};
};

class WorkerRegistryServiceImpl final : public v1::WorkerRegistry::Service {
 public:
  explicit WorkerRegistryServiceImpl(WorkerRegistry* registry, absl::Duration heartbeat_interval)
      : registry_(registry), heartbeat_interval_(heartbeat_interval) {}

  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;

 private:
  WorkerRegistry* const registry_;
  const absl::Duration heartbeat_interval_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTER_SERVICE_H_
