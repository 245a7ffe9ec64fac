// Keepalive on a real gRPC connection over loopback: a server that allows the pings keeps the
// channel (and one with gRPC's default policy drops it: the reason for AllowKeepalivePings), and
// a link that goes silent (a TCP relay that stops forwarding, like a cable pulled: no FIN, no
// RST) is detected by the pings within kKeepaliveTime + kKeepaliveTimeout, while without
// keepalive the channel would stay READY.
#include "common/grpc_keepalive.h"

#include <arpa/inet.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// A server with one generic service that answers UNIMPLEMENTED: the connection (and its pings)
// is what is under test. The service outlives the server (declared first).
struct TestServer {
  grpc::CallbackGenericService no_methods;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

std::unique_ptr<TestServer> StartServer(bool allow_pings) {
  auto t = std::make_unique<TestServer>();
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&t->no_methods);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &t->port);
  if (allow_pings) AllowKeepalivePings(builder);
  t->server = builder.BuildAndStart();
  return t;
}

std::shared_ptr<grpc::Channel> Connect(int port, bool keepalive) {
  grpc::ChannelArguments args;
  if (keepalive) EnableKeepalive(args);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                           grpc::InsecureChannelCredentials(), args);
  EXPECT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)));
  return channel;
}

// Whether a READY channel is still READY after `idle` (GOAWAY or a dead transport moves it).
bool StaysReady(grpc::Channel& channel, absl::Duration idle) {
  return !channel.WaitForStateChange(GRPC_CHANNEL_READY, absl::ToChronoTime(absl::Now() + idle));
}

// One-connection TCP relay 127.0.0.1:port() -> 127.0.0.1:target. Freeze() stops forwarding in
// both directions but keeps both sockets open: the peer goes silent as behind a dead link.
class FreezableRelay {
 public:
  explicit FreezableRelay(int target) : target_(target) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    listen(listener_, 1);
    thread_ = std::thread([this] { Run(); });
  }
  ~FreezableRelay() {
    stop_ = true;
    thread_.join();
    for (int fd : {listener_, client_, server_}) {
      if (fd >= 0) close(fd);
    }
  }
  int port() const { return port_; }
  void Freeze() { frozen_ = true; }

 private:
  void Run() {
    pollfd accept_fd{listener_, POLLIN, 0};
    while (!stop_ && poll(&accept_fd, 1, 50) <= 0) {
    }
    if (stop_) return;
    client_ = accept(listener_, nullptr, nullptr);
    server_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(target_));
    if (connect(server_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    char buf[16384];
    while (!stop_) {
      if (frozen_) {  // read nothing more: the kernel buffers fill, nothing reaches the peer
        usleep(20000);
        continue;
      }
      pollfd fds[2] = {{client_, POLLIN, 0}, {server_, POLLIN, 0}};
      if (poll(fds, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0) return;
        if (write(i == 0 ? server_ : client_, buf, static_cast<size_t>(n)) != n) return;
      }
    }
  }

  const int target_;
  int listener_ = -1, client_ = -1, server_ = -1, port_ = 0;
  std::atomic<bool> stop_{false}, frozen_{false};
  std::thread thread_;
};

TEST(GrpcKeepaliveTest, ServerThatAllowsPingsKeepsThePingingChannel) {
  std::unique_ptr<TestServer> t = StartServer(/*allow_pings=*/true);
  ASSERT_NE(t->server, nullptr);
  std::shared_ptr<grpc::Channel> channel = Connect(t->port, /*keepalive=*/true);
  EXPECT_TRUE(StaysReady(*channel, absl::Seconds(5)));
  t->server->Shutdown(absl::ToChronoTime(absl::Now()));
}

// The control: gRPC's default server policy (2 strikes for pings closer than 5 minutes) sends
// the pinging channel GOAWAY "too_many_pings" after a few seconds, which is why every server
// our keepalive channels talk to calls AllowKeepalivePings.
TEST(GrpcKeepaliveTest, DefaultServerDropsThePingingChannel) {
  std::unique_ptr<TestServer> t = StartServer(/*allow_pings=*/false);
  ASSERT_NE(t->server, nullptr);
  std::shared_ptr<grpc::Channel> channel = Connect(t->port, /*keepalive=*/true);
  EXPECT_FALSE(StaysReady(*channel, absl::Seconds(5)));
  t->server->Shutdown(absl::ToChronoTime(absl::Now()));
}

TEST(GrpcKeepaliveTest, ASilentLinkIsDetectedWithinTheKeepaliveBound) {
  std::unique_ptr<TestServer> t = StartServer(/*allow_pings=*/true);
  ASSERT_NE(t->server, nullptr);
  FreezableRelay relay(t->port);
  std::shared_ptr<grpc::Channel> channel = Connect(relay.port(), /*keepalive=*/true);
  relay.Freeze();
  const absl::Time frozen = absl::Now();
  EXPECT_FALSE(StaysReady(*channel, absl::Seconds(5)));
  const absl::Duration detected = absl::Now() - frozen;
  // gRPC spaces pings at least 1 s apart: ping within kKeepaliveTime, no ack within
  // kKeepaliveTimeout; slack for a loaded CI host.
  EXPECT_LT(detected, kKeepaliveTime + kKeepaliveTimeout + absl::Milliseconds(1500)) << detected;
  std::printf("silent link detected after %s\n", absl::FormatDuration(detected).c_str());
  t->server->Shutdown(absl::ToChronoTime(absl::Now()));
}

TEST(GrpcKeepaliveTest, WithoutKeepaliveASilentLinkGoesUnnoticed) {
  std::unique_ptr<TestServer> t = StartServer(/*allow_pings=*/true);
  ASSERT_NE(t->server, nullptr);
  FreezableRelay relay(t->port);
  std::shared_ptr<grpc::Channel> channel = Connect(relay.port(), /*keepalive=*/false);
  relay.Freeze();
  EXPECT_TRUE(StaysReady(*channel, absl::Seconds(3)));
  t->server->Shutdown(absl::ToChronoTime(absl::Now()));
}

}  // namespace
}  // namespace tandem
