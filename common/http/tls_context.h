// OpenSSL contexts (Boost.Asio) built from the PEM settings in tls.h, for HttpServer and
// ClientConnection. TLS 1.2 or newer only.
//
// Thread safety: a context is built once, then shared read-only by every connection.
#ifndef TANDEM_COMMON_HTTP_TLS_CONTEXT_H_
#define TANDEM_COMMON_HTTP_TLS_CONTEXT_H_

#include <boost/asio/ssl/context.hpp>
#include <memory>

#include "absl/status/statusor.h"
#include "common/http/tls.h"

namespace tandem::http {

// INVALID_ARGUMENT naming what is wrong: an unparsable certificate / key / CA, or a key that
// does not match the certificate.
absl::StatusOr<std::unique_ptr<boost::asio::ssl::context>> MakeServerTlsContext(
    const ServerTlsOptions& options);

// Verifies the server against `ca_pem` (the server name is checked per connection: see
// ClientConnection). INVALID_ARGUMENT as above; an empty CA is invalid too.
absl::StatusOr<std::unique_ptr<boost::asio::ssl::context>> MakeClientTlsContext(
    const ClientTlsOptions& options);

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_TLS_CONTEXT_H_
