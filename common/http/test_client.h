// A raw-socket HTTP/1.1 client for tests: one exchange per connection (Connection: close), the
// status and the body (chunked transfer decoded). Loopback only; HttpsCall speaks TLS.
#ifndef TANDEM_COMMON_HTTP_TEST_CLIENT_H_
#define TANDEM_COMMON_HTTP_TEST_CLIENT_H_

#include <string>
#include <vector>

#include "common/http/tls.h"

namespace tandem::http {

struct TestResponse {
  int status = 0;  // 0: no response (connection failed)
  std::string body;
};

// A connected TCP socket to 127.0.0.1:port with a 30 s receive timeout, or -1.
int ConnectLoopback(int port);

// `headers`: extra "Name: value" lines (e.g. "Authorization: Bearer KEY").
TestResponse HttpCall(int port, const std::string& method, const std::string& path,
                      const std::string& body = "", const std::vector<std::string>& headers = {});

// HttpCall over TLS to 127.0.0.1:port (the certificate must name 127.0.0.1 or
// `tls.server_name`); status 0 when the connection or the handshake fails.
TestResponse HttpsCall(int port, const ClientTlsOptions& tls, const std::string& method,
                       const std::string& path, const std::string& body = "",
                       const std::vector<std::string>& headers = {});

// `raw` (a chunked body) decoded.
std::string Dechunk(const std::string& raw);

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_TEST_CLIENT_H_
