#include "common/http/tls_context.h"

#include <openssl/ssl.h>

#include <boost/asio/buffer.hpp>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::http {
namespace {

namespace ssl = boost::asio::ssl;
using boost::asio::buffer;

constexpr auto kProtocolOptions = ssl::context::default_workarounds | ssl::context::no_sslv2 |
                                  ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                                  ssl::context::no_tlsv1_1 | ssl::context::single_dh_use;

absl::Status Invalid(const std::string& what, const boost::system::error_code& ec) {
  return absl::InvalidArgumentError(absl::StrCat("TLS: bad ", what, ": ", ec.message()));
}

// Loads a certificate chain + key and checks they belong together.
absl::Status UseCertificate(ssl::context& ctx, const std::string& cert_pem,
                            const std::string& key_pem) {
  boost::system::error_code ec;
  ctx.use_certificate_chain(buffer(cert_pem), ec);
  if (ec) return Invalid("certificate", ec);
  ctx.use_private_key(buffer(key_pem), ssl::context::pem, ec);
  if (ec) return Invalid("private key", ec);
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
    return absl::InvalidArgumentError("TLS: the private key does not match the certificate");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ssl::context>> MakeServerTlsContext(
    const ServerTlsOptions& options) {
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
  ctx->set_options(kProtocolOptions);
  if (absl::Status s = UseCertificate(*ctx, options.cert_pem, options.key_pem); !s.ok()) return s;
  if (!options.client_ca_pem.empty()) {
    boost::system::error_code ec;
    ctx->add_certificate_authority(buffer(options.client_ca_pem), ec);
    if (ec) return Invalid("client CA", ec);
    ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    // Resumed sessions of verified clients need a context id, or OpenSSL fails the handshake.
    static constexpr unsigned char kSessionContext[] = "tandem-http";
    SSL_CTX_set_session_id_context(ctx->native_handle(), kSessionContext,
                                   sizeof(kSessionContext) - 1);
  }
  return ctx;
}

absl::StatusOr<std::unique_ptr<ssl::context>> MakeClientTlsContext(
    const ClientTlsOptions& options) {
  if (options.ca_pem.empty()) return absl::InvalidArgumentError("TLS: no CA to verify against");
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
  ctx->set_options(kProtocolOptions);
  boost::system::error_code ec;
  ctx->add_certificate_authority(buffer(options.ca_pem), ec);
  if (ec) return Invalid("CA", ec);
  ctx->set_verify_mode(ssl::verify_peer);
  if (!options.cert_pem.empty() || !options.key_pem.empty()) {
    if (absl::Status s = UseCertificate(*ctx, options.cert_pem, options.key_pem); !s.ok()) {
      return s;
    }
  }
  return ctx;
}

}  // namespace tandem::http
