// tandem_cli's text commands: `generate --prompt=TEXT` and `chat --prompt=TEXT` talk to the
// router's OpenAI-compatible HTTP API (router/openai/), which tokenizes and applies the chat
// template, and print the streamed text as it arrives (complete UTF-8 only, as the API sends it).
#ifndef TANDEM_ROUTER_CLI_CLI_TEXT_H_
#define TANDEM_ROUTER_CLI_CLI_TEXT_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/http/tls.h"

namespace tandem::router {

struct TextRequest {
  // HOST:PORT of the router's HTTP API (or https://HOST:PORT, http://HOST:PORT: the scheme must
  // agree with `tls`).
  std::string http_address;
  std::string model;  // empty: the first of GET /v1/models
  std::string prompt;
  bool chat = false;  // a user message through the chat template
  int64_t max_tokens = 16;
  double temperature = 0.0;
  bool ignore_eos = false;
  std::string api_key;                        // sent as `Authorization: Bearer` when set
  std::optional<http::ClientTlsOptions> tls;  // HTTPS (the router's default); unset: plain HTTP
};

// Streams the completion's text to stdout (a newline at the end). UNAVAILABLE when the API cannot
// be reached (or the TLS handshake fails: an untrusted certificate, a plain HTTP server); the API's
// error message (with its HTTP status) otherwise.
absl::Status StreamText(const TextRequest& request);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CLI_CLI_TEXT_H_
