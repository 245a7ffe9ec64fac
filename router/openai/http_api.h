// HttpApi: the router's OpenAI-compatible HTTP API (text in, text out) on its own port:
//   POST /v1/completions, POST /v1/chat/completions (stream or not; SSE `data:` chunks, usage,
//   `[DONE]`), GET /v1/models, POST /tokenize, POST /detokenize (vLLM's shapes), GET /health.
// Text is tokenized / the chat template rendered in the router (tokenizer/, no Python); each
// choice runs through the same Orchestrator as the gRPC API; tokens come back through an
// IncrementalDecoder (complete UTF-8 only) and a StopMatcher (stop strings across tokens, the
// output cut before them, the request then aborted on the workers).
//
// Threads: the HTTP server's pool (asynchronous connections) and the Orchestrator's (requests are
// state machines there, completion_job.h): no thread per open stream nor per generating request.
// `max_running` requests generate at once (every choice of each: n > 1 or several prompts run at
// once), `max_pending` more wait for a turn (holding no thread), more than that get 429. A client
// that disconnects mid-stream cancels its requests on P and D.
//
// Errors (OpenAI's JSON): 400 naming the field, 404 unknown model or path, 413 body too large,
// 429 overloaded, 503 no workers, 504 deadline; an error after a stream started is sent as an
// SSE `data: {"error": ...}` event before `[DONE]`.
//
// Thread safety: Start / destruction from one thread; handlers run concurrently.
#ifndef TANDEM_ROUTER_OPENAI_HTTP_API_H_
#define TANDEM_ROUTER_OPENAI_HTTP_API_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/http/http_server.h"
#include "common/security/api_keys.h"
#include "router/core/orchestrator.h"
#include "router/core/request_table.h"
#include "router/core/worker_registry.h"
#include "router/openai/completion_job.h"
#include "router/openai/protocol.h"

namespace tandem::router::openai {

struct HttpApiOptions {
  std::string address = "127.0.0.1";
  int port = 0;  // 0: any free port
  int http_threads = 2;
  int max_running = 1024;  // requests generating at once (no thread each)
  int max_pending = 1024;  // waiting behind them; more -> 429
  ApiLimits limits;
  // Non-empty: every route but GET /health needs `Authorization: Bearer <key>`; otherwise 401
  // with OpenAI's error body (type "authentication_error"), the same for every failure.
  security::ApiKeySet api_keys;
  // One request's body, and all bodies in flight together (http_server.h: 413 / 503 past them,
  // before the body is read).
  uint64_t max_body_bytes = 8 << 20;
  uint64_t max_buffered_body_bytes = 64 << 20;
  // Set: HTTPS (the router's public certificate; a client CA makes it mutual TLS). Unset: plain
  // HTTP (--insecure).
  std::optional<http::ServerTlsOptions> tls;
};

class HttpApi {
 public:
  // `registry`, `requests` and `orchestrator` outlive the API (the RouterServer's).
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(const HttpApiOptions& options,
                                                        std::unique_ptr<ServedModel> model,
                                                        WorkerRegistry* registry,
                                                        RequestTable* requests,
                                                        Orchestrator* orchestrator);
  // Refuses the waiting requests (503), stops the server (open streams cancelled: their
  // requests end on the workers), then waits for the running requests to end.
  ~HttpApi();
  int port() const { return server_->port(); }
  const ServedModel& model() const { return *model_; }

 private:
  HttpApi() = default;
  void Completions(const http::Request& req, std::shared_ptr<http::Responder> r, bool chat);
  void Tokenize(const http::Request& req, std::shared_ptr<http::Responder> r);
  void Detokenize(const http::Request& req, std::shared_ptr<http::Responder> r);
  void Models(std::shared_ptr<http::Responder> r);
  void Health(std::shared_ptr<http::Responder> r);
  // OK when some healthy route exists; UNAVAILABLE naming why not.
  absl::Status RouteAvailable() const;
  // A completion request ended: the next waiting one (if any) takes its turn.
  void JobEnded();

  HttpApiOptions options_;
  std::unique_ptr<ServedModel> model_;
  WorkerRegistry* registry_ = nullptr;
  RequestTable* requests_ = nullptr;
  Orchestrator* orchestrator_ = nullptr;
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // completion requests generating now
  std::deque<std::shared_ptr<CompletionJob>> waiting_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<http::HttpServer> server_;
};

// absl status code -> HTTP status (INVALID_ARGUMENT 400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
// UNAVAILABLE 503, DEADLINE_EXCEEDED 504, UNAUTHENTICATED 401, else 500).
int HttpStatusFor(const absl::Status& status);

}  // namespace tandem::router::openai

#endif  // TANDEM_ROUTER_OPENAI_HTTP_API_H_
