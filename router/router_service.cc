#include "router/router_service.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/security/auth_status.h"
#include "common/security/grpc_security.h"
#include "router/grpc_worker_client.h"
#include "router/routing_policy.h"
#include "router/validation.h"

namespace tandem::router {
namespace {

class WriterSink final : public ResponseSink {
 public:
  explicit WriterSink(grpc::ServerWriter<v1::GenerateResponse>* writer) : writer_(writer) {}
  bool Send(const v1::GenerateResponse& chunk) override { return writer_->Write(chunk); }

 private:
  grpc::ServerWriter<v1::GenerateResponse>* writer_;
};

// The role a worker's certificate must name to register as `role`.
std::optional<security::Role> CertRoleFor(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL:
      return security::Role::kPrefill;
    case v1::WORKER_ROLE_DECODE:
      return security::Role::kDecode;
    case v1::WORKER_ROLE_MIXED:
      return security::Role::kMixed;
    default:
      return std::nullopt;
  }
}

}  // namespace

absl::StatusOr<PublicCaller> RouterServiceImpl::Authenticate(const grpc::ServerContext& ctx) const {
  PublicCaller caller;
  if (!security_->api_keys.empty()) {
    absl::StatusOr<security::ApiKeyIdentity> key = security::ApiKeyOf(ctx, security_->api_keys);
    if (!key.ok()) return key.status();
    caller.owner = absl::StrCat("key:", key->name);
    caller.admin = key->admin;
    return caller;
  }
  if (client_certs_) {
    std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    if (auth == nullptr) return security::Unauthenticated("no auth context");
    absl::StatusOr<security::PeerIdentity> peer = security::PeerIdentityOf(*auth);
    if (!peer.ok()) return peer.status();
    caller.owner = absl::StrCat("cert:", peer->name);
    caller.admin = peer->role == security::Role::kAdmin;
    return caller;
  }
  caller.admin = security_->insecure;  // the legacy open mode: plain text and no keys
  return caller;
}

grpc::Status RouterServiceImpl::Generate(grpc::ServerContext* ctx,
                                         const v1::GenerateRequest* request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  absl::StatusOr<PublicCaller> who = Authenticate(*ctx);
  if (!who.ok()) return ToGrpcStatus(who.status());
  if (draining_.load()) {
    return ToGrpcStatus(absl::UnavailableError("the router is shutting down"));
  }
  if (absl::Status s = ValidateRequestShape(*request); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<Admission> admission = requests_->Admit(request->request_id(), who->owner);
  if (!admission.ok()) return ToGrpcStatus(admission.status());
  v1::GenerateRequest routed = *request;
  routed.set_request_id(admission->request().id());
  WriterSink sink(writer);
  GrpcCaller caller(ctx);
  return ToGrpcStatus(orchestrator_->Generate(routed, admission->request(), &caller, sink));
}

grpc::Status RouterServiceImpl::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* request,
                                      v1::AbortResponse* response) {
  absl::StatusOr<PublicCaller> caller = Authenticate(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  response->set_found(requests_->Cancel(
      request->request_id(),
      absl::AbortedError(absl::StrCat("request ", request->request_id(), " aborted")),
      caller->owner));
  return grpc::Status::OK;
}

grpc::Status RouterServiceImpl::ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                                            v1::ListWorkersResponse* response) {
  absl::StatusOr<PublicCaller> caller = Authenticate(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (!caller->admin) {
    return ToGrpcStatus(security::PermissionDenied("ListWorkers without an admin key"));
  }
  *response = registry_->List();
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                                           v1::ListWorkersResponse* response) {
  *response = registry_->List();
  return grpc::Status::OK;
}

grpc::Status RouterServiceImpl::Health(grpc::ServerContext* ctx, const v1::HealthRequest*,
                                       v1::HealthResponse* response) {
  absl::StatusOr<PublicCaller> who = Authenticate(*ctx);
  if (!who.ok()) return ToGrpcStatus(who.status());
  if (draining_.load()) {
    response->set_status(v1::SERVING_STATUS_DRAINING);
    response->set_detail("shutting down");
    return grpc::Status::OK;
  }
  // A one-token prompt is enough to ask "is there any route at all?".
  const uint32_t probe = 0;
  RoutingSnapshot snap = registry_->Snapshot(absl::MakeConstSpan(&probe, 1), "");
  absl::StatusOr<RoutePlan> plan = ChooseRoute(snap.candidates);
  const std::string counts =
      absl::StrCat(snap.registered, " workers registered, ", snap.candidates.size(), " healthy; ",
                   requests_->size(), " requests in flight");
  if (plan.ok()) {
    response->set_status(v1::SERVING_STATUS_SERVING);
    response->set_detail(absl::StrCat(plan->disaggregated() ? "prefill/decode" : "mixed",
                                      " route available; ", counts));
  } else {
    response->set_status(v1::SERVING_STATUS_NOT_SERVING);
    response->set_detail(absl::StrCat(plan.status().message(), "; ", counts));
  }
  return grpc::Status::OK;
}

grpc::Status WorkerRegistryServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                                       const v1::RegisterWorkerRequest* request,
                                                       v1::RegisterWorkerResponse* response) {
  if (!security_->insecure) {
    // The mTLS policy admitted a worker certificate; it must be of the role being registered.
    std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
    absl::StatusOr<security::PeerIdentity> peer = auth == nullptr
                                                      ? security::Unauthenticated("no auth context")
                                                      : security::PeerIdentityOf(*auth);
    if (!peer.ok()) return ToGrpcStatus(peer.status());
    if (CertRoleFor(request->info().role()) != peer->role) {
      return ToGrpcStatus(security::PermissionDenied(
          absl::StrCat(peer->ToString(), " registering as role ", request->info().role())));
    }
  }
  if (absl::Status s = registry_->Register(request->info()); !s.ok()) return ToGrpcStatus(s);
  response->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(heartbeat_interval_)));
  return grpc::Status::OK;
}

grpc::Status WorkerRegistryServiceImpl::Heartbeat(grpc::ServerContext*,
                                                  const v1::HeartbeatRequest* request,
                                                  v1::HeartbeatResponse* response) {
  absl::StatusOr<bool> known = registry_->Heartbeat(*request);
  if (!known.ok()) return ToGrpcStatus(known.status());
  response->set_known(*known);
  return grpc::Status::OK;
}

}  // namespace tandem::router
