// GrpcListener: a grpc::Server served through it answers calls, and keeps accepting after the
// process ran out of file descriptors (gRPC 1.51's own listener stops for good: measured with a
// tandem_router under `prlimit --nofile=96`, its gRPC port dead after a 120-connection flood);
// its connections stay within the cap, and idle never-handshaking ones are dropped; a connection
// whose peer stopped answering pings is closed, and calls per connection are capped.
#include "common/grpc_listener.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
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

// A started server on 127.0.0.1 behind a GrpcListener with `options`.
struct Served {
  std::unique_ptr<GrpcListener> listener;
  std::unique_ptr<grpc::Server> server;
  ~Served() {
    if (server != nullptr) server->Shutdown();
  }
};
void Serve(grpc::Service* service, const GrpcListenerOptions& options, Served* out) {
  grpc::ServerBuilder builder;
  auto listener =
      GrpcListener::Add("127.0.0.1:0", grpc::InsecureServerCredentials(), &builder, options);
  ASSERT_TRUE(listener.ok()) << listener.status();
  builder.RegisterService(service);
  out->server = builder.BuildAndStart();
  ASSERT_NE(out->server, nullptr);
  out->listener = *std::move(listener);
  out->listener->Start();
}

// A peer that completed the HTTP/2 preface and then stopped answering (a dead host, a link whose
// replies are black-holed: the kernel still acks the bytes, nothing answers a PING) is closed
// after keepalive_time + keepalive_timeout. Before, the server never pinged (gRPC's default:
// every 2 hours) and the connection, with any call on it, stayed.
TEST(GrpcListenerTest, AConnectionThatStopsAnsweringPingsIsClosed) {
  HealthOnly service;
  GrpcListenerOptions options;
  options.keepalive_time = absl::Milliseconds(300);
  options.keepalive_timeout = absl::Milliseconds(300);
  Served s;
  ASSERT_NO_FATAL_FAILURE(Serve(&service, options, &s));
  const int fd = http::ConnectLoopback(s.listener->port());
  ASSERT_GE(fd, 0);
  // The client preface and an empty SETTINGS frame (9-byte header: length 0, type 4, no flags,
  // stream 0): the handshake is done, nothing more is ever sent.
  const std::string preface =
      std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + std::string("\0\0\0\x04\0\0\0\0\0", 9);
  ASSERT_EQ(write(fd, preface.data(), preface.size()), static_cast<ssize_t>(preface.size()));
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(ClosedWithin(fd, absl::Seconds(5)));
  const absl::Duration took = absl::Now() - t0;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(5));
  close(fd);
  std::string message;
  const grpc::Status status = CallHealth(s.listener->port(), absl::Seconds(10), &message);
  EXPECT_TRUE(status.ok()) << "a client that answers pings is served: " << status.error_message();
}

// Health calls that wait until released, counting how many run at once.
class HeldHealth final : public v1::Router::Service {
 public:
  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*,
                      v1::HealthResponse*) override {
    absl::MutexLock lock(&mu_);
    ++running_;
    most_ = std::max(most_, running_);
    mu_.Await(absl::Condition(&released_));
    --running_;
    return grpc::Status::OK;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  int running() {
    absl::MutexLock lock(&mu_);
    return running_;
  }
  int most() {
    absl::MutexLock lock(&mu_);
    return most_;
  }

 private:
  absl::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int most_ ABSL_GUARDED_BY(mu_) = 0;
};

// One connection runs at most max_concurrent_streams calls at once (2 here); the others wait in
// the client and run as places free up. Before, the streams per connection were unbounded.
TEST(GrpcListenerTest, CallsPerConnectionAreCapped) {
  HeldHealth service;
  GrpcListenerOptions options;
  options.max_concurrent_streams = 2;
  Served s;
  ASSERT_NO_FATAL_FAILURE(Serve(&service, options, &s));
  auto stub = v1::Router::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(s.listener->port()), grpc::InsecureChannelCredentials()));
  std::vector<grpc::Status> statuses(5);
  std::vector<std::thread> calls;
  for (grpc::Status& status : statuses) {
    calls.emplace_back([&stub, &status] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
      v1::HealthResponse response;
      status = stub->Health(&context, v1::HealthRequest(), &response);
    });
  }
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (service.running() < 2 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(300));  // room for more to start, were they allowed
  EXPECT_EQ(service.running(), 2);
  service.Release();
  for (std::thread& t : calls) t.join();
  for (const grpc::Status& status : statuses) EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(service.most(), 2);
}

// Generate answers one message: the prompt's length.
class PromptLength final : public v1::Router::Service {
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    v1::GenerateResponse response;
    response.add_token_ids(static_cast<uint32_t>(request->prompt_token_ids_size()));
    writer->Write(response);
    return grpc::Status::OK;
  }
};

// The prompt's length as the server counted it, or the call's status.
grpc::Status PromptLengthOf(int port, int tokens, uint32_t* length) {
  auto stub = v1::Router::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  v1::GenerateRequest request;
  for (int i = 0; i < tokens; ++i) request.add_prompt_token_ids(100000 + i);  // 3 bytes each
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) *length = response.token_ids(0);
  return reader->Finish();
}

// The port's memory (a grpc::ResourceQuota, 4 GiB by default) bounds what its connections may
// make it buffer: a 3 MB request past a 1 MiB quota is refused RESOURCE_EXHAUSTED while small
// ones are served, and the default quota serves it. Before, no quota: the 3 MB request was
// buffered whatever the bound.
TEST(GrpcListenerTest, ARequestPastThePortsMemoryQuotaIsRefused) {
  PromptLength service;
  GrpcListenerOptions options;
  options.memory_quota_bytes = 1 << 20;
  {
    Served s;
    ASSERT_NO_FATAL_FAILURE(Serve(&service, options, &s));
    uint32_t length = 0;
    grpc::Status status = PromptLengthOf(s.listener->port(), 1000000, &length);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    status = PromptLengthOf(s.listener->port(), 1000, &length);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(length, 1000u);
  }
  Served s;
  ASSERT_NO_FATAL_FAILURE(Serve(&service, GrpcListenerOptions(), &s));
  uint32_t length = 0;
  const grpc::Status status = PromptLengthOf(s.listener->port(), 1000000, &length);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(length, 1000000u);
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
