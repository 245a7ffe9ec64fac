// HttpServer: a small asynchronous HTTP/1.1 server (Boost.Beast 1.74 from Debian) for the
// daemons' HTTP planes: the router's OpenAI-compatible API, and `/metrics` + `/health` on the
// router and every worker.
//
// Asynchronous: a fixed pool of `threads` runs every connection (thousands of open streams do not
// mean thousands of threads). Handlers run on those threads and must not block: a handler replies
// (Responder::Reply) or starts a stream (Responder::StartStream, then writes to it) at once or
// later from any thread (Server-Sent Events, chunked). A client that disconnects mid-stream
// cancels the stream: `cancelled()` turns true and the OnCancel callback runs once (e.g. to abort
// the request on the workers). A client that disconnects while its handler has not answered yet
// cancels the same way (Responder::OnCancel): the server reads the connection while it waits (a
// pipelined next request's first bytes are kept for it).
//
// Headers first: a request's line and headers are read, then `admission` (e.g. the API key),
// the body's size (over `max_body_bytes`: 413) and the server-wide body budget (over
// `max_buffered_body_bytes` in flight: 503 with Retry-After) decide on it before its body is read;
// a refused request's body is drained unread and the connection closed. `Expect: 100-continue`
// is answered once admitted. A request's body is freed when its handler returns.
// Limits: headers over 16 KiB get 431, a request line and headers begun but not whole within
// `read_timeout` get 408 and the connection closes (an idle connection, fresh or kept alive, just
// closes), a body not whole within `read_timeout` (shorter than its Content-Length) gets 408 and
// the connection closes, more than
// `max_connections` open connections are refused (closed at accept). Bad requests get 400. Unknown
// paths 404, known path with another method 405. Errors are JSON `{"error": {"message", "type",
// "code"}}` (OpenAI's shape).
//
// HTTPS: with `tls` set every connection starts with a TLS handshake (TLS 1.2+; with a client CA,
// clients must present a certificate chaining to it). A failed handshake closes the connection; a
// plain HTTP request gets a plain 400 saying the port speaks HTTPS. Handlers and streams work the
// same either way.
//
// Thread safety: Start/Stop from one thread; a ResponseStream from any thread.
#ifndef TANDEM_COMMON_HTTP_HTTP_SERVER_H_
#define TANDEM_COMMON_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/http/tls.h"

namespace tandem::http {

struct Request {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // without the query
  std::string query;                           // after '?', undecoded
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string peer;  // "ip:port" of the client
  // The header's value, or "" when absent (`name` lower-case).
  std::string Header(const std::string& name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// OpenAI's error body: {"error": {"message": ..., "type": ..., "code": status}}.
Response ErrorResponse(int status, const std::string& message, const std::string& type = "");

// The body of a streamed response. Thread-safe.
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  // Queues `data` as one chunk; false once the client is gone (nothing more will be sent).
  virtual bool Write(std::string data) = 0;
  // Ends the response (the last chunk); later Writes return false.
  virtual void Close() = 0;
  virtual bool cancelled() const = 0;
  // Runs `fn` once when the client disconnects before Close (at once if it already has).
  virtual void OnCancel(std::function<void()> fn) = 0;
};

// How a handler answers: now, or later from any thread (keep the shared_ptr), e.g. after running
// a request on a worker pool.
class Responder {
 public:
  virtual ~Responder() = default;
  // Exactly one of Reply or StartStream, once; from any thread.
  virtual void Reply(Response response) = 0;
  virtual std::shared_ptr<ResponseStream> StartStream(
      int status, const std::string& content_type,
      std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  // Runs `fn` once when the client disconnects before its answer (at once if it already has),
  // e.g. to abort the work behind a Reply still to come; a later Reply is then dropped. A
  // stream's disconnects are ResponseStream::OnCancel's.
  virtual void OnCancel(std::function<void()> fn) = 0;
};

using Handler = std::function<void(const Request&, std::shared_ptr<Responder>)>;

// Decides on a request from its request line and headers alone (Request::body is empty), before
// any byte of its body is read: nullopt lets it in; a Response refuses it (sent at once, the body
// is never read, the connection closes). E.g. an API-key check: a client without a key cannot
// make the server buffer anything.
using Admission = std::function<std::optional<Response>(const Request& headers_only)>;

struct HttpServerOptions {
  std::string address = "127.0.0.1";  // the interface to bind
  int port = 0;                       // 0: any free port (see HttpServer::port)
  int threads = 2;
  uint64_t max_body_bytes = 8 << 20;  // one request's body; more -> 413 before reading it
  // The bodies all connections may hold at once: a request is admitted with its Content-Length
  // (max_body_bytes when chunked) reserved, else 503 before its body is read (body_budget.h).
  uint64_t max_buffered_body_bytes = 64 << 20;
  Admission admission;  // unset: every request is read
  absl::Duration read_timeout = absl::Seconds(30);
  int max_connections = 10000;          // and at most a quarter of RLIMIT_NOFILE's soft limit
  std::optional<ServerTlsOptions> tls;  // unset: plain HTTP
};

class HttpServer {
 public:
  // Routes: (method, path) -> handler. INVALID_ARGUMENT for a bad address or bad TLS material,
  // UNAVAILABLE when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options,
      std::map<std::pair<std::string, std::string>, Handler> routes);
  // Stops accepting, closes every connection (open streams are cancelled), joins the threads.
  ~HttpServer();
  int port() const;
  // Open connections now (tests, benchmarks).
  int connections() const;

  struct Impl;

 private:
  explicit HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_HTTP_SERVER_H_
