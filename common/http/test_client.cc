#include "common/http/test_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/http/client_connection.h"

namespace tandem::http {

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string Dechunk(const std::string& raw) {
  std::string out;
  size_t at = 0;
  while (at < raw.size()) {
    const size_t eol = raw.find("\r\n", at);
    if (eol == std::string::npos) break;
    int64_t n = 0;
    if (!absl::SimpleHexAtoi(raw.substr(at, eol - at), &n) || n == 0) break;
    out += raw.substr(eol + 2, n);
    at = eol + 2 + n + 2;
  }
  return out;
}

namespace {

std::string RequestText(const std::string& method, const std::string& path, const std::string& body,
                        const std::vector<std::string>& headers) {
  return absl::StrCat(
      method, " ", path, " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n",
      absl::StrJoin(
          headers, "",
          [](std::string* out, const std::string& h) { absl::StrAppend(out, h, "\r\n"); }),
      "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
}

TestResponse ParseResponse(const std::string& raw) {
  TestResponse r;
  const size_t head = raw.find("\r\n\r\n");
  if (head == std::string::npos || raw.size() < 12) return r;
  absl::SimpleAtoi(raw.substr(9, 3), &r.status);
  r.body = raw.substr(head + 4);
  if (raw.substr(0, head).find("chunked") != std::string::npos) r.body = Dechunk(r.body);
  return r;
}

}  // namespace

TestResponse HttpCall(int port, const std::string& method, const std::string& path,
                      const std::string& body, const std::vector<std::string>& headers) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return TestResponse{};
  const std::string req = RequestText(method, path, body, headers);
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return TestResponse{};
  }
  std::string raw;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) raw.append(buf, n);
  close(fd);
  return ParseResponse(raw);
}

TestResponse HttpsCall(int port, const ClientTlsOptions& tls, const std::string& method,
                       const std::string& path, const std::string& body,
                       const std::vector<std::string>& headers) {
  absl::StatusOr<std::unique_ptr<ClientConnection>> conn =
      ClientConnection::Connect("127.0.0.1", absl::StrCat(port), tls);
  if (!conn.ok() || !(*conn)->Write(RequestText(method, path, body, headers)).ok()) {
    return TestResponse{};
  }
  std::string raw;
  char buf[8192];
  for (absl::StatusOr<size_t> n; (n = (*conn)->ReadSome(buf, sizeof(buf))).ok() && *n > 0;) {
    raw.append(buf, *n);
  }
  return ParseResponse(raw);
}

}  // namespace tandem::http
