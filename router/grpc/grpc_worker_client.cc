#include "router/grpc/grpc_worker_client.h"

#include <utility>

#include "common/grpc_keepalive.h"
#include "common/grpc_status.h"
#include "common/security/grpc_security.h"
#include "tandem/v1/limits.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {
namespace {

using Stub = v1::WorkerService::Stub;
using Reactor = grpc::ClientReadReactor<v1::GenerateResponse>;

// A client context with the call's deadline, inheriting the client's cancellation when the
// caller is a gRPC request.
std::unique_ptr<grpc::ClientContext> NewContext(const CallOptions& options) {
  const auto* grpc_caller = dynamic_cast<const GrpcCaller*>(options.caller);
  std::unique_ptr<grpc::ClientContext> ctx =
      grpc_caller != nullptr
          ? grpc::ClientContext::FromCallbackServerContext(*grpc_caller->context())
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
  void Start(const v1::PrefillRequest& request, DoneCallback done) override {
    request_ = request;
    done_ = std::move(done);
    stub_->async()->Prefill(ctx_.get(), &request_, &response_, [this](grpc::Status s) {
      // Moved out first: `done` may destroy this call (its owner's last step).
      DoneCallback done = std::move(done_);
      if (s.ok()) {
        std::move(done)(std::move(response_));
      } else {
        std::move(done)(FromGrpcStatus(s));
      }
    });
  }

 private:
  const std::shared_ptr<Stub> stub_;
  const std::unique_ptr<grpc::ClientContext> ctx_;
  v1::PrefillRequest request_;
  v1::PrefillResponse response_;
  DoneCallback done_;
};

void Open(Stub& stub, grpc::ClientContext* ctx, const v1::DecodeRequest* request, Reactor* r) {
  stub.async()->Decode(ctx, request, r);
}
void Open(Stub& stub, grpc::ClientContext* ctx, const v1::GenerateRequest* request, Reactor* r) {
  stub.async()->Generate(ctx, request, r);
}

// One read outstanding at a time. A hold keeps gRPC from finishing the call (OnDone) while the
// reader has a message and has not asked for the next one; the read that ends the stream
// (ok=false) removes it.
template <typename Request>
class GrpcStreamCall final : public StreamCall, public Reactor {
 public:
  GrpcStreamCall(std::shared_ptr<Stub> stub, Request request, const CallOptions& options)
      : stub_(std::move(stub)), request_(std::move(request)), ctx_(NewContext(options)) {}
  void Cancel() override { ctx_->TryCancel(); }
  void Start(MessageCallback on_message, DoneCallback on_done) override {
    on_message_ = std::move(on_message);
    on_done_ = std::move(on_done);
    Open(*stub_, ctx_.get(), &request_, this);
    AddHold();
    StartRead(&message_);
    StartCall();
  }
  void ReadNext() override { StartRead(&message_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      RemoveHold();
      return;
    }
    v1::GenerateResponse message = std::move(message_);
    message_.Clear();
    on_message_(std::move(message));
  }
  void OnDone(const grpc::Status& s) override {
    DoneCallback done = std::move(on_done_);  // `done` may destroy this call
    std::move(done)(FromGrpcStatus(s));
  }

 private:
  const std::shared_ptr<Stub> stub_;
  const Request request_;
  const std::unique_ptr<grpc::ClientContext> ctx_;
  v1::GenerateResponse message_;
  MessageCallback on_message_;
  DoneCallback on_done_;
};

class GrpcWorkerClient final : public WorkerClient {
 public:
  explicit GrpcWorkerClient(std::shared_ptr<grpc::Channel> channel)
      : channel_(channel), stub_(v1::WorkerService::NewStub(std::move(channel))) {}

  std::unique_ptr<PrefillCall> NewPrefill(const CallOptions& options) override {
    return std::make_unique<GrpcPrefillCall>(stub_, options);
  }
  std::unique_ptr<StreamCall> NewDecode(const v1::DecodeRequest& request,
                                        const CallOptions& options) override {
    return std::make_unique<GrpcStreamCall<v1::DecodeRequest>>(stub_, request, options);
  }
  std::unique_ptr<StreamCall> NewGenerate(const v1::GenerateRequest& request,
                                          const CallOptions& options) override {
    return std::make_unique<GrpcStreamCall<v1::GenerateRequest>>(stub_, request, options);
  }
  void AbortAsync(const std::string& request_id, absl::Duration timeout,
                  std::function<void(absl::Status)> done) override {
    v1::AbortRequest request;
    request.set_request_id(request_id);
    Unary<v1::AbortRequest, v1::AbortResponse>(std::move(request), absl::Now() + timeout,
                                               &Stub::async::Abort, std::move(done));
  }
  void ReassignLeaseAsync(const v1::ReassignLeaseRequest& request, absl::Time deadline,
                          std::function<void(absl::Status)> done) override {
    Unary<v1::ReassignLeaseRequest, v1::ReassignLeaseResponse>(
        request, deadline, &Stub::async::ReassignLease, std::move(done));
  }
  bool Connected() override {
    return channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY;
  }

 private:
  // A unary call whose heap state is owned by its completion callback; it keeps the stub (and
  // channel) alive until `done` has run.
  template <typename Request, typename Response>
  void Unary(Request request, absl::Time deadline,
             void (Stub::async::*method)(grpc::ClientContext*, const Request*, Response*,
                                         std::function<void(grpc::Status)>),
             std::function<void(absl::Status)> done) {
    struct Call {
      grpc::ClientContext ctx;
      Request request;
      Response response;
      std::shared_ptr<Stub> stub;
      std::function<void(absl::Status)> done;
    };
    auto* call = new Call;
    call->request = std::move(request);
    call->stub = stub_;
    call->done = std::move(done);
    call->ctx.set_deadline(absl::ToChronoTime(deadline));
    (call->stub->async()->*method)(
        &call->ctx, &call->request, &call->response, [call](grpc::Status s) {
          std::function<void(absl::Status)> finished = std::move(call->done);
          delete call;
          if (finished) finished(FromGrpcStatus(s));
        });
  }

  const std::shared_ptr<grpc::Channel> channel_;
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
  return std::make_shared<GrpcWorkerClient>(security::CreateChannel(address, security, args));
}

}  // namespace tandem::router
