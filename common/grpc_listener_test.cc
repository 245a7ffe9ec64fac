// GrpcListener: a grpc::Server served through it answers calls, and keeps accepting after the
// process ran out of file descriptors (gRPC 1.51's own listener stops for good: measured with a
// tandem_router under `prlimit --nofile=96`, its gRPC port dead after a 120-connection flood).
#include "common/grpc_listener.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <string>

#include "absl/time/clock.h"
#include "common/descriptor_exhaustion.h"
#include "gtest/gtest.h"
#include "tandem/v1/router.grpc.pb.h"

namespace tandem {
namespace {

class HealthOnly final : public v1::Router::Service {
  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*,
                      v1::HealthResponse* response) override {
    response->set_detail("listening");
    return grpc::Status::OK;
  }
};

// A Health call on a fresh channel, within `timeout`.
grpc::Status CallHealth(int port, absl::Duration timeout, std::string* message) {
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = v1::Router::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  v1::HealthResponse response;
  grpc::Status status = stub->Health(&context, v1::HealthRequest(), &response);
  *message = response.detail();
  return status;
}

TEST(GrpcListenerTest, ServesAndAcceptsAgainAfterRunningOutOfFileDescriptors) {
  HealthOnly service;
  grpc::ServerBuilder builder;
  auto listener = GrpcListener::Add("127.0.0.1:0", grpc::InsecureServerCredentials(), &builder);
  ASSERT_TRUE(listener.ok()) << listener.status();
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  (*listener)->Start();
  const int port = (*listener)->port();
  ASSERT_GT(port, 0);
  std::string message;
  grpc::Status status = CallHealth(port, absl::Seconds(10), &message);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(message, "listening");

  // A connection while the process is out of descriptors: the listener's accept fails (EMFILE),
  // and again after each 100 ms.
  const int fd = ConnectWhileOutOfDescriptors(port, absl::Milliseconds(300));
  ASSERT_GE(fd, 0);
  close(fd);
  status = CallHealth(port, absl::Seconds(10), &message);
  EXPECT_TRUE(status.ok()) << "the port no longer accepts: " << status.error_message();
  server->Shutdown();
  listener->reset();
}

TEST(GrpcListenerTest, AnAddressInUseIsUnavailable) {
  grpc::ServerBuilder first_builder;
  auto first = GrpcListener::Add("127.0.0.1:0", grpc::InsecureServerCredentials(), &first_builder);
  ASSERT_TRUE(first.ok());
  grpc::ServerBuilder builder;
  auto second = GrpcListener::Add("127.0.0.1:" + std::to_string((*first)->port()),
                                  grpc::InsecureServerCredentials(), &builder);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_FALSE(GrpcListener::Add("no-port", grpc::InsecureServerCredentials(), &builder).ok());
}

}  // namespace
}  // namespace tandem
