// GrpcListener: a daemon's gRPC port, accepted by us and served by a grpc::Server.
//
// gRPC 1.51 (Debian's) stops listening on a port for good after one failed accept(): a flood of
// connections that exhausts the process's file descriptors (EMFILE) leaves the daemon running
// with its gRPC port dead, every later client timing out "before receiving SETTINGS". This
// listener owns the listening socket instead and hands each accepted connection to the server
// (gRPC's external connection acceptor, the same TLS / mTLS credentials); a failed accept is
// logged and retried after 100 ms, so the port serves again once descriptors are free.
//
// Bounded (GrpcListenerOptions): gRPC 1.51 has no cap on a server's connections (its
// GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS came later), so the listener keeps its own count of
// the connections it handed over that are still open and, past `max_connections`, accepts a new
// one and closes it at once (as HttpServer does). A connection that never completes its TLS
// handshake and HTTP/2 preface is dropped by the server after `handshake_timeout`
// (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, set on the builder; gRPC's default is 2 minutes), which
// frees its place: idle TCP connections cannot hold the port's places for long. The server also
// pings every connection (keepalive_time) and closes one whose peer stopped answering
// (keepalive_timeout), runs at most max_concurrent_streams calls per connection, and holds the
// port's connections to memory_quota_bytes together (a grpc::ResourceQuota): gRPC's defaults are
// a ping every 2 hours and neither bound.
//
//   grpc::ServerBuilder builder;
//   ASSIGN_OR_RETURN(auto listener, GrpcListener::Add("127.0.0.1:0", creds, &builder));
//   ... RegisterService ...; server = builder.BuildAndStart();
//   listener->Start();                   // accepts from here on; listener->port() is bound
//   ... server->Shutdown(); listener.reset();
//
// Thread safety: Add / Start / destruction from one thread; one accept thread of its own.
#ifndef TANDEM_COMMON_GRPC_LISTENER_H_
#define TANDEM_COMMON_GRPC_LISTENER_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grpc_listener_options.h"

namespace tandem {

class GrpcListener {
 public:
  // How long the accept loop waits after a failed accept (EMFILE, ENFILE, ENOBUFS, ENOMEM).
  static constexpr std::chrono::milliseconds kAcceptRetry{100};
  // At the cap, how often the listener looks again for connections the server has closed.
  static constexpr std::chrono::milliseconds kRecountInterval{10};

  // Binds and listens on `address` (HOST:PORT; port 0: any free one; HOST an IP address, IPv6
  // in brackets, or a name resolved once) and registers with `builder` in place of its
  // AddListeningPort; sets the builder's handshake timeout. UNAVAILABLE when the address cannot
  // be bound.
  static absl::StatusOr<std::unique_ptr<GrpcListener>> Add(
      const std::string& address, std::shared_ptr<grpc::ServerCredentials> credentials,
      grpc::ServerBuilder* builder, const GrpcListenerOptions& options = {});
  // Stops accepting and closes the listening socket (connections already handed over stay the
  // server's).
  ~GrpcListener();

  // The bound port.
  int port() const { return port_; }
  // Starts accepting; call once the server is built and started.
  void Start();
  // Connections handed to the server and open when last counted (tests).
  int connections() const { return connections_.load(); }
  // The cap in force (options' max_connections, clamped).
  int max_connections() const { return max_connections_; }

 private:
  // A connection handed to the server, known by its socket's identity: the descriptor number
  // alone may be reused once the server closed it.
  struct Handed {
    int fd;
    dev_t dev;
    ino_t ino;
  };

  GrpcListener() = default;
  void AcceptLoop();
  // Hands `fd` to the server, or closes it when the cap is reached.
  void Admit(int fd);
  // Forgets the connections the server has closed (a descriptor no longer that socket).
  void Recount();

  int max_connections_ = 0;
  std::vector<Handed> handed_;  // the accept thread's
  std::chrono::steady_clock::time_point last_recount_{};
  std::atomic<int> connections_{0};
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that ends the accept loop
  int port_ = 0;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRPC_LISTENER_H_
