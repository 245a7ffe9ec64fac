#include "router/grpc_worker_client.h"

#include <utility>

#include "common/grpc_keepalive.h"
#include "common/grpc_status.h"
#include "common/security/grpc_security.h"
#include "tandem/v1/limits.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {
namespace {

using Stub = v1::WorkerService::Stub;

// A client context with the call's deadline, inheriting the client's cancellation when the
// caller is a gRPC request.
std::unique_ptr<grpc::ClientContext> NewContext(const CallOptions& options) {
  const auto* grpc_caller = dynamic_cast<const GrpcCaller*>(options.caller);
  std::unique_ptr<grpc::ClientContext> ctx =
      grpc_caller != nullptr ? grpc::ClientContext::FromServerContext(*grpc_caller->context())
                             : std::make_unique<grpc::ClientContext>();
  if (options.deadline != absl::InfiniteFuture()) {
    ctx->set_deadline(absl::ToChronoTime(options.deadline));
  }
  return ctx;
}

class GrpcPrefillCall final : public PrefillCall {
 public:
  GrpcPrefillCall(std::shared_ptr<Stub> stub, const CallOptions& options)
      : stub_(std::move(stub)), ctx_(NewContext(options)) {}
  void Cancel() override { ctx_->TryCancel(); }  // before the call starts: it starts cancelled
  absl::StatusOr<v1::PrefillResponse> Run(const v1::PrefillRequest& request) override {
    v1::PrefillResponse response;
    grpc::Status s = stub_->Prefill(ctx_.get(), request, &response);
    if (!s.ok()) return FromGrpcStatus(s);
    return response;
  }

 private:
  const std::shared_ptr<Stub> stub_;
  const std::unique_ptr<grpc::ClientContext> ctx_;
};

template <typename Request>
class GrpcStreamCall final : public StreamCall {
 public:
  using Open = std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> (Stub::*)(
      grpc::ClientContext*, const Request&);
  GrpcStreamCall(std::shared_ptr<Stub> stub, Open open, Request request, const CallOptions& options)
      : stub_(std::move(stub)),
        open_(open),
        request_(std::move(request)),
        ctx_(NewContext(options)) {}
  void Cancel() override { ctx_->TryCancel(); }
  bool Read(v1::GenerateResponse* message) override {
    if (reader_ == nullptr) reader_ = ((*stub_).*open_)(ctx_.get(), request_);
    return reader_->Read(message);
  }
  absl::Status Finish() override {
    if (reader_ == nullptr) reader_ = ((*stub_).*open_)(ctx_.get(), request_);
    return FromGrpcStatus(reader_->Finish());
  }

 private:
  const std::shared_ptr<Stub> stub_;
  const Open open_;
  const Request request_;
  const std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;  // after ctx_: dies first
};

class GrpcWorkerClient final : public WorkerClient,
                               public std::enable_shared_from_this<GrpcWorkerClient> {
 public:
  explicit GrpcWorkerClient(std::shared_ptr<Stub> stub) : stub_(std::move(stub)) {}

  std::unique_ptr<PrefillCall> NewPrefill(const CallOptions& options) override {
    return std::make_unique<GrpcPrefillCall>(stub_, options);
  }
  std::unique_ptr<StreamCall> NewDecode(const v1::DecodeRequest& request,
                                        const CallOptions& options) override {
    return std::make_unique<GrpcStreamCall<v1::DecodeRequest>>(stub_, &Stub::Decode, request,
                                                               options);
  }
  std::unique_ptr<StreamCall> NewGenerate(const v1::GenerateRequest& request,
                                          const CallOptions& options) override {
    return std::make_unique<GrpcStreamCall<v1::GenerateRequest>>(stub_, &Stub::Generate, request,
                                                                 options);
  }
  void AbortAsync(const std::string& request_id, absl::Duration timeout,
                  std::function<void(absl::Status)> done) override {
    // Heap state owned by the completion callback; it keeps the stub (and channel) alive.
    struct AbortCall {
      grpc::ClientContext ctx;
      v1::AbortRequest request;
      v1::AbortResponse response;
      std::shared_ptr<Stub> stub;
      std::function<void(absl::Status)> done;
    };
    auto* call = new AbortCall;
    call->request.set_request_id(request_id);
    call->stub = stub_;
    call->done = std::move(done);
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    call->stub->async()->Abort(&call->ctx, &call->request, &call->response, [call](grpc::Status s) {
      std::function<void(absl::Status)> finished = std::move(call->done);
      delete call;
      if (finished) finished(FromGrpcStatus(s));
    });
  }
  absl::Status ReassignLease(const v1::ReassignLeaseRequest& request,
                             absl::Time deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::ReassignLeaseResponse response;
    return FromGrpcStatus(stub_->ReassignLease(&ctx, request, &response));
  }

 private:
  const std::shared_ptr<Stub> stub_;
};

}  // namespace

std::shared_ptr<WorkerClient> MakeGrpcWorkerClient(const std::string& address,
                                                   const security::SecurityConfig& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(v1::kMaxGrpcMessageBytes));
  args.SetMaxSendMessageSize(static_cast<int>(v1::kMaxGrpcMessageBytes));
  // A restarted worker comes back on the same address soon; do not wait out a long backoff.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A worker whose link went silent fails its calls in ~1-2 s, not at the heartbeat timeout.
  EnableKeepalive(args);
  std::shared_ptr<Stub> stub =
      v1::WorkerService::NewStub(security::CreateChannel(address, security, args));
  return std::make_shared<GrpcWorkerClient>(std::move(stub));
}

}  // namespace tandem::router
