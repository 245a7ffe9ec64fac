#include "router/openai/http_api.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/http/json_body.h"
#include "router/core/routing_policy.h"

namespace tandem::router::openai {
namespace {

using Json = nlohmann::json;

http::Response JsonResponse(const Json& body, int status = 200) {
  http::Response r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  return r;
}

http::Response StatusResponse(const absl::Status& s) {
  return http::ErrorResponse(HttpStatusFor(s), std::string(s.message()));
}

}  // namespace

int HttpStatusFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(const HttpApiOptions& options,
                                                        std::unique_ptr<ServedModel> model,
                                                        WorkerRegistry* registry,
                                                        RequestTable* requests,
                                                        Orchestrator* orchestrator) {
  std::unique_ptr<HttpApi> api(new HttpApi());
  api->options_ = options;
  api->model_ = std::move(model);
  api->registry_ = registry;
  api->requests_ = requests;
  api->orchestrator_ = orchestrator;
  HttpApi* self = api.get();
  std::map<std::pair<std::string, std::string>, http::Handler> routes;
  http::HttpServerOptions server_options;
  // Keys first, on the headers: nothing else is looked at for an unauthenticated request, and
  // its body is never read (a client without a key cannot make the router buffer anything).
  if (!options.api_keys.empty()) {
    server_options.admission =
        [keys = options.api_keys](const http::Request& head) -> std::optional<http::Response> {
      if (head.method == "GET" && head.path == "/health") return std::nullopt;
      if (keys.Authenticate(head.Header("authorization")).ok()) return std::nullopt;
      http::Response denied = http::ErrorResponse(401, "invalid or missing API key");
      denied.headers.emplace_back("WWW-Authenticate", "Bearer");
      return denied;
    };
  }
  routes[{"POST", "/v1/completions"}] = [self](const http::Request& q, auto r) {
    self->Completions(q, std::move(r), /*chat=*/false);
  };
  routes[{"POST", "/v1/chat/completions"}] = [self](const http::Request& q, auto r) {
    self->Completions(q, std::move(r), /*chat=*/true);
  };
  routes[{"GET", "/v1/models"}] = [self](const http::Request&, auto r) { self->Models(r); };
  routes[{"POST", "/tokenize"}] = [self](const http::Request& q, auto r) { self->Tokenize(q, r); };
  routes[{"POST", "/detokenize"}] = [self](const http::Request& q, auto r) {
    self->Detokenize(q, r);
  };
  routes[{"GET", "/health"}] = [self](const http::Request&, auto r) { self->Health(r); };
  server_options.address = options.address;
  server_options.port = options.port;
  server_options.threads = options.http_threads;
  server_options.tls = options.tls;
  server_options.max_body_bytes = options.max_body_bytes;
  server_options.max_buffered_body_bytes = options.max_buffered_body_bytes;
  absl::StatusOr<std::unique_ptr<http::HttpServer>> server =
      http::HttpServer::Start(server_options, std::move(routes));
  if (!server.ok()) return server.status();
  api->server_ = *std::move(server);
  return api;
}

HttpApi::~HttpApi() {
  std::deque<std::shared_ptr<CompletionJob>> waiting;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    waiting.swap(waiting_);
  }
  for (const auto& job : waiting) {
    job->Refuse(absl::UnavailableError("the router is shutting down"));
  }
  server_.reset();  // cancels open streams: their requests end on the workers
  absl::MutexLock lock(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
  mu_.Await(absl::Condition(&ended));
}

absl::Status HttpApi::RouteAvailable() const {
  const uint32_t probe = 0;
  RoutingSnapshot snap = registry_->Snapshot(absl::MakeConstSpan(&probe, 1), "");
  absl::StatusOr<RoutePlan> plan = ChooseRoute(snap.candidates);
  if (plan.ok()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("no worker can serve the request: ", plan.status().message()));
}

void HttpApi::Completions(const http::Request& req, std::shared_ptr<http::Responder> r, bool chat) {
  absl::StatusOr<Json> body = http::ParseJsonBody(req.body);
  if (!body.ok()) {
    r->Reply(StatusResponse(body.status()));
    return;
  }
  absl::StatusOr<CompletionParams> params = ParseCompletion(*body, chat, *model_, options_.limits);
  if (!params.ok()) {
    r->Reply(StatusResponse(params.status()));
    return;
  }
  if (absl::Status route = RouteAvailable(); !route.ok()) {
    r->Reply(StatusResponse(route));
    return;
  }
  auto job = std::make_shared<CompletionJob>(
      CompletionJob::Services{model_.get(), requests_, orchestrator_}, *std::move(params), r,
      [this] { JobEnded(); });
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      r->Reply(http::ErrorResponse(503, "the router is shutting down"));
      return;
    }
    if (running_ >= options_.max_running) {
      if (static_cast<int>(waiting_.size()) >= options_.max_pending) {
        r->Reply(http::ErrorResponse(429, "the router is overloaded; retry later"));
      } else {
        waiting_.push_back(std::move(job));
      }
      return;
    }
    ++running_;
  }
  job->Start();
}

void HttpApi::JobEnded() {
  std::shared_ptr<CompletionJob> next;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ && !waiting_.empty()) {
      next = std::move(waiting_.front());  // takes over the ended one's turn
      waiting_.pop_front();
    } else {
      --running_;  // the last touch of this object by the ended job
    }
  }
  if (next != nullptr) next->Start();
}

void HttpApi::Tokenize(const http::Request& req, std::shared_ptr<http::Responder> r) {
  absl::StatusOr<Json> parsed = http::ParseJsonBody(req.body);
  if (!parsed.ok()) {
    r->Reply(StatusResponse(parsed.status()));
    return;
  }
  const Json& body = *parsed;
  if (!body.is_object()) {
    r->Reply(http::ErrorResponse(400, "the body must be a JSON object"));
    return;
  }
  absl::StatusOr<std::vector<uint32_t>> ids;
  if (body.contains("messages")) {
    if (absl::Status shape = CheckChatShape(body, options_.limits); !shape.ok()) {
      r->Reply(StatusResponse(shape));
      return;
    }
    const auto ordered = nlohmann::ordered_json::parse(body.dump());
    ids = RenderChat(ordered["messages"], nlohmann::ordered_json(), *model_);
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    bool special = true;
    if (body.contains("add_special_tokens") && body["add_special_tokens"].is_boolean()) {
      special = body["add_special_tokens"].get<bool>();
    }
    absl::StatusOr<std::vector<int32_t>> encoded =
        model_->tokenizer->Encode(body["prompt"].get<std::string>(), special);
    if (encoded.ok()) {
      ids = std::vector<uint32_t>(encoded->begin(), encoded->end());
    } else {
      ids = absl::InvalidArgumentError(absl::StrCat("'prompt' ", encoded.status().message()));
    }
  } else {
    ids = absl::InvalidArgumentError("'prompt' (a string) or 'messages' is required");
  }
  if (!ids.ok()) {
    r->Reply(StatusResponse(ids.status()));
    return;
  }
  r->Reply(JsonResponse(
      {{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", model_->max_model_len}}));
}

void HttpApi::Detokenize(const http::Request& req, std::shared_ptr<http::Responder> r) {
  absl::StatusOr<Json> parsed = http::ParseJsonBody(req.body);
  if (!parsed.ok()) {
    r->Reply(StatusResponse(parsed.status()));
    return;
  }
  const Json& body = *parsed;
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
    r->Reply(http::ErrorResponse(400, "'tokens' (a list of token ids) is required"));
    return;
  }
  std::vector<int32_t> ids;
  for (const Json& t : body["tokens"]) {
    const std::optional<uint32_t> id = TokenIdOf(t, model_->tokenizer->vocab_size());
    if (!id.has_value()) {  // never wrapped: 2^63 is not id 0, 2^32 + 100 not id 100
      r->Reply(http::ErrorResponse(400, absl::StrCat("'tokens' must hold token ids in [0, ",
                                                     model_->tokenizer->vocab_size(), ")")));
      return;
    }
    ids.push_back(static_cast<int32_t>(*id));
  }
  absl::StatusOr<std::string> text = model_->tokenizer->Decode(ids, false);
  if (!text.ok()) {
    r->Reply(http::ErrorResponse(400, absl::StrCat("'tokens' ", text.status().message())));
    return;
  }
  r->Reply(JsonResponse({{"prompt", *text}}));
}

void HttpApi::Models(std::shared_ptr<http::Responder> r) {
  Json model = {{"id", model_->name},
                {"object", "model"},
                {"created", absl::ToUnixSeconds(absl::Now())},
                {"owned_by", "tandem"},
                {"max_model_len", model_->max_model_len}};
  r->Reply(JsonResponse({{"object", "list"}, {"data", Json::array({model})}}));
}

void HttpApi::Health(std::shared_ptr<http::Responder> r) {
  const absl::Status route = RouteAvailable();
  http::Response res;
  res.content_type = "text/plain";
  res.status = route.ok() ? 200 : 503;
  res.body = route.ok() ? "ok\n" : absl::StrCat(route.message(), "\n");
  r->Reply(std::move(res));
}

}  // namespace tandem::router::openai
