// Strict request parsing for gRPC synchronous services: a request whose bytes do not parse as
// the method's message is answered INVALID_ARGUMENT with a message saying so, instead of gRPC's
// INTERNAL with an empty message.
//
// Why: grpc++ (1.51) deserializes a sync method's request in the generated handler
// (grpcpp/support/method_handler.h, RpcMethodHandler::Deserialize ->
// SerializationTraits -> GenericDeserialize in proto_utils.h), which reports a parse failure as
// INTERNAL with the message's InitializationErrorString (empty for proto3). A caller cannot tell
// its own malformed request from a server bug, and an operator cannot alert on INTERNAL.
//
// How: StrictParsingService is a grpc::Service that registers a generated service's methods
// under the same paths, each with a MethodHandler that parses the request bytes itself (at most
// max_request_bytes, RESOURCE_EXHAUSTED beyond) and then runs grpc++'s own handler for the
// implementation's virtual method on the parsed message. Nothing else changes: the server's
// threads, an AuthMetadataProcessor (runs before any of this), size caps, handler statuses.
//
//   StrictParsingService strict(tandem::v1::WorkerService::service_full_name());
//   using S = tandem::v1::WorkerService::Service;
//   strict.Unary("Prefill", impl, &S::Prefill).ServerStreaming("Decode", impl, &S::Decode) ...;
//   RETURN_IF_ERROR(strict.Complete());  // every method of the proto service, types matching
//   builder.RegisterService(&strict);    // instead of impl (which must outlive the server)
//
// Only unary and server-streaming methods (all Tandem has). A server-streaming method may also
// be a callback (reactor) method, `ServerStreamingCallback`: grpc++'s callback handler answers a
// request that failed to parse with UNIMPLEMENTED and an empty message, so here such a request is
// answered by a reactor that only finishes with the parse status.
//
// Thread safety: build it on one thread before the server starts; afterwards gRPC calls the
// handlers concurrently (they keep no state).
#ifndef TANDEM_COMMON_GRPC_STRICT_PARSE_H_
#define TANDEM_COMMON_GRPC_STRICT_PARSE_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/server_callback_handlers.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace tandem {

// Parses `buffer` (owned: destroyed here; may be null) into `out`: INVALID_ARGUMENT naming the
// message type for bytes that are not one (or no message at all), RESOURCE_EXHAUSTED above
// `max_bytes`.
grpc::Status ParseRequestBytes(grpc_byte_buffer* buffer, size_t max_bytes,
                               google::protobuf::Message* out);

namespace strict_parse_internal {

// Deserializes with ParseRequestBytes, runs `inner` (grpc++'s handler of the method) on the
// result. The request lives on the call's arena, as grpc++'s handlers expect it.
template <class Request>
class ParsingHandler final : public grpc::internal::MethodHandler {
 public:
  ParsingHandler(std::unique_ptr<grpc::internal::MethodHandler> inner, size_t max_bytes)
      : inner_(std::move(inner)), max_bytes_(max_bytes) {}
  void RunHandler(const HandlerParameter& param) override { inner_->RunHandler(param); }
  void* Deserialize(grpc_call* call, grpc_byte_buffer* req, grpc::Status* status,
                    void** /*handler_data*/) override {
    auto* request =
        new (grpc::g_core_codegen_interface->grpc_call_arena_alloc(call, sizeof(Request))) Request;
    *status = ParseRequestBytes(req, max_bytes_, request);
    if (status->ok()) return request;
    request->~Request();
    return nullptr;
  }

 private:
  const std::unique_ptr<grpc::internal::MethodHandler> inner_;
  const size_t max_bytes_;
};

// A server-streaming reactor that only finishes the call with `status`.
template <class Response>
class FinishingWriteReactor final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit FinishingWriteReactor(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// A callback server-streaming method's handler: parses as ParsingHandler; grpc++'s callback
// handler (`inner_`) runs the method for a request that parsed, a FinishingWriteReactor answers
// one that did not with the parse status.
template <class Request, class Response>
class CallbackStreamingParsingHandler final : public grpc::internal::MethodHandler {
 public:
  using GetReactor = std::function<grpc::ServerWriteReactor<Response>*(grpc::CallbackServerContext*,
                                                                       const Request*)>;
  CallbackStreamingParsingHandler(GetReactor get_reactor, size_t max_bytes)
      : inner_(std::move(get_reactor)), max_bytes_(max_bytes) {}
  void RunHandler(const HandlerParameter& param) override {
    if (param.status.ok()) {
      inner_.RunHandler(param);
      return;
    }
    grpc::internal::CallbackServerStreamingHandler<Request, Response> failing(
        [status = param.status](grpc::CallbackServerContext*, const Request*) {
          return new FinishingWriteReactor<Response>(status);
        });
    failing.RunHandler(HandlerParameter(param.call, param.server_context, /*req=*/nullptr,
                                        grpc::Status::OK, param.internal_data,
                                        param.call_requester));
  }
  void* Deserialize(grpc_call* call, grpc_byte_buffer* req, grpc::Status* status,
                    void** /*handler_data*/) override {
    auto* request =
        new (grpc::g_core_codegen_interface->grpc_call_arena_alloc(call, sizeof(Request))) Request;
    *status = ParseRequestBytes(req, max_bytes_, request);
    if (status->ok()) return request;
    request->~Request();
    return nullptr;
  }

 private:
  grpc::internal::CallbackServerStreamingHandler<Request, Response> inner_;
  const size_t max_bytes_;
};

}  // namespace strict_parse_internal

class StrictParsingService final : public grpc::Service {
 public:
  // `service_full_name`: e.g. "tandem.v1.WorkerService" (the generated
  // Service::service_full_name()); its descriptor must be linked in.
  explicit StrictParsingService(absl::string_view service_full_name,
                                size_t max_request_bytes = size_t{16} << 20);

  template <class Service, class Request, class Response>
  StrictParsingService& Unary(absl::string_view method, std::type_identity_t<Service>* impl,
                              grpc::Status (Service::*fn)(grpc::ServerContext*, const Request*,
                                                          Response*)) {
    auto inner = std::make_unique<grpc::internal::RpcMethodHandler<Service, Request, Response>>(
        std::mem_fn(fn), impl);
    Add(method, grpc::internal::RpcMethod::NORMAL_RPC, *Request::descriptor(),
        *Response::descriptor(),
        new strict_parse_internal::ParsingHandler<Request>(std::move(inner), max_request_bytes_));
    return *this;
  }

  template <class Service, class Request, class Response>
  StrictParsingService& ServerStreaming(
      absl::string_view method, std::type_identity_t<Service>* impl,
      grpc::Status (Service::*fn)(grpc::ServerContext*, const Request*,
                                  grpc::ServerWriter<Response>*)) {
    auto inner =
        std::make_unique<grpc::internal::ServerStreamingHandler<Service, Request, Response>>(
            std::mem_fn(fn), impl);
    Add(method, grpc::internal::RpcMethod::SERVER_STREAMING, *Request::descriptor(),
        *Response::descriptor(),
        new strict_parse_internal::ParsingHandler<Request>(std::move(inner), max_request_bytes_));
    return *this;
  }

  // A callback (reactor) server-streaming method: `fn` returns the call's reactor.
  template <class Service, class Request, class Response>
  StrictParsingService& ServerStreamingCallback(absl::string_view method,
                                                std::type_identity_t<Service>* impl,
                                                grpc::ServerWriteReactor<Response>* (Service::*fn)(
                                                    grpc::CallbackServerContext*, const Request*)) {
    Add(method, grpc::internal::RpcMethod::SERVER_STREAMING, *Request::descriptor(),
        *Response::descriptor(),
        new strict_parse_internal::CallbackStreamingParsingHandler<Request, Response>(
            [impl, fn](grpc::CallbackServerContext* ctx, const Request* request) {
              return (impl->*fn)(ctx, request);
            },
            max_request_bytes_),
        /*callback=*/true);
    return *this;
  }

  // OK when every method of the proto service was registered once with its request and response
  // types and streaming shape; the first mismatch otherwise (INVALID_ARGUMENT, FAILED_PRECONDITION
  // for a missing method).
  absl::Status Complete() const;

 private:
  void Add(absl::string_view method, grpc::internal::RpcMethod::RpcType type,
           const google::protobuf::Descriptor& request,
           const google::protobuf::Descriptor& response, grpc::internal::MethodHandler* handler,
           bool callback = false);

  const std::string service_name_;
  const google::protobuf::ServiceDescriptor* const descriptor_;
  const size_t max_request_bytes_;
  std::deque<std::string> paths_;        // RpcServiceMethod keeps the name's pointer
  std::vector<std::string> registered_;  // method names
  absl::Status status_;                  // the first registration error
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRPC_STRICT_PARSE_H_
