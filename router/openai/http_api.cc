#include "router/openai/http_api.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "router/routing_policy.h"
#include "tokenizer/stop_matcher.h"

namespace tandem::router::openai {
namespace {

using Json = nlohmann::json;

std::string NewId(const char* prefix) {
  std::random_device rd;
  return absl::StrFormat("%s-%08x%08x", prefix, rd(), rd());
}

http::Response JsonResponse(const Json& body, int status = 200) {
  http::Response r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  return r;
}

http::Response StatusResponse(const absl::Status& s) {
  return http::ErrorResponse(HttpStatusFor(s), std::string(s.message()));
}

std::string Sse(const Json& body) {
  return absl::StrCat("data: ", body.dump(-1, ' ', false, Json::error_handler_t::replace), "\n\n");
}

std::string FinishReasonText(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_EOS:
    case v1::FINISH_REASON_STOP_TOKEN:
      return "stop";
    case v1::FINISH_REASON_ABORTED:
      return "abort";
    default:
      return "";
  }
}

// One choice: the orchestrator's chunks -> text (complete UTF-8, stop strings applied), streamed
// as SSE chunks or kept for the whole response. Also the orchestrator's view of the client.
class ChoiceRun final : public ResponseSink, public CallerContext {
 public:
  ChoiceRun(const ServedModel& model, const CompletionParams& params, int index,
            http::ResponseStream* stream, const std::string& id, int64_t created)
      : model_(model),
        params_(params),
        stream_(stream),
        id_(id),
        created_(created),
        decoder_(*model.tokenizer, params.skip_special_tokens),
        matcher_(params.stop) {
    choice_.index = index;
  }

  bool Send(const v1::GenerateResponse& chunk) override {
    std::string delta;
    for (uint32_t token : chunk.token_ids()) {
      ++completion_tokens_;
      absl::StatusOr<std::string> text = decoder_.Add(static_cast<int32_t>(token));
      if (!text.ok()) {
        error_ = text.status();
        return false;
      }
      tokenizer::StopMatcher::Result r = matcher_.Add(*text);
      delta += r.emit;
      if (r.stopped) {
        stopped_by_string_ = true;
        choice_.finish_reason = "stop";
        break;
      }
    }
    if (chunk.has_usage()) cached_tokens_ = chunk.usage().cached_prompt_tokens();
    if (!stopped_by_string_ && chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      delta += matcher_.Add(decoder_.Flush()).emit;
      if (!matcher_.stopped()) delta += matcher_.Flush();
      choice_.finish_reason = matcher_.stopped() ? "stop" : FinishReasonText(chunk.finish_reason());
    }
    Emit(delta);
    if (stopped_by_string_) return false;  // ends the request on the workers
    return stream_ == nullptr || !stream_->cancelled();
  }

  bool Cancelled() const override { return stream_ != nullptr && stream_->cancelled(); }
  absl::Time deadline() const override { return absl::InfiniteFuture(); }

  // The orchestrator's status, with this run's own outcome folded in.
  absl::Status Outcome(absl::Status orchestrated) const {
    if (!error_.ok()) return error_;
    if (stopped_by_string_) return absl::OkStatus();
    return orchestrated;
  }
  // Ends the choice in a stream (its finish chunk).
  void Finish() {
    if (stream_ != nullptr && !choice_.finish_reason.empty()) {
      Choice done{choice_.index, "", choice_.finish_reason};
      stream_->Write(Sse(ChunkBody(params_.chat, id_, created_, params_.model, done, !sent_)));
    }
  }
  const Choice& choice() const { return choice_; }
  uint64_t completion_tokens() const { return completion_tokens_; }
  uint64_t cached_tokens() const { return cached_tokens_; }

 private:
  void Emit(const std::string& delta) {
    if (stream_ == nullptr) {
      choice_.text += delta;
      return;
    }
    if (delta.empty() && sent_) return;
    Choice part{choice_.index, delta, ""};
    stream_->Write(Sse(ChunkBody(params_.chat, id_, created_, params_.model, part, !sent_)));
    sent_ = true;
  }

  const ServedModel& model_;
  const CompletionParams& params_;
  http::ResponseStream* const stream_;
  const std::string& id_;
  const int64_t created_;
  tokenizer::IncrementalDecoder decoder_;
  tokenizer::StopMatcher matcher_;
  Choice choice_;
  bool sent_ = false, stopped_by_string_ = false;
  uint64_t completion_tokens_ = 0, cached_tokens_ = 0;
  absl::Status error_;
};

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

JobPool::JobPool(int threads, int max_pending) : max_pending_(max_pending) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

JobPool::~JobPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool JobPool::Submit(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  if (stop_ || static_cast<int>(jobs_.size()) >= max_pending_) return false;
  jobs_.push_back(std::move(job));
  return true;
}

void JobPool::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !jobs_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
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
  api->pool_ = std::make_unique<JobPool>(options.max_running, options.max_pending);
  HttpApi* self = api.get();
  std::map<std::pair<std::string, std::string>, http::Handler> routes;
  // Keys first: nothing else (not even the body) is looked at for an unauthenticated request.
  const auto with_key = [keys = options.api_keys](http::Handler handler) -> http::Handler {
    if (keys.empty()) return handler;
    return [keys, handler](const http::Request& q, std::shared_ptr<http::Responder> r) {
      if (!keys.Authenticate(q.Header("authorization")).ok()) {
        http::Response denied = http::ErrorResponse(401, "invalid or missing API key");
        denied.headers.emplace_back("WWW-Authenticate", "Bearer");
        r->Reply(std::move(denied));
        return;
      }
      handler(q, std::move(r));
    };
  };
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
  for (auto& [route, handler] : routes) handler = with_key(std::move(handler));
  routes[{"GET", "/health"}] = [self](const http::Request&, auto r) { self->Health(r); };
  http::HttpServerOptions server_options;
  server_options.address = options.address;
  server_options.port = options.port;
  server_options.threads = options.http_threads;
  server_options.tls = options.tls;
  absl::StatusOr<std::unique_ptr<http::HttpServer>> server =
      http::HttpServer::Start(server_options, std::move(routes));
  if (!server.ok()) return server.status();
  api->server_ = *std::move(server);
  return api;
}

HttpApi::~HttpApi() {
  server_.reset();  // cancels open streams: their requests end on the workers
  pool_.reset();
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
  const Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    r->Reply(http::ErrorResponse(400, "the body is not valid JSON"));
    return;
  }
  absl::StatusOr<CompletionParams> params = ParseCompletion(body, chat, *model_, options_.limits);
  if (!params.ok()) {
    r->Reply(StatusResponse(params.status()));
    return;
  }
  if (absl::Status route = RouteAvailable(); !route.ok()) {
    r->Reply(StatusResponse(route));
    return;
  }
  auto shared = std::make_shared<CompletionParams>(*std::move(params));
  if (!pool_->Submit([this, shared, r] { Run(*shared, r); })) {
    r->Reply(http::ErrorResponse(429, "the router is overloaded; retry later"));
  }
}

HttpApi::ChoiceResult HttpApi::RunChoice(const CompletionParams& params,
                                         const std::vector<uint32_t>& prompt, int k, int index,
                                         http::ResponseStream* stream, const std::string& id,
                                         int64_t created) {
  ChoiceResult out;
  v1::GenerateRequest request;
  for (uint32_t t : prompt) request.add_prompt_token_ids(t);
  v1::SamplingParams* s = request.mutable_sampling();
  s->set_max_tokens(params.max_tokens);
  s->set_temperature(params.temperature);
  s->set_top_p(params.top_p);
  s->set_top_k(params.top_k);
  if (params.seed.has_value()) s->set_seed(*params.seed + k);
  for (uint32_t t : params.stop_token_ids) s->add_stop_token_ids(t);
  s->set_ignore_eos(params.ignore_eos);
  request.set_cache_salt(params.user);
  absl::StatusOr<Admission> admission = requests_->Admit("");
  if (!admission.ok()) {
    out.status = admission.status();
    return out;
  }
  request.set_request_id(admission->request().id());
  ChoiceRun run(*model_, params, index, stream, id, created);
  out.status = run.Outcome(orchestrator_->Generate(request, admission->request(), &run, run));
  if (stream != nullptr && stream->cancelled()) return out;
  run.Finish();
  out.choice = run.choice();
  out.completion_tokens = run.completion_tokens();
  out.cached_tokens = run.cached_tokens();
  return out;
}

void HttpApi::Run(const CompletionParams& params, std::shared_ptr<http::Responder> r) {
  const std::string id = NewId(params.chat ? "chatcmpl" : "cmpl");
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  std::shared_ptr<http::ResponseStream> stream;
  if (params.stream) stream = r->StartStream(200, "text/event-stream");
  // Every choice (prompts x n, bounded by ParseCompletion) runs at once: this thread takes the
  // first, one thread each the others (their chunks interleave in a stream, told apart by index).
  std::vector<std::pair<const std::vector<uint32_t>*, int>> work;
  for (const std::vector<uint32_t>& prompt : params.prompts) {
    for (int k = 0; k < params.n; ++k) work.emplace_back(&prompt, k);
  }
  std::vector<ChoiceResult> results(work.size());
  std::vector<std::thread> others;
  for (size_t i = 1; i < work.size(); ++i) {
    others.emplace_back([&, i] {
      results[i] = RunChoice(params, *work[i].first, work[i].second, static_cast<int>(i),
                             stream.get(), id, created);
    });
  }
  results[0] = RunChoice(params, *work[0].first, work[0].second, 0, stream.get(), id, created);
  for (std::thread& t : others) t.join();
  if (stream != nullptr && stream->cancelled()) return;  // the client left; nothing to say
  std::vector<Choice> choices;
  UsageCounts usage;
  absl::Status failure;
  for (size_t i = 0; i < work.size(); ++i) {
    if (failure.ok()) failure = results[i].status;
    usage.prompt_tokens += work[i].first->size();
    usage.completion_tokens += results[i].completion_tokens;
    usage.cached_tokens += results[i].cached_tokens;
    choices.push_back(results[i].choice);
  }
  if (stream == nullptr) {
    r->Reply(failure.ok() ? JsonResponse(CompletionBody(params.chat, id, created, params.model,
                                                        choices, usage))
                          : StatusResponse(failure));
    return;
  }
  if (!failure.ok()) {
    stream->Write(Sse(Json::parse(StatusResponse(failure).body)));
  } else if (params.include_usage) {
    stream->Write(Sse(UsageChunkBody(params.chat, id, created, params.model, usage)));
  }
  stream->Write("data: [DONE]\n\n");
  stream->Close();
}

void HttpApi::Tokenize(const http::Request& req, std::shared_ptr<http::Responder> r) {
  const Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) {
    r->Reply(http::ErrorResponse(400, "the body must be a JSON object"));
    return;
  }
  absl::StatusOr<std::vector<uint32_t>> ids;
  if (body.contains("messages")) {
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
  const Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
    r->Reply(http::ErrorResponse(400, "'tokens' (a list of token ids) is required"));
    return;
  }
  std::vector<int32_t> ids;
  for (const Json& t : body["tokens"]) {
    if (!t.is_number_integer()) {
      r->Reply(http::ErrorResponse(400, "'tokens' must hold integers"));
      return;
    }
    ids.push_back(t.get<int32_t>());
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
