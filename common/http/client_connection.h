// ClientConnection: one blocking TCP connection to an HTTP server, in plain text or TLS (OpenSSL
// through Boost.Asio), for tandem_cli's text commands and the HTTP tests. It moves bytes only:
// the caller writes the request and parses the response.
//
//   auto conn = ClientConnection::Connect("127.0.0.1", "8000", tls);   // tls: nullopt = plain
//   conn->Write("GET /health HTTP/1.1\r\n...");
//   for (char buf[4096]; size_t n = *conn->ReadSome(buf, sizeof(buf));) ...
//
// TLS: the server's certificate must chain to `tls->ca_pem` and name the host dialled (or
// `tls->server_name`); a client certificate is presented when given.
//
// Thread safety: one thread at a time.
#ifndef TANDEM_COMMON_HTTP_CLIENT_CONNECTION_H_
#define TANDEM_COMMON_HTTP_CLIENT_CONNECTION_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/http/tls.h"

namespace tandem::http {

class ClientConnection {
 public:
  // Resolves `host`, connects, and (with `tls`) completes the handshake. UNAVAILABLE when no
  // address connects or the handshake fails (the message says why: e.g. an untrusted
  // certificate); INVALID_ARGUMENT for bad TLS material.
  static absl::StatusOr<std::unique_ptr<ClientConnection>> Connect(
      const std::string& host, const std::string& port, const std::optional<ClientTlsOptions>& tls);
  ~ClientConnection();  // closes

  absl::Status Write(absl::string_view data);
  // Reads what is available (blocking until something is): the byte count, 0 once the server
  // has closed (TLS: close_notify, or a bare TCP close, which HTTP's own framing makes safe to
  // treat alike), UNAVAILABLE on a failure.
  absl::StatusOr<size_t> ReadSome(char* buffer, size_t size);
  // Closes the connection at once (no TLS close_notify: like a client that goes away).
  void Close();

  struct Impl;

 private:
  explicit ClientConnection(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_CLIENT_CONNECTION_H_
