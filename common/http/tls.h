// TLS settings of the HTTP plane, as plain PEM text (no OpenSSL types): what HttpServer serves
// with (HTTPS, optionally mutual TLS) and what ClientConnection dials with. The daemons fill
// them from common/security's SecurityConfig (the same files as their gRPC ports).
#ifndef TANDEM_COMMON_HTTP_TLS_H_
#define TANDEM_COMMON_HTTP_TLS_H_

#include <string>

namespace tandem::http {

struct ServerTlsOptions {
  std::string cert_pem;  // certificate chain, leaf first
  std::string key_pem;   // its private key
  // Non-empty: clients must present a certificate chaining to this CA bundle (mutual TLS), or
  // the handshake fails. Empty: no client certificate is asked for.
  std::string client_ca_pem;
};

struct ClientTlsOptions {
  std::string ca_pem;  // the server's certificate must chain to this CA bundle
  // The name the server's certificate must carry (DNS name or IP address; also sent as SNI when
  // a DNS name). Empty: the host dialled.
  std::string server_name;
  // Optional client certificate (servers that require mutual TLS); both or neither.
  std::string cert_pem;
  std::string key_pem;
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_TLS_H_
