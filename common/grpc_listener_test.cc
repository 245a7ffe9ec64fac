// GrpcListener: a grpc::Server served through it answers calls, and keeps accepting after the
// process ran out of file descriptors (gRPC 1.51's own listener stops for good: measured with a
// tandem_router under `prlimit --nofile=96`, its gRPC port dead after a 120-connection flood);
// its connections stay within the cap, and idle never-handshaking ones are dropped.
#include "common/grpc_listener.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/descriptor_exhaustion.h"
#include "common/http/test_client.h"
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

// True when the server closed `fd` within `within` (EOF or a reset); false while it stays open.
// What the server sends meanwhile (its HTTP/2 SETTINGS) is read and dropped.
bool ClosedWithin(int fd, absl::Duration within) {
  const absl::Time deadline = absl::Now() + within;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (poll(&p, 1, std::max(left, 0)) <= 0) return false;
    char buf[256];
    if (read(fd, buf, sizeof(buf)) <= 0) return true;
  }
}

// At the cap (4 here), a further connection is closed as soon as accepted while the calls on an
// open channel go on; connections that never send the HTTP/2 preface are dropped after the
// handshake timeout, which frees their places. Before, every connection was handed to gRPC
// (no cap) and an idle one stayed for gRPC's default 2 minutes.
TEST(GrpcListenerTest, ConnectionsPastTheCapAreClosedAndIdleOnesDropped) {
  HealthOnly service;
  grpc::ServerBuilder builder;
  GrpcListenerOptions options;
  options.max_connections = 4;
  options.handshake_timeout = absl::Milliseconds(1500);
  auto listener =
      GrpcListener::Add("127.0.0.1:0", grpc::InsecureServerCredentials(), &builder, options);
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_EQ((*listener)->max_connections(), 4);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  (*listener)->Start();
  const int port = (*listener)->port();
  auto stub = v1::Router::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  const auto health = [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::HealthResponse response;
    return stub->Health(&context, v1::HealthRequest(), &response);
  };
  ASSERT_TRUE(health().ok());  // the channel's connection: 1 of 4
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(http::ConnectLoopback(port));
  const absl::Time opened = absl::Now();
  for (int i = 0; i < 2; ++i) {
    const int extra = http::ConnectLoopback(port);
    ASSERT_GE(extra, 0);
    EXPECT_TRUE(ClosedWithin(extra, absl::Milliseconds(700))) << "connection " << 5 + i;
    close(extra);
  }
  EXPECT_EQ((*listener)->connections(), 4);
  for (int fd : idle) EXPECT_FALSE(ClosedWithin(fd, absl::ZeroDuration()));
  grpc::Status status = health();
  EXPECT_TRUE(status.ok()) << "the open channel at the cap: " << status.error_message();
  // The idle ones are dropped at the handshake timeout, and their places are free again.
  for (int fd : idle) {
    EXPECT_TRUE(ClosedWithin(fd, absl::Seconds(5)));
    close(fd);
  }
  const absl::Duration idle_for = absl::Now() - opened;
  EXPECT_GE(idle_for, absl::Milliseconds(1300));
  EXPECT_LT(idle_for, absl::Seconds(5));
  // gRPC may close a dropped connection's descriptor a moment after its peer read the EOF, and
  // the listener counts descriptors: a new connection is admitted again within a second or two.
  bool admitted = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(3); !admitted && absl::Now() < end;) {
    const int again = http::ConnectLoopback(port);
    ASSERT_GE(again, 0);
    admitted = !ClosedWithin(again, absl::Milliseconds(200));
    close(again);
  }
  EXPECT_TRUE(admitted) << "no connection admitted after the idle ones were dropped";
  status = health();
  EXPECT_TRUE(status.ok()) << status.error_message();
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
