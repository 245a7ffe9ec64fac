// The gRPC side of the router's worker seam (worker_client.h): a WorkerClient over the
// WorkerService stub of one worker, and the CallerContext of a client request served by the
// router's gRPC service. Only this file and router_service.cc see gRPC types in the router.
//
// Worker calls made for a GrpcCaller inherit its cancellation (ClientContext::
// FromCallbackServerContext): a client that goes away cancels them at once. Calls use gRPC's
// callback API (`stub->async()`): completions run on gRPC's own threads, none is held per call.
//
// Thread safety: as worker_client.h.
#ifndef TANDEM_ROUTER_GRPC_GRPC_WORKER_CLIENT_H_
#define TANDEM_ROUTER_GRPC_GRPC_WORKER_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/security/security_config.h"
#include "router/core/worker_client.h"

namespace tandem::router {

// A client request served by the router's (callback) gRPC service.
class GrpcCaller final : public CallerContext {
 public:
  explicit GrpcCaller(const grpc::CallbackServerContext* context) : context_(context) {}
  bool Cancelled() const override { return context_->IsCancelled(); }
  absl::Time deadline() const override { return absl::FromChrono(context_->deadline()); }
  const grpc::CallbackServerContext* context() const { return context_; }

 private:
  const grpc::CallbackServerContext* context_;
};

// A client with its own channel to `address` (message size limits of proto/tandem/v1/limits.h,
// a short reconnect backoff: a restarted worker comes back on the same address soon).
// `security`: the router's credentials (plain text when insecure).
std::shared_ptr<WorkerClient> MakeGrpcWorkerClient(const std::string& address,
                                                   const security::SecurityConfig& security = {});

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_GRPC_GRPC_WORKER_CLIENT_H_
