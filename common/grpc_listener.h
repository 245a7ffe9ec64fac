// GrpcListener: a daemon's gRPC port, accepted by us and served by a grpc::Server.
//
// gRPC 1.51 (Debian's) stops listening on a port for good after one failed accept(): a flood of
// connections that exhausts the process's file descriptors (EMFILE) leaves the daemon running
// with its gRPC port dead, every later client timing out "before receiving SETTINGS". This
// listener owns the listening socket instead and hands each accepted connection to the server
// (gRPC's external connection acceptor, the same TLS / mTLS credentials); a failed accept is
// logged and retried after 100 ms, so the port serves again once descriptors are free.
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

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace tandem {

class GrpcListener {
 public:
  // How long the accept loop waits after a failed accept (EMFILE, ENFILE, ENOBUFS, ENOMEM).
  static constexpr std::chrono::milliseconds kAcceptRetry{100};

  // Binds and listens on `address` (HOST:PORT; port 0: any free one; HOST an IP address, IPv6
  // in brackets, or a name resolved once) and registers with `builder` in place of its
  // AddListeningPort. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcListener>> Add(
      const std::string& address, std::shared_ptr<grpc::ServerCredentials> credentials,
      grpc::ServerBuilder* builder);
  // Stops accepting and closes the listening socket (connections already handed over stay the
  // server's).
  ~GrpcListener();

  // The bound port.
  int port() const { return port_; }
  // Starts accepting; call once the server is built and started.
  void Start();

 private:
  GrpcListener() = default;
  void AcceptLoop();

  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that ends the accept loop
  int port_ = 0;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRPC_LISTENER_H_
