#include "router/grpc/router_service.h"

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/security/auth_status.h"
#include "common/security/grpc_security.h"
#include "router/core/routing_policy.h"
#include "router/core/validation.h"
#include "router/grpc/grpc_worker_client.h"
#include "tandem/v1/limits.h"

namespace tandem::router {
namespace {

using GenerateReactor = grpc::ServerWriteReactor<v1::GenerateResponse>;

// A Generate call answered before any chunk (refused): only its status.
class RefusedStream final : public GenerateReactor {
 public:
  explicit RefusedStream(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// One admitted Generate call: the Orchestrator's sink on one side, gRPC's write reactor on the
// other. Chunks queue while a write is in flight (one at a time, as gRPC requires); the status
// goes after the last of them. gRPC ops are started outside mu_ by whoever holds the write turn.
// Owned by itself until gRPC's OnDone and by the Orchestrator until it finished the request.
class GenerateStream final : public GenerateReactor, public ResponseSink {
 public:
  static GenerateReactor* Start(grpc::CallbackServerContext* ctx, Orchestrator* orchestrator,
                                v1::GenerateRequest request, Admission admission) {
    std::shared_ptr<GenerateStream> stream(new GenerateStream(ctx, admission.shared_request()));
    stream->self_ = stream;
    orchestrator->Start(std::move(request), std::move(admission), &stream->caller_, stream);
    return stream.get();
  }

  bool Send(const v1::GenerateResponse& chunk) override {
    {
      absl::MutexLock lock(&mu_);
      if (gone_) return false;
      queue_.push_back(chunk);
    }
    Pump();
    return true;
  }
  void Finish(const absl::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      status_ = ToGrpcStatus(status);
    }
    Pump();
  }
  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {  // the client is gone: nothing more will be written
        gone_ = true;
        queue_.clear();
      }
    }
    Pump();
  }
  // The client cancelled, its deadline passed, or the server is shutting down (which also
  // cancels its requests with UNAVAILABLE; the first reason wins).
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      gone_ = true;
    }
    request_->Cancel(absl::Now() >= caller_.deadline()
                         ? absl::DeadlineExceededError("the client's deadline passed")
                         : absl::CancelledError("the client cancelled the request"));
  }
  void OnDone() override { self_.reset(); }

 private:
  GenerateStream(grpc::CallbackServerContext* ctx, std::shared_ptr<InFlightRequest> request)
      : caller_(ctx), request_(std::move(request)) {}

  // Starts the next write, or the finish once every queued chunk was written.
  void Pump() {
    bool write = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = write = true;
      } else if (status_.has_value()) {
        finished_ = true;
        finish = *status_;
      }
    }
    if (write) StartWrite(&current_);
    if (finish.has_value()) GenerateReactor::Finish(*std::move(finish));
  }

  const GrpcCaller caller_;
  const std::shared_ptr<InFlightRequest> request_;
  std::shared_ptr<GenerateStream> self_;  // until OnDone
  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse current_;  // the write in flight (owned by the write turn)
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<PublicCaller> RouterServiceImpl::Authenticate(
    const grpc::ServerContextBase& ctx) const {
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

GenerateReactor* RouterServiceImpl::StartGenerate(grpc::CallbackServerContext* ctx,
                                                  const v1::GenerateRequest* request) {
  absl::StatusOr<PublicCaller> who = Authenticate(*ctx);
  if (!who.ok()) return new RefusedStream(who.status());
  if (draining_.load()) {
    return new RefusedStream(absl::UnavailableError("the router is shutting down"));
  }
  if (absl::Status s = ValidateRequestShape(*request); !s.ok()) return new RefusedStream(s);
  absl::StatusOr<Admission> admission = requests_->Admit(request->request_id(), who->owner);
  if (!admission.ok()) return new RefusedStream(admission.status());
  v1::GenerateRequest routed = *request;
  routed.set_request_id(admission->request().id());
  return GenerateStream::Start(ctx, orchestrator_, std::move(routed), *std::move(admission));
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
  const WorkerRegistry::ModelLimits limits = registry_->Limits();
  response->set_vocab_size(limits.vocab_size);
  response->set_max_model_len(limits.max_model_len);
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

absl::StatusOr<RegistryCaller> WorkerRegistryServiceImpl::CallerOf(
    const grpc::ServerContext& ctx) const {
  RegistryCaller caller;
  if (security_->insecure) return caller;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return security::Unauthenticated("no auth context");
  absl::StatusOr<security::PeerIdentity> peer = security::PeerIdentityOf(*auth);
  if (!peer.ok()) return peer.status();
  caller.peer = *std::move(peer);
  return caller;
}

grpc::Status WorkerRegistryServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                                       const v1::RegisterWorkerRequest* request,
                                                       v1::RegisterWorkerResponse* response) {
  absl::StatusOr<RegistryCaller> caller = CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = registry_->Register(request->info(), *caller); !s.ok()) {
    return ToGrpcStatus(s);
  }
  response->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(heartbeat_interval_)));
  return grpc::Status::OK;
}

grpc::Status WorkerRegistryServiceImpl::Heartbeat(grpc::ServerContext* ctx,
                                                  const v1::HeartbeatRequest* request,
                                                  v1::HeartbeatResponse* response) {
  absl::StatusOr<RegistryCaller> caller = CallerOf(*ctx);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<bool> known = registry_->Heartbeat(*request, *caller);
  if (!known.ok()) return ToGrpcStatus(known.status());
  response->set_known(*known);
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictRouterService(
    RouterServiceImpl* service) {
  using S = v1::Router::Service;
  auto strict = std::make_unique<StrictParsingService>(v1::Router::service_full_name(),
                                                       v1::kMaxGrpcMessageBytes);
  strict->ServerStreamingCallback("Generate", service, &RouterServiceImpl::StartGenerate)
      .Unary("Abort", service, &S::Abort)
      .Unary("ListWorkers", service, &S::ListWorkers)
      .Unary("Health", service, &S::Health);
  if (absl::Status s = strict->Complete(); !s.ok()) return s;
  return strict;
}

absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictAdminService(
    AdminServiceImpl* service) {
  using S = v1::Router::Service;
  auto strict = std::make_unique<StrictParsingService>(v1::Router::service_full_name(),
                                                       v1::kMaxGrpcMessageBytes);
  strict->ServerStreaming("Generate", service, &S::Generate)
      .Unary("Abort", service, &S::Abort)
      .Unary("ListWorkers", service, &S::ListWorkers)
      .Unary("Health", service, &S::Health);
  if (absl::Status s = strict->Complete(); !s.ok()) return s;
  return strict;
}

absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictRegistryService(
    v1::WorkerRegistry::Service* service) {
  using S = v1::WorkerRegistry::Service;
  auto strict = std::make_unique<StrictParsingService>(v1::WorkerRegistry::service_full_name(),
                                                       v1::kMaxGrpcMessageBytes);
  strict->Unary("RegisterWorker", service, &S::RegisterWorker)
      .Unary("Heartbeat", service, &S::Heartbeat);
  if (absl::Status s = strict->Complete(); !s.ok()) return s;
  return strict;
}

}  // namespace tandem::router
