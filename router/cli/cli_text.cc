#include "router/cli/cli_text.h"

#include <cstdio>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/http/client_connection.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

using Json = nlohmann::json;

// Where the API is: --http's HOST:PORT (an http:// or https:// prefix and a trailing '/' are
// accepted; the scheme must agree with the security mode) and how to talk to it.
struct Endpoint {
  std::string host, port;
  std::string host_port;  // for the Host header
  std::optional<http::ClientTlsOptions> tls;
};

absl::StatusOr<Endpoint> ParseEndpoint(const TextRequest& request) {
  absl::string_view address = request.http_address;
  if (absl::ConsumePrefix(&address, "https://") && !request.tls.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http=", request.http_address, " needs --tls_ca (the cluster CA)"));
  }
  if (absl::ConsumePrefix(&address, "http://") && request.tls.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http=", request.http_address, " is plain HTTP: use https:// or pass --insecure"));
  }
  absl::ConsumeSuffix(&address, "/");
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http must be HOST:PORT, got ", request.http_address));
  }
  return Endpoint{std::string(address.substr(0, colon)), std::string(address.substr(colon + 1)),
                  std::string(address), request.tls};
}

// One HTTP/1.1 exchange (Connection: close). `on_body` receives the de-chunked body as it comes.
template <typename OnBody>
absl::StatusOr<int> Exchange(const Endpoint& server, const std::string& api_key,
                             const std::string& method, const std::string& path,
                             const std::string& body, OnBody on_body) {
  absl::StatusOr<std::unique_ptr<http::ClientConnection>> conn =
      http::ClientConnection::Connect(server.host, server.port, server.tls);
  if (!conn.ok()) return conn.status();
  const std::string auth =
      api_key.empty() ? "" : absl::StrCat("\r\nAuthorization: Bearer ", api_key);
  const std::string req =
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", server.host_port, auth,
                   "\r\nConnection: close\r\nContent-Type: application/json",
                   "\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  if (absl::Status s = (*conn)->Write(req); !s.ok()) return s;
  std::string raw;
  int status = 0;
  bool chunked = false, in_body = false;
  char buf[8192];
  for (;;) {
    absl::StatusOr<size_t> n = (*conn)->ReadSome(buf, sizeof(buf));
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    raw.append(buf, *n);
    if (!in_body) {
      const size_t head = raw.find("\r\n\r\n");
      if (head == std::string::npos) continue;
      if (raw.size() > 12) absl::SimpleAtoi(raw.substr(9, 3), &status);
      chunked = raw.substr(0, head).find("chunked") != std::string::npos;
      raw.erase(0, head + 4);
      in_body = true;
    }
    if (!chunked) continue;
    // Hand over every complete chunk.
    for (;;) {
      const size_t eol = raw.find("\r\n");
      int64_t size = 0;
      if (eol == std::string::npos || !absl::SimpleHexAtoi(raw.substr(0, eol), &size)) break;
      if (raw.size() < eol + 2 + size + 2) break;
      on_body(raw.substr(eol + 2, size));
      raw.erase(0, eol + 2 + size + 2);
    }
  }
  if (!chunked) on_body(raw);
  if (status == 0) return absl::UnavailableError("no HTTP response");
  return status;
}

absl::StatusOr<std::string> FirstModel(const Endpoint& server, const std::string& api_key) {
  std::string body;
  absl::StatusOr<int> status =
      Exchange(server, api_key, "GET", "/v1/models", "", [&](const std::string& b) { body += b; });
  if (!status.ok()) return status.status();
  const Json j = Json::parse(body, nullptr, false);
  if (*status != 200 || j.is_discarded() || !j.contains("data") || j["data"].empty()) {
    return absl::UnavailableError(absl::StrCat("GET /v1/models: HTTP ", *status, " ", body));
  }
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace

absl::Status StreamText(const TextRequest& request) {
  absl::StatusOr<Endpoint> server = ParseEndpoint(request);
  if (!server.ok()) return server.status();
  std::string model = request.model;
  if (model.empty()) {
    absl::StatusOr<std::string> first = FirstModel(*server, request.api_key);
    if (!first.ok()) return first.status();
    model = *first;
  }
  Json body = {{"model", model},
               {"max_tokens", request.max_tokens},
               {"temperature", request.temperature},
               {"ignore_eos", request.ignore_eos},
               {"stream", true}};
  if (request.chat) {
    body["messages"] = Json::array({{{"role", "user"}, {"content", request.prompt}}});
  } else {
    body["prompt"] = request.prompt;
  }
  std::string pending, error_body;
  absl::Status error;
  absl::StatusOr<int> status = Exchange(
      *server, request.api_key, "POST", request.chat ? "/v1/chat/completions" : "/v1/completions",
      body.dump(), [&](const std::string& data) {
        pending += data;
        error_body += data;
        for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
          const std::string event = pending.substr(0, end);
          pending.erase(0, end + 2);
          if (event.rfind("data: {", 0) != 0) continue;
          const Json j = Json::parse(event.substr(6), nullptr, false);
          if (j.is_discarded()) continue;
          if (j.contains("error")) {
            error = absl::InternalError(j["error"].value("message", event));
            continue;
          }
          if (!j.contains("choices") || !j["choices"].is_array()) continue;
          for (const Json& c : j["choices"]) {
            const Json* holder = &c;
            if (request.chat) {
              if (!c.contains("delta")) continue;
              holder = &c["delta"];
            }
            const char* key = request.chat ? "content" : "text";
            if (holder->contains(key) && (*holder)[key].is_string()) {
              std::fputs((*holder)[key].get<std::string>().c_str(), stdout);
            }
          }
          std::fflush(stdout);
        }
      });
  if (!status.ok()) return status.status();
  std::fputc('\n', stdout);
  if (*status != 200) {
    const Json j = Json::parse(error_body, nullptr, false);
    const std::string message = !j.is_discarded() && j.contains("error")
                                    ? j["error"].value("message", error_body)
                                    : error_body;
    return absl::InvalidArgumentError(absl::StrCat("HTTP ", *status, ": ", message));
  }
  return error;
}

}  // namespace tandem::router
