// StrictParsingService over a real gRPC server on loopback (WorkerService: unary and
// server-streaming methods): malformed bytes get INVALID_ARGUMENT naming the message type (gRPC's
// own handler answers INTERNAL with an empty message, also checked), valid bytes reach the
// implementation, oversize requests get RESOURCE_EXHAUSTED, and Complete() catches a method that
// is missing, unknown or registered with the wrong types. The same for a callback (reactor)
// server-streaming method, which grpc++ alone answers UNIMPLEMENTED when the bytes do not parse.
#include "common/grpc_strict_parse.h"

#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {
namespace {

using S = tandem::v1::WorkerService::Service;

class Impl final : public S {
 public:
  grpc::Status Prefill(grpc::ServerContext*, const tandem::v1::PrefillRequest* request,
                       tandem::v1::PrefillResponse* response) override {
    response->set_request_id(request->request().request_id());
    return grpc::Status::OK;
  }
  grpc::Status Decode(grpc::ServerContext*, const tandem::v1::DecodeRequest* request,
                      grpc::ServerWriter<tandem::v1::GenerateResponse>* writer) override {
    tandem::v1::GenerateResponse out;
    out.set_request_id(request->request().request_id());
    writer->Write(out);
    return grpc::Status::OK;
  }
};

// Every WorkerService method; the ones Impl does not override answer UNIMPLEMENTED.
void RegisterAll(StrictParsingService& strict, Impl* impl) {
  strict.Unary("Prefill", impl, &S::Prefill)
      .ServerStreaming("Decode", impl, &S::Decode)
      .ServerStreaming("Generate", impl, &S::Generate)
      .Unary("Abort", impl, &S::Abort)
      .Unary("ReassignLease", impl, &S::ReassignLease)
      .Unary("Health", impl, &S::Health)
      .Unary("Stats", impl, &S::Stats);
}

struct Server {
  explicit Server(grpc::Service* service) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    server = builder.BuildAndStart();
    channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                  grpc::InsecureChannelCredentials());
  }
  ~Server() { server->Shutdown(std::chrono::system_clock::now()); }
  // `bytes` as the one request message of `method`.
  grpc::Status Call(const std::string& method, const std::string& bytes) {
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  }
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
};

const std::string kGarbage("\x0a\x05\xff\xff", 4);  // field 1: 5 bytes promised, 2 sent

TEST(StrictParseTest, MalformedBytesAreInvalidArgumentOnUnaryAndStreamingMethods) {
  Impl impl;
  StrictParsingService strict(tandem::v1::WorkerService::service_full_name());
  RegisterAll(strict, &impl);
  ASSERT_TRUE(strict.Complete().ok()) << strict.Complete();
  Server server(&strict);
  for (const char* method : {"Prefill", "Decode", "Abort"}) {
    const grpc::Status s = server.Call(std::string("/tandem.v1.WorkerService/") + method, kGarbage);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_NE(s.error_message().find("malformed request"), std::string::npos) << s.error_message();
  }
  const grpc::Status named = server.Call("/tandem.v1.WorkerService/Prefill", kGarbage);
  EXPECT_NE(named.error_message().find("tandem.v1.PrefillRequest"), std::string::npos)
      << named.error_message();
  // Valid bytes reach the implementation, parsed; an empty message is a valid one.
  tandem::v1::PrefillRequest request;
  request.mutable_request()->set_request_id("r1");
  EXPECT_TRUE(server.Call("/tandem.v1.WorkerService/Prefill", request.SerializeAsString()).ok());
  tandem::v1::PrefillResponse response;
  auto stub = tandem::v1::WorkerService::NewStub(server.channel);
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Prefill(&ctx, request, &response).ok());
  EXPECT_EQ(response.request_id(), "r1");
  EXPECT_TRUE(server.Call("/tandem.v1.WorkerService/Decode", "").ok());
  EXPECT_EQ(server.Call("/tandem.v1.WorkerService/Stats", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);  // the base class's answer, as before
  EXPECT_EQ(server.Call("/tandem.v1.WorkerService/NoSuch", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// What StrictParsingService exists for: grpc++'s own handler says INTERNAL, with no message.
TEST(StrictParseTest, GrpcsOwnHandlerAnswersInternal) {
  Impl impl;
  Server server(&impl);
  const grpc::Status s = server.Call("/tandem.v1.WorkerService/Prefill", kGarbage);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(s.error_message(), "");
}

TEST(StrictParseTest, RequestsOverTheLimitAreResourceExhausted) {
  Impl impl;
  StrictParsingService strict(tandem::v1::WorkerService::service_full_name(),
                              /*max_request_bytes=*/64);
  RegisterAll(strict, &impl);
  Server server(&strict);
  tandem::v1::PrefillRequest request;
  request.mutable_request()->set_request_id(std::string(100, 'x'));
  EXPECT_EQ(
      server.Call("/tandem.v1.WorkerService/Prefill", request.SerializeAsString()).error_code(),
      grpc::StatusCode::RESOURCE_EXHAUSTED);
}

// Generate as a callback (reactor) method: one message with the request's id, then OK.
class CallbackImpl {
 public:
  grpc::ServerWriteReactor<tandem::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext*, const tandem::v1::GenerateRequest* request) {
    class Reactor final : public grpc::ServerWriteReactor<tandem::v1::GenerateResponse> {
     public:
      explicit Reactor(const std::string& id) {
        out_.set_request_id(id);
        StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      tandem::v1::GenerateResponse out_;
    };
    return new Reactor(request->request_id());
  }
};

TEST(StrictParseTest, CallbackStreamingMethodsParseStrictlyToo) {
  Impl impl;
  CallbackImpl callback;
  StrictParsingService strict(tandem::v1::WorkerService::service_full_name());
  strict.Unary("Prefill", &impl, &S::Prefill)
      .ServerStreaming("Decode", &impl, &S::Decode)
      .ServerStreamingCallback("Generate", &callback, &CallbackImpl::Generate)
      .Unary("Abort", &impl, &S::Abort)
      .Unary("ReassignLease", &impl, &S::ReassignLease)
      .Unary("Health", &impl, &S::Health)
      .Unary("Stats", &impl, &S::Stats);
  ASSERT_TRUE(strict.Complete().ok()) << strict.Complete();
  Server server(&strict);
  const grpc::Status bad = server.Call("/tandem.v1.WorkerService/Generate", kGarbage);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.error_message().find("malformed request"), std::string::npos)
      << bad.error_message();
  EXPECT_NE(bad.error_message().find("tandem.v1.GenerateRequest"), std::string::npos);
  // A request that parses reaches the reactor; sync methods of the same server still work.
  auto stub = tandem::v1::WorkerService::NewStub(server.channel);
  grpc::ClientContext ctx;
  tandem::v1::GenerateRequest request;
  request.set_request_id("g1");
  auto reader = stub->Generate(&ctx, request);
  tandem::v1::GenerateResponse out;
  ASSERT_TRUE(reader->Read(&out));
  EXPECT_EQ(out.request_id(), "g1");
  EXPECT_FALSE(reader->Read(&out));
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(server.Call("/tandem.v1.WorkerService/Decode", kGarbage).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(StrictParseTest, CompleteCatchesMissingUnknownAndMistypedMethods) {
  Impl impl;
  StrictParsingService missing(tandem::v1::WorkerService::service_full_name());
  missing.Unary("Prefill", &impl, &S::Prefill);
  EXPECT_EQ(missing.Complete().code(), absl::StatusCode::kFailedPrecondition);
  StrictParsingService unknown(tandem::v1::WorkerService::service_full_name());
  RegisterAll(unknown, &impl);
  unknown.Unary("Prefil", &impl, &S::Prefill);
  EXPECT_EQ(unknown.Complete().code(), absl::StatusCode::kInvalidArgument);
  StrictParsingService mistyped(tandem::v1::WorkerService::service_full_name());
  mistyped.Unary("Abort", &impl, &S::Stats);  // Stats' request and response under Abort's name
  EXPECT_EQ(mistyped.Complete().code(), absl::StatusCode::kInvalidArgument);
  StrictParsingService twice(tandem::v1::WorkerService::service_full_name());
  RegisterAll(twice, &impl);
  twice.Unary("Abort", &impl, &S::Abort);
  EXPECT_EQ(twice.Complete().code(), absl::StatusCode::kFailedPrecondition);
  StrictParsingService nothing("tandem.v1.NoSuchService");
  EXPECT_EQ(nothing.Complete().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
